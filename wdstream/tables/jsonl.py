"""JSON Lines files (plain, ``.gz``, ``.zst``): a row is a non-blank line holding a JSON
object. A plain file's units are byte ranges cut at line ends (about ``RANGE_BYTES`` each),
read with one ranged read each; a compressed file cannot be entered in the middle, so it is
one unit, and a span starting inside it decompresses (and skips) the lines before. Their row
counts come from an index (``wdstream index``) or from one scan of every file when the
dataset is built.

A file whose first non-blank byte (after a BOM) is ``[`` is a JSON array of objects, a row
each (``json_arrays``): cut and read the same way, its units' ranges holding whole
elements, and ``ARRAY`` its metadata, which tells ``read`` how to split a unit.

One source named ``….json`` is a wdstream manifest or a file of rows (as ``datasets``'
``json`` loader reads ``data_files: train.json``): ``json_rows_file`` tells them apart by the
file's first ``JSON_HEAD_BYTES``, a manifest being one object with ``"format": "wdstream"``.
One JSON object over several lines is refused naming the file: it cannot be cut into ranges
of rows without parsing it whole."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from typing import IO

from wdstream.errors import InputError, LimitError, ShardError
from wdstream.limits import json_loads
from wdstream.printable import printable
from wdstream.shards.compression import DecompressingBody
from wdstream.sources import urls
from wdstream.sources.stores import store_for
from wdstream.tables.files import RawFile
from wdstream.tables.formats import (
    MAX_UNIT_ROWS,
    FileUnits,
    TableFormat,
    Unit,
    invalid,
    limits_of,
)
from wdstream.tables.json_arrays import READ_BYTES, ArrayScanner, elements
from wdstream.tables.reads import Access, open_file, read_range

RANGE_BYTES = 32 * 1024**2  # a plain file's units: line-aligned ranges of about this size
MAX_LINE_BYTES = 256 * 1024**2  # the longest line read (or Limits.sample_bytes if less)
MAX_ROW_DEPTH = 100  # how deep a row's arrays and objects may nest
SHORT_LINE = 64  # bytes: a read of lines shorter on average is searched for non-blank ones
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
ARRAY = b"["  # the metadata of a JSON array's units (a JSON Lines file's: none)
JSON_HEAD_BYTES = 64 * 1024  # what json_rows_file reads of a .json file to tell what it is
# a wdstream manifest's marker: the first key Manifest.to_json writes, near the top in any
_MANIFEST_MARKER = re.compile(rb'"format"\s*:\s*"wdstream"')
_BOM = b"\xef\xbb\xbf"


def compression(name: str) -> str | None:
    """"gzip" or "zstd" for a compressed JSON Lines file's name, else None."""
    lower = name.lower()
    return next((kind for suffix, kind in COMPRESSIONS.items() if lower.endswith(suffix)), None)


class JsonLinesFormat(TableFormat):
    name = "jsonl"

    def cut(self, file: RawFile, access: Access) -> FileUnits:
        """One scan of the file: its rows, cut into ranges of whole lines (or elements)
        when plain; a JSON array's units get ``ARRAY`` for metadata."""
        body = _open(file, access)
        try:
            head = body.read(READ_BYTES)
            array = is_array(head)
            if array:
                spans = _element_spans(file, head, body, _longest(access))
            else:
                spans = ((offset, offset) for offset, _ in lines(
                    _Replayed(head, body), file, 0,
                    None if compression(file.name) is None else MAX_UNIT_ROWS, _longest(access)))
            units = _grouped(file, spans, array)
        finally:
            body.close()
        return FileUnits(units, ARRAY if array else b"")

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns, access: Access):
        """A plain file's range is read here, whole (so a failed read is retried before any
        row is handed out); a compressed file is decompressed as its rows are asked for."""
        data = None
        if compression(file.name) is None:
            most = limits_of(access).unit_bytes
            if unit.end - unit.part > most:
                raise LimitError(f"{printable(file.url)}: bytes {unit.part}..{unit.end} (rows "
                                 f"{unit.first_row}..{unit.first_row + unit.rows - 1}) are "
                                 f"more than {most:,} bytes read at once (the limit unit_bytes "
                                 "of wdstream.Limits)")
            data = read_range(file, unit.part, unit.end - unit.part, access)
        return JsonRows(file, unit, columns, access, data, metadata == ARRAY)


def is_array(head: bytes) -> bool:
    """Whether a file whose first bytes are ``head`` is a JSON array: its first non-blank
    byte (after a BOM) is ``[``."""
    return head.removeprefix(_BOM).lstrip(b" \t\r\n").startswith(b"[")


