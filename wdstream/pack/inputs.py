"""Input readers for ``wdstream pack``: records from JSON Lines, Parquet, CSV/TSV, folders, stdin.

Records come in batches that know where each record came from (``data.jsonl line 17``,
``x.parquet row 5``, ``photos/a.{jpg,json}``) so that errors can name it. Line and row numbers
count from 1.

Types are told by the name: ``.jsonl``/``.ndjson`` (JSON Lines), ``.csv``, ``.tsv`` (each also
``.gz`` or ``.zst``), ``.parquet``/``.pq``, a directory, and ``-`` for JSON Lines on stdin.
pyarrow and zstandard are imported only when a Parquet or ``.zst`` input is read.

JSON Lines records are handed on as the line's bytes, unparsed: in the default layout they are
packed byte for byte and parsed (to reject malformed JSON) by the process that writes their
shard, which keeps the reading process light so that ``--workers`` scales.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO, NamedTuple

from ..errors import InputError

STDIN = "-"

_JSONL = (".jsonl", ".ndjson")
_COMPRESSED = ("", ".gz", ".zst")
_PARQUET = (".parquet", ".pq")
_CHUNK = 4 << 20  # bytes of JSON Lines split at a time
_TABLE_BATCH = 1024  # rows of Parquet or CSV/TSV handed over at a time


class FolderSample(NamedTuple):
    """Files of a folder that share a key: ``a.jpg`` + ``a.json`` -> key ``a``."""

    key: str  # the relative path up to the first dot of the basename, "/"-separated
    files: tuple[tuple[str, str, int], ...]  # (extension, path, size), sorted by extension


class Batch(NamedTuple):
    """Consecutive records of one input, and where each came from.

    ``values`` holds ``bytes`` for JSON lines (stripped, not parsed), ``dict`` for Parquet and
    CSV/TSV rows (column -> value), or ``FolderSample``. Readers hand over batches rather than
    single records so that the per-record work in the reading process stays small.
    """

    source: str  # the input as the user named it; "<stdin>" for "-"
    unit: str  # "line", "row" or "file"
    numbers: Sequence[int]  # line or row number of each value, from 1 (0 for folder samples)
    values: list

    def where(self, i: int) -> str:
        """``data.jsonl line 17``, ``x.parquet row 5``, ``photos/a.{jpg,json}``."""
        value = self.values[i]
        if isinstance(value, FolderSample):
            exts = [ext for ext, _, _ in value.files]
            names = exts[0] if len(exts) == 1 else "{" + ",".join(exts) + "}"
            return f"{self.source.rstrip('/')}/{value.key}.{names}"
        return f"{self.source} {self.unit} {self.numbers[i]}"


def input_kind(path: str) -> str:
    """``"jsonl"``, ``"csv"``, ``"tsv"``, ``"parquet"`` or ``"folder"``; InputError otherwise."""
    if path == STDIN:
        return "jsonl"
    if os.path.isdir(path):
        return "folder"
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")
    name = path.lower()
    if name.endswith(_PARQUET):
        return "parquet"
    for compression in _COMPRESSED:
        if name.endswith(tuple(ext + compression for ext in _JSONL)):
            return "jsonl"
        if name.endswith(".csv" + compression):
            return "csv"
        if name.endswith(".tsv" + compression):
            return "tsv"
    raise InputError(
        f"{path}: unknown input type (use .jsonl/.ndjson, .csv, .tsv (each also .gz or .zst), "
        ".parquet, a folder, or - for JSON Lines on stdin)"
    )


def check_inputs(paths: Iterable[str]) -> list[tuple[str, str]]:
    """``(path, kind)`` for every input, checked before anything is read or written."""
    paths = list(paths)
    if not paths:
        raise InputError("no inputs given")
    if paths.count(STDIN) > 1:
        raise InputError("stdin (-) can be read only once")
    return [(path, input_kind(path)) for path in paths]


def iter_batches(inputs: Iterable[tuple[str, str]]) -> Iterator[Batch]:
    """Batches of records of every input in order; InputError if there are no records at all."""
    inputs = list(inputs)
    count = 0
    for path, kind in inputs:
        for batch in _READERS[kind](path):
            count += len(batch.values)
            yield batch
    if count == 0:
        names = ", ".join(_source_name(path) for path, _ in inputs)
        raise InputError(f"no records in the input ({names})")


def _source_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def _open_binary(path: str) -> BinaryIO:
    """A buffered binary stream of the file's bytes, decompressed by its suffix."""
    if path == STDIN:
        return sys.stdin.buffer
    name = path.lower()
    if name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")
    raw = open(path, "rb")  # returned to the caller, who closes it
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise InputError(
                f"{path}: reading .zst needs the zstandard package (pip install 'wdstream[zstd]')"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader, 1 << 20)
    return raw


