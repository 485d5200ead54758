"""CSV/TSV and Parquet inputs: rows as dicts, a batch at a time. CSV/TSV values are strings
(the first line names the columns); Parquet rows keep their types and are read one row group
at a time (remote objects over ranged reads)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from wdstream.errors import InputError, WdstreamError
from wdstream.write.batches import MAX_RECORD, Batch, ReadCounter
from wdstream.write.input_streams import open_binary, read_errors
from wdstream.write.jsonl import too_long
from wdstream.write.remote import is_remote, open_seekable

_TABLE_BATCH = 1024  # rows of Parquet or CSV/TSV handed over at a time


def _bounded_lines(text, path: str, max_record: int) -> Iterator[str]:
    """The text's lines, refusing one longer than ``max_record`` characters before it is
    read whole."""
    number = 0
    while line := text.readline(max_record + 1):
        number += 1
        if len(line) > max_record and not line.endswith(("\n", "\r")):
            raise too_long(path, number, max_record)
        yield line


def _read_table(path: str, delimiter: str, max_record: int,
                counter: ReadCounter | None) -> Iterator[Batch]:
    """CSV/TSV rows as dicts of strings; the first row names the columns."""
    counter = counter if counter is not None else ReadCounter()
    try:
        binary = open_binary(path, counter)
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    text = io.TextIOWrapper(binary, encoding="utf-8-sig", newline="")
    reader = csv.reader(_bounded_lines(text, path, max_record), delimiter=delimiter)
    numbers: list[int] = []
    rows: list[dict] = []
    try:
        header = None
        for row in reader:
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
    then each row group's column chunks), decoded a batch at a time."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError(
            f"{path}: reading Parquet needs pyarrow (pip install 'wdstream[parquet]')"
        ) from None
    counter = counter if counter is not None else ReadCounter()
    number = 0
    file = open_seekable(path) if is_remote(path) else None
    try:
        table = pyarrow.parquet.ParquetFile(file if file is not None else path)
        metadata = table.metadata
        for group in range(metadata.num_row_groups):
            for batch in table.iter_batches(batch_size=_TABLE_BATCH, row_groups=[group]):
                rows = batch.to_pylist()
                if rows:
                    yield Batch(path, "row", range(number + 1, number + len(rows) + 1), rows)
                    number += len(rows)
            chunks = metadata.row_group(group)
            counter.read += sum(chunks.column(i).total_compressed_size
                                for i in range(chunks.num_columns))
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"{path}: cannot read Parquet after row {number}: {error}") from None
    except WdstreamError as error:
        raise InputError(f"{path}: cannot read Parquet after row {number}: {error}") from None
    finally:
        if file is not None:
            file.close()