def _grouped(file: RawFile, spans: Iterator[tuple[int, int]], array: bool) -> list[Unit]:
    """Units of the rows at ``spans`` (each row's first byte and, in an array, its end): a
    plain file's ranges of about ``RANGE_BYTES`` (a JSON Lines range up to the next one's
    start, an array's up to its last element's end), a compressed file's one unit."""
    plain = compression(file.name) is None
    units: list[Unit] = []
    start, rows, first, end = 0, 0, 0, 0
    for offset, stop in spans:
        if array and plain and not (rows or units):
            start = offset  # an array's range starts at an element: its "[" is not in it
        if plain and rows and offset - start >= RANGE_BYTES:
            units.append(Unit(start, rows, first, end if array else offset))
            start, first, rows = offset, first + rows, 0
        rows += 1
        end = stop
        if rows > MAX_UNIT_ROWS:
            raise ShardError(f"{printable(file.url)}: more than {MAX_UNIT_ROWS} rows "
                             f"in one unit")
    if rows:
        units.append(Unit(start, rows, first, end if array and plain else file.size))
    return units


def _element_spans(file: RawFile, head: bytes, body, longest: int
                   ) -> Iterator[tuple[int, int]]:
    """Each element's first byte and end in a JSON array whose first read is ``head``."""
    scanner = ArrayScanner(file, 0, longest, MAX_ROW_DEPTH)
    chunk = head
    while chunk:
        yield from scanner.feed(chunk)
        chunk = body.read(READ_BYTES)
    scanner.finish()


class _Replayed:
    """``body`` with ``head``, read from it already, in front again."""

    def __init__(self, head: bytes, body):
        self.head, self.body = head, body

    def read(self, n: int) -> bytes:
        if self.head:
            head, self.head = self.head, b""
            return head
        return self.body.read(n)


class JsonRows:
    """A unit's rows, parsed as they are asked for, in increasing order (the reader's
    spans of one unit are), from ``data`` (a plain file's range) or else from the file,
    decompressed: nothing of a compressed file is held but the lines (or the elements of
    an ``array``) being parsed."""

    def __init__(self, file: RawFile, unit: Unit, columns, access: Access,
                 data: bytes | None = None, array: bool = False):
        self.file, self.unit, self.columns, self.access = file, unit, columns, access
        self.data, self.array = data, array
        self.nbytes = None if data is None else len(data)  # a compressed file: not held
        self._lines: Iterator[tuple[int, bytes]] | None = None
        self._body: IO[bytes] | None = None
        self._next = 0  # the unit's row the lines are at

    def __len__(self) -> int:
        return self.unit.rows

    def rows(self, start: int, stop: int) -> list[dict]:
        if self._lines is None or start < self._next:
            self.close()
            self._body = io.BytesIO(self.data) if self.data is not None \
                else _open(self.file, self.access)
            self._lines = self._split(self._body)
            self._next = 0
        out = []
        for offset, line in self._lines:
            self._next += 1
            if self._next > start:
                out.append(self._row(offset, line, self.unit.first_row + self._next - 1))
                if self._next == stop:
                    if stop == self.unit.rows and next(self._lines, None) is not None:
                        raise self._miscounted("more")
                    return out
        self.close()
        raise self._miscounted(f"{self._next}")

    def _split(self, body) -> Iterator[tuple[int, bytes]]:
        """``(offset, row's bytes)`` of the unit's rows in ``body``: a plain file's range,
        else the file from its start."""
        plain, longest = self.data is not None, _longest(self.access)
        offset = self.unit.part if plain else 0
        if self.array:
            return elements(body, ArrayScanner(self.file, offset, longest, MAX_ROW_DEPTH,
                                               whole=not plain))
        return lines(body, self.file, offset, None if plain else MAX_UNIT_ROWS, longest)

    def _miscounted(self, held: str) -> ShardError:
        """The unit holds ``held`` rows, not the count its cut (or the index) gives."""
        unit = self.unit
        where = f"bytes {unit.part}..{unit.end}" if self.data is not None else "the file"
        return invalid(f"{printable(self.file.url)}: {where} (rows {unit.first_row}.."
                       f"{unit.first_row + unit.rows - 1}) hold {held} rows, not the "
                       f"{unit.rows} the cut or the index counts (changed since, or a wrong "
                       "index)")

    def _row(self, offset: int, line: bytes, row: int) -> dict:
        where = f"byte {offset}" if compression(self.file.name) is None else "decompressed byte " \
            f"{offset}"
        try:
            deep = line.count(b"[") + line.count(b"{") > MAX_ROW_DEPTH
            value = json_loads(line, MAX_ROW_DEPTH) if deep else json.loads(line)
        except ValueError as exc:
            if row == 0 and not self.array and line.lstrip(_BOM + b" \t\r").startswith(b"{"):
                whole_document(self.file.url, line)  # refused by name
            raise ShardError(f"{printable(self.file.url)}: row {row} ({where}) is not JSON: "
                             f"{exc}") from None
        if not isinstance(value, dict):
            raise ShardError(f"{printable(self.file.url)}: row {row} ({where}) is not a JSON "
                             f"object but {type(value).__name__}")
        if self.columns is not None:
            value = {name: value.get(name) for name in self.columns}
        return value

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    __del__ = close


def _open(file: RawFile, access: Access):
    """The file's bytes, decompressed when it is compressed (at most ``Limits.shard_bytes``
    of them, with a decompressor of at most ``Limits.decoder_memory``)."""
    body = open_file(file, access)
    kind = compression(file.name)
    if kind is not None:
        return DecompressingBody(body, file.url, kind, stored_limit=file.size,
                                   limits=limits_of(access))
    return body