def _read_errors():
    """Exceptions that mean a compressed or binary file is damaged, not a bug here."""
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    if "zstandard" in sys.modules:
        errors.append(sys.modules["zstandard"].ZstdError)
    return tuple(errors)


def read_jsonl(path: str) -> Iterator[Batch]:
    """Non-blank lines as stripped bytes, read in large chunks (a leading byte order mark is
    dropped)."""
    source = _source_name(path)
    stream = _open_binary(path)
    number = 0  # lines handed over so far, blank ones included
    rest = b""  # an incomplete last line, completed by the next chunk
    at_start = True
    # From a pipe, take what has arrived rather than wait for a full chunk: records that come
    # slowly still make progress (and shards) as they come.
    read = stream.read1 if path == STDIN else stream.read
    try:
        while True:
            chunk = read(_CHUNK)
            if chunk:
                data = rest + chunk if rest else chunk
                if at_start and len(data) >= len(codecs.BOM_UTF8):
                    at_start = False
                    if data.startswith(codecs.BOM_UTF8):
                        data = data[len(codecs.BOM_UTF8) :]
                lines = data.split(b"\n")
                rest = lines.pop()
            else:
                lines, rest = ([rest] if rest else []), b""
            if lines:
                first = number + 1
                number += len(lines)
                stripped = [line.strip() for line in lines]
                if all(stripped):
                    yield Batch(source, "line", range(first, number + 1), stripped)
                else:
                    kept = [(n, line) for n, line in zip(range(first, number + 1), stripped, strict=True) if line]
                    if kept:
                        yield Batch(source, "line", [n for n, _ in kept], [line for _, line in kept])
            if not chunk:
                return
    except _read_errors() as error:
        raise InputError(f"{source}: cannot read after line {number}: {error}") from None
    finally:
        if path != STDIN:
            stream.close()


def _read_table(path: str, delimiter: str) -> Iterator[Batch]:
    """CSV/TSV rows as dicts of strings; the first row names the columns."""
    text = io.TextIOWrapper(_open_binary(path), encoding="utf-8-sig", newline="")
    reader = csv.reader(text, delimiter=delimiter)
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
                    raise InputError(f"{path} line {reader.line_num}: duplicate columns {duplicates}")
                continue
            if len(row) != len(header):
                raise InputError(
                    f"{path} line {reader.line_num}: {len(row)} fields, the header has {len(header)}"
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
        raise InputError(f"{path} line {reader.line_num}: {error}") from None
    except _read_errors() as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    finally:
        text.close()


def read_csv(path: str) -> Iterator[Batch]:
    return _read_table(path, ",")


def read_tsv(path: str) -> Iterator[Batch]:
    return _read_table(path, "\t")


def read_parquet(path: str) -> Iterator[Batch]:
    """Rows as dicts, decoded a batch at a time."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError(
            f"{path}: reading Parquet needs pyarrow (pip install 'wdstream[parquet]')"
        ) from None
    number = 0
    try:
        table = pyarrow.parquet.ParquetFile(path)
        for batch in table.iter_batches(batch_size=_TABLE_BATCH):
            rows = batch.to_pylist()
            if rows:
                yield Batch(path, "row", range(number + 1, number + len(rows) + 1), rows)
                number += len(rows)
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"{path}: cannot read Parquet after row {number}: {error}") from None


def read_folder(path: str) -> Iterator[Batch]:
    """Files sharing a key form one sample, in key order.

    The key is the path relative to the folder up to the first dot of the basename (WebDataset's
    rule). Files in subfolders therefore give keys with "/" (``cats/a``), which the packer
    refuses under the key rules rather than renaming them silently. Hidden files and folders (a name starting with ".") are skipped; a file without an extension
    is an error, since its member would have no name.
    """
    entries: list[tuple[str, str, str, int]] = []  # (key, ext, path, size)
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        relative = os.path.relpath(folder, path)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        for name in sorted(files):
            if name.startswith("."):
                continue
            file_path = os.path.join(folder, name)
            base, dot, ext = name.partition(".")
            if not dot or not ext:
                raise InputError(
                    f"{file_path}: a file without an extension cannot be a sample member "
                    "(the extension names the member)"
                )
            entries.append((prefix + base, ext, file_path, os.path.getsize(file_path)))
    entries.sort()
    index = 0
    while index < len(entries):
        key = entries[index][0]
        end = index
        while end < len(entries) and entries[end][0] == key:
            end += 1
        files = tuple((ext, file_path, size) for _, ext, file_path, size in entries[index:end])
        yield Batch(path, "file", (0,), [FolderSample(key, files)])
        index = end


_READERS = {
    "jsonl": read_jsonl,
    "csv": read_csv,
    "tsv": read_tsv,
    "parquet": read_parquet,
    "folder": read_folder,
}
