"""JSON Lines files (plain, ``.gz``, ``.zst``): a row is a non-blank line holding a JSON
object. A plain file's units are byte ranges cut at line ends (about ``RANGE_BYTES`` each),
read with one ranged read each; a compressed file cannot be entered in the middle, so it is
one unit, and a span starting inside it decompresses (and skips) the lines before. Their row
counts come from an index (``wdstream index``) or from one scan of every file when the
dataset is built."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

from wdstream.errors import ShardError
from wdstream.printable import printable
from wdstream.shards.compression import DecompressingStream
from wdstream.tables.files import RawFile
from wdstream.tables.formats import MAX_UNIT_ROWS, FilePlan, TableFormat, Unit
from wdstream.tables.reads import Access, open_file, read_range

RANGE_BYTES = 32 * 1024**2  # a plain file's units: line-aligned ranges of about this size
MAX_LINE_BYTES = 256 * 1024**2  # the longest line read
READ_BYTES = 1024**2
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}


def compression(name: str) -> str | None:
    """"gzip" or "zstd" for a compressed JSON Lines file's name, else None."""
    lower = name.lower()
    return next((kind for suffix, kind in COMPRESSIONS.items() if lower.endswith(suffix)), None)


class JsonLinesFormat(TableFormat):
    name = "jsonl"

    def plan(self, file: RawFile, access: Access) -> FilePlan:
        """One scan of the file: its rows, cut into line-aligned ranges when plain."""
        plain = compression(file.name) is None
        units: list[Unit] = []
        start, rows, first, end = 0, 0, 0, 0
        stream = _open(file, access)
        try:
            for offset, line in lines(stream, file, 0):
                end = offset + len(line) + 1
                if not line.strip():
                    continue
                if plain and rows and offset - start >= RANGE_BYTES:
                    units.append(Unit(start, rows, first, offset))
                    start, first, rows = offset, first + rows, 0
                rows += 1
                if rows > MAX_UNIT_ROWS:
                    raise ShardError(f"{printable(file.url)}: more than {MAX_UNIT_ROWS} rows "
                                     f"in one unit")
        finally:
            stream.close()
        if rows:
            units.append(Unit(start, rows, first, min(end, file.size) if plain else file.size))
        return FilePlan(units)

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns, access: Access):
        """A plain file's range is read here, whole (so a failed read is retried before any
        row is handed out); a compressed file is decompressed as its rows are asked for."""
        data = None
        if compression(file.name) is None:
            data = read_range(file, unit.part, unit.end - unit.part, access)
        return LineRows(file, unit, columns, access, data)


class LineRows:
    """A unit's rows, parsed as they are asked for, in increasing order (the reader's
    spans of one unit are), from ``data`` (a plain file's range) or else from the file,
    decompressed: nothing of a compressed file is held but the lines being parsed."""

    def __init__(self, file: RawFile, unit: Unit, columns, access: Access,
                 data: bytes | None = None):
        self.file, self.unit, self.columns, self.access = file, unit, columns, access
        self.data = data
        self.nbytes = None if data is None else len(data)  # a compressed file: not held
        self._lines: Iterator[tuple[int, bytes]] | None = None
        self._stream = None
        self._next = 0  # the unit's row the lines are at

    def __len__(self) -> int:
        return self.unit.rows

    def rows(self, start: int, stop: int) -> list[dict]:
        if self._lines is None or start < self._next:
            self.close()
            plain = self.data is not None
            self._stream = io.BytesIO(self.data) if plain else _open(self.file, self.access)
            self._lines = (item for item in lines(self._stream, self.file,
                                                  self.unit.part if plain else 0)
                           if item[1].strip())
            self._next = 0
        out = []
        for offset, line in self._lines:
            self._next += 1
            if self._next > start:
                out.append(self._row(offset, line, self.unit.first_row + self._next - 1))
                if self._next == stop:
                    return out
        self.close()
        raise ShardError(f"{printable(self.file.url)}: ended after row "
                         f"{self.unit.first_row + self._next - 1}; the plan counted "
                         f"{self.unit.first_row + self.unit.rows} rows (changed since)")

    def _row(self, offset: int, line: bytes, row: int) -> dict:
        where = f"byte {offset}" if compression(self.file.name) is None else "decompressed byte " \
            f"{offset}"
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise ShardError(f"{printable(self.file.url)}: row {row} ({where}) is not JSON: "
                             f"{exc}") from None
        if not isinstance(value, dict):
            raise ShardError(f"{printable(self.file.url)}: row {row} ({where}) is not a JSON "
                             f"object but {type(value).__name__}")
        if self.columns is not None:
            value = {name: value.get(name) for name in self.columns}
        return value

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    __del__ = close


def _open(file: RawFile, access: Access):
    """The file's bytes, decompressed when it is compressed."""
    stream = open_file(file, access)
    kind = compression(file.name)
    if kind is not None:
        return DecompressingStream(stream, file.url, kind, stored_limit=file.size)
    return stream


def lines(stream, file: RawFile, offset: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` for each line of ``stream`` (without its newline), ``offset``
    counting from the given one; a line longer than ``MAX_LINE_BYTES`` is a ShardError."""
    pending: list[bytes] = []
    held = 0
    while chunk := stream.read(READ_BYTES):
        if b"\n" not in chunk:
            pending.append(chunk)
            held += len(chunk)
            if held > MAX_LINE_BYTES:
                raise ShardError(f"{printable(file.url)}: a line at byte {offset} is longer "
                                 f"than {MAX_LINE_BYTES} bytes")
            continue
        parts = (b"".join(pending) + chunk if pending else chunk).split(b"\n")
        pending, held = [parts[-1]], len(parts[-1])
        for line in parts[:-1]:
            yield offset, line
            offset += len(line) + 1
    tail = b"".join(pending)
    if tail:
        yield offset, tail
