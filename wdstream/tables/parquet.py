"""Parquet files: row groups are the units, their row counts from the footer (read with
one ranged read of the file's last 64 KiB, a second one for a larger footer); a unit is
read as the byte ranges of its chosen columns' chunks, nothing else of the file."""

from __future__ import annotations

import io
import threading

from wdstream.errors import InputError, LimitError, ShardError
from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import (
    MAX_METADATA_BYTES,
    MAX_UNIT_BYTES,
    MAX_UNIT_ROWS,
    FileUnits,
    Rows,
    TableFormat,
    Unit,
    invalid,
    limits_of,
    units_from_counts,
)
from wdstream.tables.page_headers import BadHeader, chunk_pages, chunk_start, decoded_pages
from wdstream.tables.reads import Access, read_range

MAGIC = b"PAR1"
TAIL_BYTES = 64 * 1024  # the first read of a footer
CHUNK_SLACK = 100  # read past a column chunk's recorded end, as pyarrow does for old writers


class ParquetFormat(TableFormat):
    name = "parquet"

    def cut(self, file: RawFile, access: Access) -> FileUnits:
        footer = read_footer(file, access)
        metadata = parse_footer(file, footer)
        counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        for group, rows in enumerate(counts):
            if not 0 <= rows <= MAX_UNIT_ROWS:
                raise ShardError(f"{printable(file.url)}: row group {group} claims {rows} rows "
                                 f"(at most {MAX_UNIT_ROWS} are read)")
        if sum(counts) != metadata.num_rows:
            raise ShardError(f"{printable(file.url)}: its row groups hold {sum(counts)} rows; "
                             f"its footer says {metadata.num_rows}")
        return FileUnits(units_from_counts(counts), footer)

    def columns(self, cut: FileUnits) -> list[str] | None:
        return list(parse_footer(None, cut.metadata).schema.to_arrow_schema().names)

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns, access: Access) -> Rows:
        import pyarrow.parquet as pq

        parsed = FOOTERS.parsed(file, metadata)
        spans = chunk_spans(file, parsed, unit.part, columns, len(metadata))
        pieces = [(start, read_range(file, start, stop - start, access)) for start, stop in spans]
        pieces.append((file.size - len(metadata), metadata))
        check_pages(file, parsed, unit.part, columns, PiecesFile(pieces, file.size),
                    limits_of(access).unit_bytes)
        try:
            reader = pq.ParquetFile(PiecesFile(pieces, file.size), metadata=parsed,
                                    pre_buffer=False)
            table = reader.read_row_group(unit.part, columns=list(columns) if columns else None,
                                          use_threads=False)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError
            raise ShardError(f"{printable(file.url)}: row group {unit.part} cannot be read: "
                             f"{exc}") from None
        if table.num_rows != unit.rows:
            raise ShardError(f"{printable(file.url)}: row group {unit.part} holds "
                             f"{table.num_rows} rows; its footer says {unit.rows}")
        return Rows(table)


class ParsedFooters:
    """The footers this process parsed, the last ``size`` files': a file's units are read
    one after the other, and parsing a footer costs as much as the footer is long (a file of
    100,000 row groups has a footer of megabytes), so each is parsed once. An entry is used
    for the very metadata (the same bytes object, from the cut) it was parsed from."""

    def __init__(self, size: int = 8):
        self.size = size
        self._entries: dict[RawFile, tuple[bytes, object]] = {}
        self._lock = threading.Lock()

    def parsed(self, file: RawFile, metadata: bytes):
        with self._lock:
            entry = self._entries.get(file)
        if entry is not None and entry[0] is metadata:
            return entry[1]
        parsed = parse_footer(file, metadata)
        with self._lock:
            self._entries.pop(file, None)
            self._entries[file] = (metadata, parsed)
            while len(self._entries) > self.size:
                del self._entries[next(iter(self._entries))]
        return parsed


FOOTERS = ParsedFooters()


