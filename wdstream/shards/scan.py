"""A scanner for the shard lines ``Manifest.to_json`` writes, straight from the text into
arrays, without a Python object per shard.

Each line of the shards list is one of eight fixed layouts (``sha256`` a string or null,
``head`` and ``last_key`` present or not)::

    {"url": "NAME", "samples": INT, "bytes": INT, "sha256": "HEX64", "head": "HEX32", "last_key": "KEY"}

With no backslash in the text, every ``"`` opens or closes a string, so the quotes of a line
place its strings; a line is accepted only when every byte between them is the layout's
literal text, its integers are plain JSON integers (no sign, no leading zero, at most 18
digits), its digests lowercase hex of the right length and its key valid UTF-8 without control
characters. Every line accepted is therefore valid JSON with the meaning the general parser
gives it, and a key given twice cannot be accepted. Anything else (another layout, an escape,
an extra key) makes ``scan_shards`` return None, and the caller takes the general parser, which
reports what is wrong. Work is done on runs of ``LINES`` lines, so temporaries stay a few MB.

Lines are first read by length (``wdstream.shards.scan_lengths``: the lines of one length and
layout as one two-dimensional array, which accepts exactly the same lines); the quote scanner
below reads the manifests whose lines vary too much for that.

The goal these scanners serve: a ``StreamingDataset`` built on a 1,000,000-shard manifest in
under 2 s (docs/benchmarks.md, "Large manifests"). ``json.loads`` feeding the same arrays
takes several times that (docs/decisions.md).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from wdstream.shards.scan_layouts import (
    INT,
    KEY,
    MAX_DIGITS,
    NAME,
    POW10,
    Columns,
    LineLayout,
    layouts_by_quotes,
)
from wdstream.shards.scan_lengths import VARIED, scan_by_length

LINES = 1 << 16  # lines scanned at a time

_QUOTE, _NEWLINE = ord('"'), ord("\n")
_NIBBLE = np.full(256, -1, dtype=np.int16)
_NIBBLE[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_NIBBLE[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_LAYOUTS = layouts_by_quotes()


class _Columns(Columns):
    """The arrays being filled, and where each shard's name and last key are in the text."""

    def __init__(self, count: int):
        super().__init__(count)
        self.name_at = np.zeros(count, dtype=np.int64)
        self.key_at = np.zeros(count, dtype=np.int64)


def scan_shards(text: bytes, start: int, stop: int, min_lines: int = 1
                ) -> dict[str, np.ndarray] | None:
    """The columns of the shard lines in ``text[start:stop]`` (between ``"shards": [\\n ``
    and ``\\n]``), or None when a line is not in one of the layouts (see the module docstring)
    or there are fewer than ``min_lines``. Lines are read by length (``scan_lengths``) unless
    they vary too much for that; then by their quotes, as described above.

    Columns: ``names`` and ``keys`` (uint8, the names and last keys joined by newlines, a
    missing key as an empty one), ``samples``, ``bytes``, ``sha256`` (N x 32 raw digests),
    ``heads`` (N x 16), and the masks ``has_sha256``, ``has_head``, ``has_key``."""
    if text.find(b"\\", start, stop) >= 0:
        return None
    codes = np.frombuffer(text, dtype=np.uint8, count=stop - start, offset=start)
    step = 1 << 22  # in pieces: one comparison of the whole text is a temporary as large
    newlines = np.concatenate([np.flatnonzero(codes[at:at + step] == _NEWLINE) + at
                               for at in range(0, len(codes), step)] or [np.zeros(0, np.int64)])
    count = len(newlines) + 1
    if count < min_lines:
        return None
    if len(newlines) and (newlines[0] < 1 or newlines[-1] + 2 > len(codes)):
        return None
    # lines are joined by ",\n "
    if len(newlines) and not ((codes[newlines - 1] == ord(",")).all()
                              and (codes[newlines + 1] == ord(" ")).all()):
        return None
    starts = np.concatenate(([0], newlines + 2))
    ends = np.concatenate((newlines - 1, [len(codes)]))
    found = scan_by_length(codes, starts, ends)
    if found is not VARIED:
        return found
    columns = _Columns(count)
    names, keys = [], []
    for first in range(0, count, LINES):
        last = min(count, first + LINES)
        if not _scan_block(codes, starts[first:last], ends[first:last], columns, first):
            return None
        rows = slice(first, last)
        names.append(_joined(codes, columns.name_at[rows], columns.name_len[rows]))
        keys.append(_joined(codes, columns.key_at[rows], columns.key_len[rows]))
    if not (columns.name_len > 0).all():
        return None  # an empty name: the general parser names the entry
    keys_blob = np.concatenate(keys)[:-1]
    if ((keys_blob < 0x20) & (keys_blob != _NEWLINE)).any():
        return None
    try:
        keys_blob.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return columns.result(np.concatenate(names)[:-1], keys_blob)