def _longest(access: Access) -> int:
    """The longest line read: ``MAX_LINE_BYTES``, or ``Limits.sample_bytes`` if less."""
    return min(MAX_LINE_BYTES, limits_of(access).sample_bytes)


def lines(body, file: RawFile, offset: int, most: int | None = None,
          longest: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` for each non-blank line of ``body`` (without its newline),
    ``offset`` counting from the given one. Blank lines are skipped without a Python step
    each, but count toward ``most`` lines (None: no bound) with the others; more, or a line
    longer than ``longest`` bytes, is a ShardError."""
    pending: list[bytes] = []
    held = counted = 0
    while chunk := body.read(READ_BYTES):
        if b"\n" not in chunk:
            pending.append(chunk)
            held += len(chunk)
            if held > longest:
                raise _too_long(file, offset, longest)
            continue
        here = chunk.count(b"\n")  # C: a third of a millisecond a MiB
        counted += here
        if most is not None and counted > most:
            raise invalid(f"{printable(file.url)}: more than {most} lines, blank ones "
                          "included (the most one unit holds)")
        data = b"".join(pending) + chunk if pending else chunk
        if here * SHORT_LINE > len(data):  # many short lines, perhaps blank: skipped in C
            end = data.rfind(b"\n") + 1
            yield from _nonblank(data, end, offset, file, longest)
            offset += end
            rest = data[end:]
        else:
            parts = data.split(b"\n")
            del data  # freed before the next read: its memory is reused, not mapped again
            rest = parts.pop()
            for line in parts:
                if len(line) > longest:
                    raise _too_long(file, offset, longest)
                if line and not line.isspace():
                    yield offset, line
                offset += len(line) + 1
        pending, held = [rest], len(rest)
    tail = b"".join(pending)
    if tail.strip():
        if len(tail) > longest:
            raise _too_long(file, offset, longest)
        yield offset, tail


_NONBLANK = re.compile(rb"[^ \t\n\r\f\v]")  # what bytes.strip() keeps


def _nonblank(data: bytes, end: int, offset: int, file: RawFile, longest: int
              ) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of ``data[:end]`` (whole lines) with their offsets from
    ``offset``: the regular expression skips blank ones in C."""
    pos = 0
    while (found := _NONBLANK.search(data, pos, end)) is not None:
        first = data.rfind(b"\n", 0, found.start()) + 1
        stop = data.find(b"\n", found.start(), end)
        if stop - first > longest:
            raise _too_long(file, offset + first, longest)
        yield offset + first, data[first:stop]
        pos = stop + 1


def _too_long(file: RawFile, offset: int, longest: int) -> ShardError:
    return invalid(f"{printable(file.url)}: a line at byte {offset} is longer than {longest} "
                   "bytes (the longest read: 256 MiB, or the limit sample_bytes of "
                   "wdstream.Limits)")


def json_rows_file(source) -> bool:
    """Whether ``source``, one URL or path ending in ``.json``, holds rows as JSON Lines
    (or a JSON array of objects) rather than a wdstream manifest, from its first
    ``JSON_HEAD_BYTES``: a manifest is an object with ``"format": "wdstream"`` (and
    ``shards``), rows are lines of objects or an array's elements. InputError naming the
    file for one object over several lines that is not a manifest; False
    where the file cannot be read (the manifest's read then reports it) and for ``pipe:``
    (no command runs to be looked at)."""
    if not isinstance(source, str | os.PathLike):
        return False
    url = os.fspath(source)
    if not url.lower().endswith(".json") or urls.scheme(url) == "pipe":
        return False
    try:
        head = store_for(url).read_at(url, 0, JSON_HEAD_BYTES)
    except Exception:  # noqa: BLE001 - read again as a manifest, whose read reports it
        return False
    text = head.removeprefix(_BOM).lstrip()
    if not text:
        return False  # empty: not a manifest either, as its parse says
    if is_array(text):
        return True
    whole_document(url, text)
    line, newline, _rest = text.partition(b"\n")
    if newline or len(head) < JSON_HEAD_BYTES:  # the first line whole: one row or a manifest
        try:
            first = json_loads(line, MAX_ROW_DEPTH)
        except ValueError:
            first = None
        if isinstance(first, dict):
            return not (first.get("format") == "wdstream" and "shards" in first)
    return _MANIFEST_MARKER.search(text) is None  # a first row longer than the head


def whole_document(url: str, text: bytes) -> None:
    """InputError when ``text``, the start of the file at ``url`` (blanks and a BOM
    stripped), begins an object over several lines that is not a manifest: neither JSON
    Lines nor a JSON array."""
    start = text.lstrip(_BOM + b" \t\r\n")
    first = start.partition(b"\n")[0].strip()
    if first != b"{" or _MANIFEST_MARKER.search(start) is not None:
        return
    raise InputError(f"{printable(url)}: one JSON document over several lines, neither JSON "
                     "Lines (one object a line), a JSON array of objects nor a wdstream "
                     "manifest (\"format\": \"wdstream\"): a file is streamed row by row, "
                     "never parsed whole; write its rows as JSON Lines or as an array")