def read_footer(file: RawFile, access: Access) -> bytes:
    """The footer's bytes with the 8 after them (its length and ``PAR1``), bounded by
    ``MAX_METADATA_BYTES`` before anything that large is read."""
    name = printable(file.url)
    if file.size < 12:
        raise ShardError(f"{name}: {file.size} bytes, too short to be a Parquet file")
    tail = read_range(file, file.size - min(file.size, TAIL_BYTES), min(file.size, TAIL_BYTES),
                      access)
    if tail[-4:] != MAGIC:
        raise ShardError(f"{name}: not a Parquet file (it does not end with PAR1)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length > MAX_METADATA_BYTES:
        raise ShardError(f"{name}: its footer claims {length} bytes of metadata (at most "
                         f"{MAX_METADATA_BYTES} are read)")
    if length + 12 > file.size:
        raise ShardError(f"{name}: its footer claims {length} bytes of metadata in a file of "
                         f"{file.size} bytes")
    if length + 8 > len(tail):
        missing = length + 8 - len(tail)
        tail = read_range(file, file.size - length - 8, missing, access) + tail
    return tail[-(length + 8):]


def parse_footer(file: RawFile | None, footer: bytes):
    """The footer as pyarrow's ``FileMetaData``; a ShardError for one that does not parse."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(pa.BufferReader(MAGIC + footer)).metadata
    except (OSError, ValueError) as exc:
        where = printable(file.url) if file is not None else "a Parquet file"
        raise ShardError(f"{where}: its footer cannot be read: {exc}") from None


def chunk_spans(file: RawFile, metadata, group: int, columns, footer_bytes: int
                ) -> list[tuple[int, int]]:
    """The byte ranges of row group ``group``'s chunks of ``columns`` (all when None), each
    checked to lie in the file's data, adjacent ones joined."""
    row_group = metadata.row_group(group)
    data_end = file.size - footer_bytes
    spans, decoded = [], 0
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        if columns and chunk.path_in_schema.split(".", 1)[0] not in columns:
            continue
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        stop = start + chunk.total_compressed_size
        if not 4 <= start < stop <= data_end:
            raise ShardError(f"{printable(file.url)}: row group {group}, column "
                             f"{chunk.path_in_schema!r}: bytes {start}..{stop} lie outside "
                             f"the file's data (4..{data_end})")
        decoded += max(chunk.total_uncompressed_size, chunk.total_compressed_size)
        spans.append((start, min(stop + CHUNK_SLACK, data_end)))
    if decoded > MAX_UNIT_BYTES:
        raise ShardError(f"{printable(file.url)}: row group {group} holds {decoded} bytes of "
                         f"the columns read (at most {MAX_UNIT_BYTES} at once); choose fewer "
                         "columns or write smaller row groups")
    return _joined(sorted(spans))


def check_pages(file: RawFile, metadata, group: int, columns, source, most: int) -> None:
    """Row group ``group``'s chunks of ``columns`` checked from their pages' headers (read
    from ``source``, the chunks' bytes) before pyarrow decodes them: what they take decoded
    (``page_headers.decoded_pages``: a dictionary's entries repeated by their indices
    included) at most ``most``, and the rows the footer claims held by values of each."""
    row_group = metadata.row_group(group)
    rows, total = row_group.num_rows, 0
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        if columns and chunk.path_in_schema.split(".", 1)[0] not in columns:
            continue
        where = f"{printable(file.url)}: row group {group}, column {chunk.path_in_schema!r}"
        try:
            pages = chunk_pages(source, chunk_start(chunk), chunk.total_compressed_size)
        except (BadHeader, OSError) as exc:
            raise invalid(f"{where}: a page header that cannot be read ({exc})") from None
        values = sum(page.values for page in pages if page.data)
        if values < rows:
            raise invalid(f"{where}: its pages hold {values} values; the footer claims "
                          f"{rows} rows")
        pages = decoded_pages(source, pages, chunk, metadata.schema.column(index).length or 0,
                              most - total)
        total += sum(page.size for page in pages)
        if total > most:
            raise LimitError(f"{where}: the row group's columns read take more than {most:,} "
                             f"bytes decoded, from their pages' headers (the limit unit_bytes "
                             "of wdstream.Limits)")


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    joined: list[tuple[int, int]] = []
    for start, stop in spans:
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(stop, joined[-1][1]))
        else:
            joined.append((start, stop))
    return joined


def check_columns(file: RawFile, available: list[str], columns) -> None:
    """An InputError naming the file and its columns when one asked for is not there."""
    missing = [c for c in columns or () if c not in available]
    if missing:
        raise InputError(f"{printable(file.url)}: no column {', '.join(map(repr, missing))} "
                         f"(its columns: {', '.join(available)})")


class PiecesFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``pieces`` (``(offset, bytes)``) are
    known: what pyarrow reads a row group from. A read elsewhere is an OSError."""

    def __init__(self, pieces: list[tuple[int, bytes]], size: int):
        self.pieces, self.size, self.position = pieces, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def read(self, n: int = -1) -> bytes:
        stop = self.size if n is None or n < 0 else min(self.size, self.position + n)
        if stop <= self.position:
            return b""
        for offset, data in self.pieces:
            if offset <= self.position and stop <= offset + len(data):
                piece = data[self.position - offset: stop - offset]
                self.position = stop
                return piece
        raise OSError(f"bytes {self.position}..{stop} were not read (outside the fetched "
                      "column chunks)")

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