def _joined(text: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The pieces ``text[at:at+length]``, each followed by a newline, as one array."""
    offsets = np.cumsum(lengths + 1)
    total = int(offsets[-1]) if len(offsets) else 0
    index = np.repeat(at - (offsets - lengths - 1), lengths + 1) + np.arange(total)
    joined = text[np.minimum(index, len(text) - 1)]
    joined[offsets - 1] = _NEWLINE
    return joined


def _scan_block(text, starts, ends, columns: _Columns, first: int) -> bool:
    """Read a run of lines by their quotes; whether every line is in a layout."""
    low, high = int(starts[0]), int(ends[-1])
    quotes = np.flatnonzero(text[low:high] == _QUOTE) + low
    at = np.searchsorted(quotes, starts)
    counts = np.diff(np.append(at, len(quotes)))
    matched = np.zeros(len(starts), dtype=bool)
    for quote_count in np.unique(counts).tolist():
        rows = np.flatnonzero(counts == quote_count)
        for layout in _LAYOUTS.get(quote_count, ()):
            rows = rows[~matched[rows]]
            if not len(rows):
                break
            ok = _match(layout, text, quotes, at[rows], starts[rows], ends[rows], columns,
                        first + rows)
            matched[rows[ok]] = True
    return bool(matched.all())


def _match(layout: LineLayout, text, quotes, at, starts, ends, columns: _Columns, rows):
    """Which of these lines are in ``layout`` (their values stored in ``columns``)."""
    ok = np.ones(len(rows), dtype=bool)
    position = starts
    ints: list = []
    digests: dict[int, np.ndarray] = {}
    for i, piece in enumerate(layout.pieces):
        if isinstance(piece, bytes):
            ok &= _literal(text, position, piece)
            position = position + len(piece)
            continue
        quote, back = layout.value_ends[i]
        end = quotes[at + quote] - back
        if piece is INT:
            value, good = _integers(text, position, end)
            ints.append(value)
        elif piece is NAME:
            name, good = (position, end - position), end > position
        elif piece is KEY:
            key, good = (position, end - position), end >= position
        else:
            digits = cast(int, piece)  # not INT, NAME nor KEY: a digest's number of digits
            digests[digits], good = _hex(text, position, end, digits)
        ok &= good
        position = end
    ok &= position == ends
    good = rows[ok]
    columns.samples[good], columns.bytes[good] = ints[0][ok], ints[1][ok]
    columns.name_at[good], columns.name_len[good] = name[0][ok], name[1][ok]
    if layout.sha:
        columns.sha256[good], columns.has_sha256[good] = digests[64][ok], True
    if layout.head:
        columns.heads[good], columns.has_head[good] = digests[32][ok], True
    if layout.key:
        columns.key_at[good], columns.key_len[good] = key[0][ok], key[1][ok]
        columns.has_key[good] = True
    return ok


def _gather(text, begin, width: int):
    """``text[b:b + width]`` for each b of ``begin`` (clipped to the text), one row each."""
    if len(text) < width:
        text = np.concatenate((text, np.zeros(width, dtype=np.uint8)))
    rows = np.lib.stride_tricks.sliding_window_view(text, width)
    return rows[np.clip(begin, 0, len(rows) - 1)]


def _literal(text, begin, literal: bytes):
    expected = np.frombuffer(literal, dtype=np.uint8)
    return (_gather(text, begin, len(literal)) == expected).all(1)


def _integers(text, begin, end):
    """The integers ``text[begin:end]`` and which are plain JSON integers of at most
    ``MAX_DIGITS`` digits."""
    digits = end - begin
    good = (digits >= 1) & (digits <= MAX_DIGITS)
    width = int(np.clip(digits, 1, MAX_DIGITS).max()) if len(digits) else 1
    values = _gather(text, begin, width).astype(np.int64) - ord("0")
    places = np.arange(width)
    inside = places < digits[:, None]
    good &= (((values >= 0) & (values <= 9)) | ~inside).all(1)
    good &= (values[:, 0] != 0) | (digits == 1)  # JSON has no leading zeros
    powers = POW10[np.clip(digits[:, None] - 1 - places, 0, MAX_DIGITS - 1)]
    return np.where(inside & good[:, None], values * powers, 0).sum(1), good


def _hex(text, begin, end, width: int):
    """Raw bytes of ``width`` lowercase hex digits, and which strings are that."""
    nibbles = _NIBBLE[_gather(text, begin, width)]
    good = (end - begin == width) & (nibbles >= 0).all(1)
    raw = (nibbles[:, 0::2] << 4 | nibbles[:, 1::2]).astype(np.uint8)
    return raw, good

