"""The quick way through the shard lines of a large manifest: lines grouped by length.

Lines of one length written by ``Manifest.to_json`` mostly have one layout (see
``wdstream.shards.scan``) with the same width for every value, so they agree byte for byte
outside their values. Such a group is read as a two-dimensional array, one row per line:
the layout and value columns come from its first line (read in Python, as the layouts say),
every row's literal bytes are compared with that line's at once, and each value is a column
range checked and converted for all rows together (digits, lowercase hex, string bytes).
A row whose literal bytes differ starts another round of the same length with its own
layout; a row whose literal bytes agree but whose values are not what the layout allows is
not a layout's line, and the whole manifest goes to the general parser.

``scan_by_length`` returns the scanner's columns, None (a line in no layout), or ``VARIED``
when the lines differ too much to gain anything (rounds or rows examined beyond a bound): the
caller then takes the quote scanner of ``scan.py``.
"""

from __future__ import annotations

import binascii
from typing import cast

import numpy as np

from wdstream.shards.scan_layouts import (
    INT,
    KEY,
    MAX_DIGITS,
    NAME,
    POW10,
    Columns,
    layouts_by_quotes,
)

VARIED = object()
MAX_ROUNDS = 2000  # layouts tried in all before the lines count as too varied
STEP_BYTES = 8 << 20  # rows checked at a time: temporaries stay a few MB
_QUOTE = ord('"')  # strings hold no quote, no control character (backslashes: refused before)


class _Template:
    """A layout with value widths: the literal bytes of a line and where its values are."""

    def __init__(self, layout, line: bytes, fields: list[tuple[object, int, int]]):
        self.layout, self.fields = layout, fields
        self.literal = np.frombuffer(line, dtype=np.uint8).copy()
        self.values = np.zeros(len(line), dtype=bool)  # True where a value is
        for _, begin, end in fields:
            self.literal[begin:end] = 0
            self.values[begin:end] = True


def _template(line: bytes, layouts) -> _Template | None:
    """The layout ``line`` is in, with its value columns; None if it is in none."""
    for layout in layouts:
        position, fields = 0, []
        for i, piece in enumerate(layout.pieces):
            if isinstance(piece, bytes):
                if not line.startswith(piece, position):
                    break
                position += len(piece)
                continue
            after = cast(bytes, layout.pieces[i + 1])  # literal text follows every value
            end = line.find(b'"', position) - after.index(b'"')
            width = end - position
            if piece is INT:
                good = 1 <= width <= MAX_DIGITS
            elif piece is NAME:
                good = width >= 1
            elif piece is KEY:
                good = width >= 0
            else:
                good = width == piece
            if not good:
                break
            fields.append((piece, position, end))
            position = end
        else:
            if position == len(line):
                return _Template(layout, line, fields)
    return None


class _Columns(Columns):
    """The arrays being filled, and the names and keys of the rows read, step by step."""

    def __init__(self, count: int):
        super().__init__(count)
        self.names: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, N x width bytes)
        self.keys: list[tuple[np.ndarray, np.ndarray]] = []


