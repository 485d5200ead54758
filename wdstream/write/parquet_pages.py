"""How many rows of a Parquet row group ``wdstream pack`` decodes at a time, from its column
chunks' page headers (``tables/page_headers.py``) read before pyarrow decodes them: a page,
a row or a row group too large is refused before it is decoded; and ``HeldChunks``, a
remote object's row group held once read, so that its headers and its decoding fetch it
once.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import NamedTuple

from wdstream.errors import InputError
from wdstream.tables.page_headers import (
    DICTIONARY_ENCODINGS,
    BadHeader,
    Page,
    chunk_pages,
    chunk_start,
    decoded_pages,
)
from wdstream.write.record_batches import limit_text

BATCH_BYTES = 64 << 20  # about the most a batch of rows decodes to, when pages allow it
PAGE_FLOOR = 64 << 20  # a page may hold this much even when the record limit is lower
GROUP_BYTES = 64 << 30  # the most a row group's pages may decode to, a batch at a time


class _Column(NamedTuple):
    """What a batch of a column chunk may decode to: its dictionary's bytes, its largest
    data page, and the fewest rows a data page holds (1 when not known: nested columns)."""

    dictionary: int
    largest: int
    fewest: int
    entry: int = 0  # what a value indexing a dictionary takes decoded


def _entry(pages: list[Page], sized: list[Page]) -> int:
    """What one value of the pages that index a dictionary takes decoded (``sized``: the
    pages as ``decoded_pages`` sizes them); 0 without such pages."""
    return max((size.size // page.values for page, size in zip(pages, sized, strict=True)
                if page.data and page.values and page.encoding in DICTIONARY_ENCODINGS),
               default=0)


def batch_rows(file, parquet, group: int, first_row: int, path: str, max_record: int,
               most: int) -> int:
    """How many rows of row group ``group`` (its first row: ``first_row`` of the file, from
    0) to decode at a time: at most ``most``, fewer when its pages are large, so that a batch
    decodes to at most about ``BATCH_BYTES`` (one row at a time if even that is more).

    InputError, before anything is decoded, for a page larger than ``max_record`` (or
    ``PAGE_FLOOR`` if larger: pages hold many records), for a row whose own pages (a page
    with that row alone) hold more than ``max_record``, and for a row group whose rows hold
    more than ``max_record`` on average (a row group of one row: that row), and for one whose
    pages decode to more than ``GROUP_BYTES`` (``decoded_pages``: a dictionary's entries
    repeated by the indices)."""
    chunks = parquet.metadata.row_group(group)
    rows, total, decoded = chunks.num_rows, 0, 0
    alone: dict[int, int] = {}  # a row of the group -> bytes of the pages it has to itself
    columns = []
    for i in range(chunks.num_columns):
        column = chunks.column(i)
        try:
            pages = chunk_pages(file, chunk_start(column), column.total_compressed_size)
        except BadHeader as error:
            raise InputError(f"{path}: row group {group}, column {column.path_in_schema}: a "
                             f"page header that cannot be read ({error})") from None
        schema = parquet.schema.column(i)
        flat = schema.max_repetition_level == 0
        sized = decoded_pages(file, pages, column, schema.length or 0, BATCH_BYTES)
        decoded += sum(page.size for page in sized)

        def where(row: int, count: int | None, name=column.path_in_schema) -> str:
            row, count = (row, count) if count is not None else (0, rows)  # the whole group
            rows_at = f"row {first_row + row + 1}" if count == 1 else \
                f"rows {first_row + row + 1}-{first_row + row + count}"
            return f"{path} {rows_at} (column {name})"

        columns.append(_column_pages(pages, flat, rows, alone, max(max_record, PAGE_FLOOR),
                                     where)._replace(entry=_entry(pages, sized)))
        total += sum(page.size for page in pages)
    if decoded > GROUP_BYTES:
        raise InputError(f"{path} rows {first_row + 1}-{first_row + rows}: their pages decode "
                         f"to {decoded:,} bytes, more than {limit_text(GROUP_BYTES)} (a "
                         "dictionary's entries repeated by their indices), the most pack "
                         "decodes from one row group")
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
                            + count * c.entry for c in columns) > BATCH_BYTES:
        count //= 2
    return count


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
            start = chunk_start(column)
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
