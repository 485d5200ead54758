"""CSV/TSV and Parquet inputs: rows as dicts, a batch at a time. CSV/TSV values are strings
(the first line names the columns); Parquet rows keep their types and are read one row group
at a time (remote objects over ranged reads)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from wdstream.errors import InputError, WdstreamError
from wdstream.write.input_bodies import open_binary, read_errors
from wdstream.write.jsonl_inputs import too_long
from wdstream.write.local_inputs import open_regular
from wdstream.write.parquet_pages import HeldChunks, batch_rows
from wdstream.write.record_batches import MAX_RECORD, Batch, ReadCounter, limit_text
from wdstream.write.remote import is_remote, open_seekable

_TABLE_BATCH = 1024  # rows of Parquet or CSV/TSV handed over at a time


class _BoundedLines:
    """The text's lines for ``csv.reader``, refusing a record (a line, or the lines a quoted
    value spans) longer than ``max_record`` bytes before it is read whole; ``record_done``
    after each row starts the next record's count."""

    def __init__(self, text, path: str, max_record: int):
        self.text, self.path, self.max_record = text, path, max_record
        self.number = 0  # lines read
        self.first = 1  # the line the record being read began on
        self.pending = 0  # bytes of that record read so far, line ends included

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = self.text.readline(self.max_record + 1 - self.pending)
        if not line:
            raise StopIteration
        self.number += 1
        size = len(line) if line.isascii() else len(line.encode("utf-8", "surrogatepass"))
        end = len(line) - len(line.rstrip("\r\n"))
        if self.pending + size - end > self.max_record:
            raise too_long(self.path, self.first, self.max_record)
        self.pending += size
        return line

    def record_done(self) -> None:
        self.first, self.pending = self.number + 1, 0


def _read_table(path: str, delimiter: str, max_record: int,
                counter: ReadCounter | None) -> Iterator[Batch]:
    """CSV/TSV rows as dicts of strings; the first row names the columns."""
    counter = counter if counter is not None else ReadCounter()
    try:
        binary = open_binary(path, counter)
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    text = io.TextIOWrapper(binary, encoding="utf-8-sig", newline="")
    lines = _BoundedLines(text, path, max_record)
    reader = csv.reader(lines, delimiter=delimiter)
    numbers: list[int] = []
    rows: list[dict] = []
    try:
        header = None
        for row in reader:
            lines.record_done()
            if not row:  # a blank line
                continue
            if header is None:
                header = row
                duplicates = sorted({name for name in header if header.count(name) > 1})
                if duplicates:
                    raise InputError(f"{path}:{reader.line_num}: duplicate columns {duplicates}")
                continue
            if len(row) != len(header):
                raise InputError(
                    f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}"
                )
            numbers.append(reader.line_num)
            rows.append(dict(zip(header, row, strict=True)))
            if len(rows) == _TABLE_BATCH:
                yield Batch(path, "line", numbers, rows)
                numbers, rows = [], []
        if rows:
            yield Batch(path, "line", numbers, rows)
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text: {error}") from None
    except csv.Error as error:
        raise InputError(f"{path}:{reader.line_num}: {error}") from None
    except read_errors() as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    finally:
        inner = getattr(binary, "fileobj", None)
        try:
            text.close()
        finally:
            if inner is not None:
                inner.close()


def read_csv(path: str, max_record: int = MAX_RECORD,
             counter: ReadCounter | None = None) -> Iterator[Batch]:
    return _read_table(path, ",", max_record, counter)


def read_tsv(path: str, max_record: int = MAX_RECORD,
             counter: ReadCounter | None = None) -> Iterator[Batch]:
    return _read_table(path, "\t", max_record, counter)


def read_parquet(path: str, max_record: int = MAX_RECORD,
                 counter: ReadCounter | None = None) -> Iterator[Batch]:
    """Rows as dicts, one row group at a time (remote objects over ranged reads: the footer,
    then each row group's column chunks), decoded a batch at a time.

    Before a row group is decoded, its pages' headers are read (``parquet_pages``): a page,
    a row or a row group too large for ``max_record`` is refused from them, and the batches
    are made small enough that one decodes to about ``parquet_pages.BATCH_BYTES``; a decoded
    row larger than ``max_record`` is refused before it becomes Python objects."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError(
            f"{path}: reading Parquet needs pyarrow (pip install 'wdstream[parquet]')"
        ) from None
    counter = counter if counter is not None else ReadCounter()
    number = 0
    file = HeldChunks(open_seekable(path)) if is_remote(path) else open_regular(path)
    try:
        table = pyarrow.parquet.ParquetFile(file)
        metadata = table.metadata
        for group in range(metadata.num_row_groups):
            if isinstance(file, HeldChunks):  # one fetch for the page headers and the values
                file.hold(metadata.row_group(group))
            size = batch_rows(file, table, group, number, path, max_record, _TABLE_BATCH)
            for batch in table.iter_batches(batch_size=size, row_groups=[group]):
                _check_rows(batch, path, number, max_record)
                rows = batch.to_pylist()
                if rows:
                    yield Batch(path, "row", range(number + 1, number + len(rows) + 1), rows)
                    number += len(rows)
            chunks = metadata.row_group(group)
            counter.read += sum(chunks.column(i).total_compressed_size
                                for i in range(chunks.num_columns))
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"{path}: cannot read Parquet after row {number}: {error}") from None
    except InputError:
        raise
    except WdstreamError as error:
        raise InputError(f"{path}: cannot read Parquet after row {number}: {error}") from None
    finally:
        file.close()


def _check_rows(batch, path: str, number: int, max_record: int) -> None:
    """InputError for a row of the decoded batch (its first: row ``number + 1``) larger than
    ``max_record`` in Arrow's memory, before it becomes Python objects."""
    if batch.nbytes <= max_record:
        return
    for i in range(batch.num_rows):
        size = batch.slice(i, 1).nbytes
        if size > max_record:
            raise InputError(f"{path} row {number + i + 1}: {size:,} bytes, more than "
                             f"{limit_text(max_record)}, the largest record pack accepts")
