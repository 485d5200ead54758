"""The pages of a Parquet column chunk as their headers declare them, read before pyarrow
decodes the chunk: each page's uncompressed size is what decoding it allocates, whatever the
footer says of the chunk, so ``tables.read_parquet`` refuses a page or a row too large from
these sizes, never from the decoded values.

A page header is a Thrift struct in the compact protocol (parquet-format's ``PageHeader``):
field 2 is the uncompressed size, 3 the compressed size, and the data page headers (5 and 8)
start with the number of values; v2's (8) also holds the number of rows (field 3).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import NamedTuple

from wdstream.errors import InputError
from wdstream.write.record_batches import limit_text

BATCH_BYTES = 64 << 20  # about the most a batch of rows decodes to, when pages allow it
PAGE_FLOOR = 64 << 20  # a page may hold this much even when the record limit is lower
_HEADER_READ = 1 << 16  # bytes read for a page header, more only if it is longer
_HEADER_MAX = 16 << 20  # the longest page header read (its statistics included)
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = \
    range(13)
_DATA_PAGES = (5, 8)  # the fields of DataPageHeader and DataPageHeaderV2
_DATA_KINDS = (0, 3)  # PageType DATA_PAGE, DATA_PAGE_V2


class Page(NamedTuple):
    """One page: whether it holds data (not a dictionary or an index), its uncompressed
    size, the values (levels) it holds, and its rows (v2 pages; None for others)."""

    data: bool
    size: int
    values: int
    rows: int | None


class BadHeader(ValueError):
    """A page header that cannot be read (cut short, malformed, or longer than allowed)."""


class _Reader:
    """The compact protocol over ``data`` from ``pos``."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise BadHeader("cut short")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise BadHeader("a varint longer than 10 bytes")

    def integer(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)  # zigzag

    def skip_bytes(self, count: int) -> None:
        if count < 0 or self.pos + count > len(self.data):
            raise BadHeader("cut short")
        self.pos += count

    def fields(self):
        """``(field id, type)`` of each field of the struct being read, until its end."""
        last = 0
        while (head := self.byte()) & 0x0F != _STOP:
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.integer()
            yield last, kind

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 32:
            raise BadHeader("nested too deeply")
        if kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _BYTE:
            self.skip_bytes(1)
        elif kind == _DOUBLE:
            self.skip_bytes(8)
        elif kind == _BINARY:
            self.skip_bytes(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            count = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(count):
                self.skip(head & 0x0F if head & 0x0F not in (_TRUE, _FALSE) else _BYTE,
                          depth + 1)
        elif kind == _MAP:
            count = self.varint()
            types = self.byte() if count else 0
            for _ in range(count):
                self.skip(types >> 4, depth + 1)
                self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            for _, inner in self.fields():
                self.skip(inner, depth + 1)
        elif kind not in (_TRUE, _FALSE):
            raise BadHeader(f"unknown type {kind}")


def parse_header(data: bytes) -> tuple[Page, int, int]:
    """``(page, compressed size, header length)`` of the header at the start of ``data``."""
    reader = _Reader(data)
    kind = size = compressed = values = 0
    rows = None
    for field, field_kind in reader.fields():
        if field == 1 and field_kind == _I32:
            kind = reader.integer()
        elif field == 2 and field_kind == _I32:
            size = reader.integer()
        elif field == 3 and field_kind == _I32:
            compressed = reader.integer()
        elif field in _DATA_PAGES and field_kind == _STRUCT:
            values, rows = _data_header(reader, v2=field == 8)
        else:
            reader.skip(field_kind)
    if size < 0 or compressed < 0 or values < 0 or (rows is not None and rows < 0):
        raise BadHeader("a negative size or count")
    return Page(kind in _DATA_KINDS, size, values, rows), compressed, reader.pos


def _data_header(reader: _Reader, v2: bool) -> tuple[int, int | None]:
    """``(values, rows)`` of a data page's header (rows: v2's, None for v1)."""
    values, rows = 0, None
    for field, kind in reader.fields():
        if field == 1 and kind == _I32:
            values = reader.integer()
        elif v2 and field == 3 and kind == _I32:
            rows = reader.integer()
        else:
            reader.skip(kind, 1)
    return values, rows


def chunk_pages(file, start: int, length: int) -> list[Page]:
    """The pages of the column chunk stored in ``file`` (seekable, binary) at
    ``[start, start + length)``; BadHeader if a header cannot be read there."""
    pages = []
    position, end = start, start + length
    while position < end:
        want = _HEADER_READ
        while True:
            file.seek(position)
            data = file.read(min(want, end - position))
            try:
                page, compressed, header = parse_header(data)
                break
            except BadHeader:
                if len(data) < min(want, end - position) or want >= _HEADER_MAX \
                        or want >= end - position:
                    raise
                want *= 4
        pages.append(page)
        position += header + compressed
    return pages


class _Column(NamedTuple):
    """What a batch of a column chunk may decode to: its dictionary's bytes, its largest
    data page, and the fewest rows a data page holds (1 when not known: nested columns)."""

    dictionary: int
    largest: int
    fewest: int


def batch_rows(file, parquet, group: int, first_row: int, path: str, max_record: int,
               most: int) -> int:
    """How many rows of row group ``group`` (its first row: ``first_row`` of the file, from
    0) to decode at a time: at most ``most``, fewer when its pages are large, so that a batch
    decodes to at most about ``BATCH_BYTES`` (one row at a time if even that is more).

    InputError, before anything is decoded, for a page larger than ``max_record`` (or
    ``PAGE_FLOOR`` if larger: pages hold many records), for a row whose own pages (a page
    with that row alone) hold more than ``max_record``, and for a row group whose rows hold
    more than ``max_record`` on average (a row group of one row: that row)."""
    chunks = parquet.metadata.row_group(group)
    rows, total = chunks.num_rows, 0
    alone: dict[int, int] = {}  # a row of the group -> bytes of the pages it has to itself
    columns = []
    for i in range(chunks.num_columns):
        column = chunks.column(i)
        try:
            pages = chunk_pages(file, _chunk_start(column), column.total_compressed_size)
        except BadHeader as error:
            raise InputError(f"{path}: row group {group}, column {column.path_in_schema}: a "
                             f"page header that cannot be read ({error})") from None
        flat = parquet.schema.column(i).max_repetition_level == 0

        def where(row: int, count: int | None, name=column.path_in_schema) -> str:
            row, count = (row, count) if count is not None else (0, rows)  # the whole group
            rows_at = f"row {first_row + row + 1}" if count == 1 else \
                f"rows {first_row + row + 1}-{first_row + row + count}"
            return f"{path} {rows_at} (column {name})"

        columns.append(_column_pages(pages, flat, rows, alone, max(max_record, PAGE_FLOOR),
                                     where))
        total += sum(page.size for page in pages)
    limit = limit_text(max_record)
    if rows == 1 and total > max_record:
        raise InputError(f"{path} row {first_row + 1}: {total:,} bytes, more than {limit}, "
                         "the largest record pack accepts")
    if rows and total / rows > max_record:
        raise InputError(f"{path} rows {first_row + 1}-{first_row + rows}: {total:,} bytes in "
                         f"{rows:,} rows, more than {limit} a row, the largest record pack "
                         "accepts")
    big = [row for row, size in alone.items() if size > max_record]
    if big:
        row = min(big)
        raise InputError(f"{path} row {first_row + row + 1}: {alone[row]:,} bytes, more than "
                         f"{limit}, the largest record pack accepts")
    count = most
    while count > 1 and sum(c.dictionary + (-(-count // c.fewest) + 1) * c.largest
                            for c in columns) > BATCH_BYTES:
        count //= 2
    return count


def _chunk_start(column) -> int:
    """Where a column chunk's first page starts (its dictionary's, if it has one)."""
    offsets = [column.data_page_offset]
    if column.has_dictionary_page and column.dictionary_page_offset:
        offsets.append(column.dictionary_page_offset)
    return min(offsets)


def _column_pages(pages: list[Page], flat: bool, rows: int, alone: dict[int, int],
                  page_limit: int, where: Callable[[int, int | None], str]) -> _Column:
    """A column chunk's pages checked against ``page_limit``, and the bytes of each page
    that holds one row alone added to that row's in ``alone``."""
    row = dictionary = largest = 0
    fewest = max(rows, 1)
    for page in pages:
        count = page.rows if page.rows is not None else page.values if flat else None
        if page.size > page_limit:
            raise InputError(f"{where(row, count if page.data else None)}: a page of "
                             f"{page.size:,} bytes, more than {limit_text(page_limit)}, the "
                             "largest page pack decodes")
        if not page.data:
            dictionary += page.size
            continue
        largest = max(largest, page.size)
        if count is None:
            fewest = 1
            continue
        fewest = max(1, min(fewest, count))
        if count == 1:
            alone[row] = alone.get(row, 0) + page.size
        row += count
    return _Column(dictionary, largest, fewest)


class HeldChunks(io.RawIOBase):
    """A seekable read of a remote Parquet object that keeps the column chunks of one row
    group (``hold``) once read, so that reading their page headers and then decoding them
    fetches their bytes once; other reads (the footer) go to ``file``."""

    def __init__(self, file):
        self._file, self._position = file, 0
        self._held: list[tuple[int, bytes]] = []  # (start, bytes) of each chunk held

    def hold(self, group) -> None:
        """Read and keep the column chunks of ``group`` (a RowGroupMetaData)."""
        self._held = []
        for i in range(group.num_columns):
            column = group.column(i)
            start = _chunk_start(column)
            self._file.seek(start)
            self._held.append((start, self._file.read(column.total_compressed_size)))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._position = offset
        elif whence == io.SEEK_CUR:
            self._position += offset
        else:
            self._position = self._file.seek(offset, whence)
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        for start, data in self._held:
            if start <= self._position and self._position + len(view) <= start + len(data):
                at = self._position - start
                view[:] = data[at:at + len(view)]
                self._position += len(view)
                return len(view)
        self._file.seek(self._position)
        data = self._file.read(len(view))
        view[:len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            finally:
                self._held = []
                super().close()