def scan_by_length(text: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """The columns (as ``scan.scan_shards``) of the lines ``text[starts[i]:ends[i]]``, None
    when a line is in no layout, or ``VARIED`` (see the module docstring)."""
    layouts = [layout for group in layouts_by_quotes().values() for layout in group]
    count = len(starts)
    lengths = ends - starts
    if (lengths == lengths[0]).all():
        groups = [np.arange(count)]
    else:
        order = np.argsort(lengths, kind="stable")
        cuts = np.flatnonzero(np.diff(lengths[order])) + 1
        groups = np.split(order, cuts)
    columns = _Columns(count)
    rounds, budget = 0, 4 * count + 100_000  # rows examined at most
    for rows in groups:
        width = int(lengths[rows[0]])
        if width < 1:
            return None
        windows = np.lib.stride_tricks.sliding_window_view(text, width)
        while len(rows):
            rounds += 1
            budget -= len(rows)
            if rounds > MAX_ROUNDS or budget < 0:
                return VARIED
            first = int(starts[rows[0]])
            template = _template(text[first:first + width].tobytes(), layouts)
            if template is None:
                return None
            rest = _read_rows(template, windows, starts, rows, columns)
            if rest is None:
                return None
            rows = rest
    return _finish(columns)


def _read_rows(template: _Template, windows, starts, rows, columns: _Columns):
    """Read the rows in ``template``'s layout; the rows left (None: a row agrees with the
    layout's literal bytes but not with its values)."""
    width = windows.shape[1]
    step = max(1, STEP_BYTES // width)
    left = []
    for at in range(0, len(rows), step):
        chunk = rows[at:at + step]
        first, n = int(starts[chunk[0]]), len(chunk)
        if chunk[-1] - chunk[0] == n - 1 and starts[chunk[-1]] - first == (n - 1) * (width + 3):
            # consecutive lines (joined by ",\n "): a view of the text, nothing copied
            table = np.lib.stride_tricks.as_strided(windows[first], shape=(n, width),
                                                    strides=(width + 3, 1), writeable=False)
        else:
            table = windows[starts[chunk]]
        same = np.equal(table, template.literal)
        same |= template.values
        same = same.all(1)
        if not same.all():
            left.append(chunk[~same])
            chunk, table = chunk[same], table[same]
        if len(chunk) and not _read_values(template, table, chunk, columns):
            return None
    return np.concatenate(left) if left else rows[:0]


def _read_values(template: _Template, table, rows, columns: _Columns) -> bool:
    layout = template.layout
    at = _consecutive(rows)
    ints = []
    for piece, begin, end in template.fields:
        values = table[:, begin:end]
        if piece is INT:
            digits = values - np.uint8(ord("0"))
            if (digits > 9).any() or (end - begin > 1 and (digits[:, 0] == 0).any()):
                return False  # not a plain JSON integer (JSON has no leading zeros)
            ints.append(digits.astype(np.int64) @ POW10[end - begin - 1::-1])
        elif piece is NAME or piece is KEY:
            values = np.ascontiguousarray(values)
            if end > begin and (values.min() < 0x20 or (values == _QUOTE).any()):
                return False  # a JSON string holds no control character, no bare quote
            if end > begin:
                (columns.names if piece is NAME else columns.keys).append((rows, values))
            (columns.name_len if piece is NAME else columns.key_len)[at] = end - begin
        else:
            text = np.ascontiguousarray(values).tobytes()
            try:
                raw = binascii.unhexlify(text)
            except binascii.Error:
                return False
            if binascii.hexlify(raw) != text:  # uppercase digits are not the layout's
                return False
            target = columns.sha256 if piece == 64 else columns.heads
            digits = cast(int, piece)  # not INT, NAME nor KEY: a digest's number of digits
            target[at] = np.frombuffer(raw, dtype=np.uint8).reshape(len(rows), digits // 2)
    columns.samples[at], columns.bytes[at] = ints
    columns.has_sha256[at] = layout.sha
    columns.has_head[at] = layout.head
    columns.has_key[at] = layout.key
    return True


def _consecutive(rows: np.ndarray):
    """``rows`` as a slice when they follow each other (assignments are then copies)."""
    if rows[-1] - rows[0] == len(rows) - 1:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _joined(count: int, lengths: np.ndarray, pieces) -> np.ndarray:
    """Each row's bytes followed by a newline, in row order, as one array (without the last
    newline)."""
    begins = np.cumsum(lengths + 1) - lengths - 1
    blob = np.full(int(lengths.sum()) + count, ord("\n"), dtype=np.uint8)
    for rows, values in pieces:
        n, width = values.shape
        first = int(begins[rows[0]])
        if rows[-1] - rows[0] == n - 1:  # consecutive rows: one slab of the blob
            blob[first:first + n * (width + 1)].reshape(n, width + 1)[:, :width] = values
        else:
            blob[begins[rows][:, None] + np.arange(width)] = values
    return blob[:-1]


def _finish(columns: _Columns) -> dict[str, np.ndarray] | None:
    count = len(columns.samples)
    keys = _joined(count, columns.key_len, columns.keys)
    try:
        keys.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return columns.result(_joined(count, columns.name_len, columns.names), keys)
