"""Input readers for ``wdstream pack``: records from JSON Lines, Parquet, CSV/TSV, folders, stdin.

Records come in batches that know where each record came from (``data.jsonl line 17``,
``x.parquet row 5``, ``photos/a.{jpg,json}``) so that errors can name it. Line and row numbers
count from 1.

Types are told by the name: ``.jsonl``/``.ndjson`` (JSON Lines), ``.csv``, ``.tsv`` (each also
``.gz`` or ``.zst``), ``.parquet``/``.pq``, a directory, and ``-`` for JSON Lines on stdin.
pyarrow and zstandard are imported only when a Parquet or ``.zst`` input is read. Each may
also be an s3://, gs://, https:// or other fsspec URL, and a glob pattern (``remote``), read
as a stream without a local copy.

Reading takes time linear in the input and memory bounded by the longest record accepted
(``MAX_RECORD``) plus a constant.

JSON Lines records are handed on as the line's bytes, unparsed: in the default layout they are
packed byte for byte and parsed (to reject malformed JSON) by the process that writes their
shard, which keeps the reading process light so that ``--workers`` scales.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import os
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO, NamedTuple

from wdstream.errors import InputError, WdstreamError
from wdstream.sizes import format_size
from wdstream.write.remote import (
    Found,
    expand_local,
    expand_remote,
    has_glob,
    is_remote,
    list_folder,
    open_seekable,
    open_stream,
)

STDIN = "-"
MAX_RECORD = 256 << 20  # the longest JSON or CSV/TSV line accepted (bytes); see read_jsonl

_JSONL = (".jsonl", ".ndjson")
_COMPRESSED = ("", ".gz", ".zst")
_PARQUET = (".parquet", ".pq")
_CHUNK = 4 << 20  # bytes of JSON Lines split at a time
_ONE = 1  # _ONE.__add__: a line's length plus its newline, without a Python frame
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
    # JSON lines of a plain local file: the byte offset of each value's line, and one more
    # (where the next line starts), so that another process can read values[a:b] again
    # from the file (read_lines) rather than be sent their bytes
    offsets: Sequence[int] | None = None

    def where(self, i: int) -> str:
        """``data.jsonl line 17``, ``x.parquet row 5``, ``photos/a.{jpg,json}``."""
        value = self.values[i]
        if isinstance(value, FolderSample):
            exts = [ext for ext, _, _ in value.files]
            names = exts[0] if len(exts) == 1 else "{" + ",".join(exts) + "}"
            return f"{self.source.rstrip('/')}/{value.key}.{names}"
        return f"{self.source} {self.unit} {self.numbers[i]}"


def input_kind(path: str) -> str:
    """``"jsonl"``, ``"csv"``, ``"tsv"`` or ``"parquet"`` by the name (a URL's query string
    aside), ``"folder"`` for a local directory; InputError otherwise."""
    if path == STDIN:
        return "jsonl"
    if not is_remote(path):
        if os.path.isdir(path):
            return "folder"
        if not os.path.exists(path):
            raise InputError(f"{path}: no such file or directory")
    name = path.split("?", 1)[0].lower() if is_remote(path) else path.lower()
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


class Input(NamedTuple):
    """One input to read: its path or URL, its kind, and its size in bytes (0 if not known:
    stdin; a folder's is the sum of its files')."""

    path: str
    kind: str
    size: int


def check_inputs(paths: Iterable[str]) -> list[Input]:
    """Every input, glob patterns expanded (each to its matches in sorted order), checked
    before anything is read or written: a missing file or object, an empty match, an
    unknown type or a refused credential is an InputError naming it."""
    paths = list(paths)
    if not paths:
        raise InputError("no inputs given")
    if paths.count(STDIN) > 1:
        raise InputError("stdin (-) can be read only once")
    checked = []
    for path in paths:
        if path == STDIN:
            checked.append(Input(path, "jsonl", 0))
        elif is_remote(path):
            checked += [_checked(found) for found in expand_remote(path)]
        elif not os.path.exists(path) and has_glob(path):
            checked += [_checked(found) for found in expand_local(path)]
        else:
            kind = input_kind(path)
            size = _folder_size(path) if kind == "folder" else os.path.getsize(path)
            checked.append(Input(path, kind, size))
    return checked


def _checked(found: Found) -> Input:
    if found.folder:
        return Input(found.url, "folder", found.size)
    return Input(found.url, input_kind(found.url), found.size)


def _folder_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _, files in os.walk(path) for name in files)


class ReadCounter:
    """Bytes of the inputs read so far (as stored: compressed bytes for .gz/.zst) and their
    total from the listing, for progress."""

    def __init__(self, total: int = 0):
        self.total = total
        self.read = 0


def iter_batches(inputs: Iterable[Input | tuple], *, max_record: int = MAX_RECORD,
                 counter: ReadCounter | None = None) -> Iterator[Batch]:
    """Batches of records of every input in order; InputError if there are no records at all.

    ``max_record``: the longest JSON line or CSV/TSV line accepted, in bytes; a longer one is
    refused as soon as that much of it is read, so memory stays within about twice this.
    """
    inputs = [item if isinstance(item, Input) else Input(item[0], item[1], 0) for item in inputs]
    counter = counter if counter is not None else ReadCounter()
    count = 0
    for item in inputs:
        before = counter.read
        for batch in _READERS[item.kind](item.path, max_record, counter):
            count += len(batch.values)
            yield batch
        if item.size:
            counter.read = before + item.size  # whatever the reader counted on the way
    if count == 0:
        names = ", ".join(_source_name(item.path) for item in inputs)
        raise InputError(f"no records in the input ({names})")


def _source_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


class _Counted(io.RawIOBase):
    """A raw stream that adds the bytes read through it to a ReadCounter."""

    def __init__(self, stream, counter: ReadCounter):
        self._stream, self._counter = stream, counter

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._stream.readinto(buffer)
        self._counter.read += n or 0
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                super().close()


def _open_binary(path: str, counter: ReadCounter) -> BinaryIO:
    """A buffered binary stream of the input's bytes, decompressed by its suffix; remote
    inputs are streamed, never copied to a file."""
    if path == STDIN:
        return sys.stdin.buffer
    name = path.split("?", 1)[0].lower() if is_remote(path) else path.lower()
    if is_remote(path):
        try:
            stream = open_stream(path)
        except WdstreamError as error:
            raise InputError(str(error)) from None
    else:
        stream = open(path, "rb", buffering=0)  # returned to the caller
    raw = io.BufferedReader(_Counted(stream, counter), 1 << 20)
    if name.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")  # closing it leaves raw open: see _close
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


def _close(stream) -> None:
    """Close a stream of ``_open_binary`` and what it wraps (GzipFile leaves its fileobj)."""
    inner = getattr(stream, "fileobj", None)
    try:
        stream.close()
    finally:
        if inner is not None:
            inner.close()


def _read_errors():
    """Exceptions that mean a compressed or binary file is damaged, not a bug here."""
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    if "zstandard" in sys.modules:
        errors.append(sys.modules["zstandard"].ZstdError)
    return tuple(errors)


def _too_long(source: str, number: int, max_record: int) -> InputError:
    limit = f"{max_record >> 20} MiB" if max_record % (1 << 20) == 0 else format_size(max_record)
    return InputError(f"{source} line {number}: longer than {limit}, the longest record pack "
                      "accepts")


def read_jsonl(path: str, max_record: int = MAX_RECORD,
               counter: ReadCounter | None = None) -> Iterator[Batch]:
    """Non-blank lines as stripped bytes, read in large chunks (a leading byte order mark is
    dropped).

    A line longer than a chunk is kept as a list of pieces and joined once, when its end
    comes, so reading takes time linear in the input whatever its lines' lengths; a line
    longer than ``max_record`` is refused as soon as that much of it is read.
    """
    source = _source_name(path)
    counter = counter if counter is not None else ReadCounter()
    try:
        stream = _open_binary(path, counter)
    except OSError as error:
        raise InputError(f"{source}: cannot read: {error.strerror or error}") from None
    number = 0  # lines handed over so far, blank ones included
    pieces: list[bytes] = []  # an incomplete last line, completed by later chunks
    pending = 0  # bytes in pieces
    at_start = True
    check_each = max_record < _CHUNK  # else no line within one chunk can be too long
    name = path.lower()
    track = path != STDIN and not is_remote(path) and not name.endswith((".gz", ".zst"))
    line_start = 0  # byte offset in the file of the first line not yet handed over
    # From a pipe, take what has arrived rather than wait for a full chunk: records that come
    # slowly still make progress (and shards) as they come.
    read = stream.read1 if path == STDIN else stream.read
    try:
        while True:
            chunk = read(_CHUNK)
            if at_start and chunk:
                if pending + len(chunk) < len(codecs.BOM_UTF8):
                    pieces.append(chunk)
                    pending += len(chunk)
                    continue
                at_start = False
                if pieces:
                    chunk, pieces, pending = b"".join(pieces) + chunk, [], 0
                if chunk.startswith(codecs.BOM_UTF8):
                    chunk = chunk[len(codecs.BOM_UTF8):]
                    line_start = len(codecs.BOM_UTF8)
                    if not chunk:
                        continue
            if not chunk:
                lines = [b"".join(pieces)] if pending else []
                pieces, pending = [], 0
            elif pieces:
                first = chunk.find(b"\n")
                if first < 0:
                    pieces.append(chunk)
                    pending += len(chunk)
                    if pending > max_record:
                        raise _too_long(source, number + 1, max_record)
                    continue
                head = b"".join(pieces) + chunk[:first]
                if len(head) > max_record:
                    raise _too_long(source, number + 1, max_record)
                lines = chunk[first + 1:].split(b"\n")
                lines[0:0] = [head]
                tail = lines.pop()
                pieces, pending = ([tail], len(tail)) if tail else ([], 0)
            else:
                lines = chunk.split(b"\n")
                tail = lines.pop()
                pieces, pending = ([tail], len(tail)) if tail else ([], 0)
                if pending > max_record:
                    raise _too_long(source, number + len(lines) + 1, max_record)
            if check_each and lines:
                for i, line in enumerate(lines):
                    if len(line) > max_record:
                        raise _too_long(source, number + i + 1, max_record)
            if lines:
                first = number + 1
                number += len(lines)
                offsets = None
                if track:  # starts of the lines, and where the next one starts
                    offsets = list(itertools.accumulate(map(_ONE.__add__, map(len, lines)),
                                                        initial=line_start))
                    line_start = offsets[-1]
                stripped = [line.strip() for line in lines]
                if all(stripped):
                    yield Batch(source, "line", range(first, number + 1), stripped, offsets)
                else:
                    kept = [i for i, line in enumerate(stripped) if line]
                    if kept:
                        yield Batch(source, "line", [first + i for i in kept],
                                    [stripped[i] for i in kept],
                                    None if offsets is None else
                                    [offsets[i] for i in kept] + [offsets[-1]])
            if not chunk:
                return
    except _read_errors() as error:
        raise InputError(f"{source}: cannot read after line {number}: {error}") from None
    finally:
        if path != STDIN:
            _close(stream)


def read_lines(path: str, start: int, stop: int, count: int) -> list[bytes]:
    """The ``count`` non-blank lines, stripped, between byte offsets ``start`` and ``stop`` of
    a plain local JSON Lines file, as ``read_jsonl`` handed them over (see Batch.offsets)."""
    try:
        with open(path, "rb") as file:
            file.seek(start)
            data = file.read(stop - start)
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    lines = [line for line in map(bytes.strip, data.split(b"\n")) if line]
    if len(lines) != count:
        raise InputError(f"{path}: changed while packing (bytes {start}-{stop} no longer hold "
                         f"the {count} lines read there)")
    return lines


def _bounded_lines(text, path: str, max_record: int) -> Iterator[str]:
    """The text's lines, refusing one longer than ``max_record`` characters before it is
    read whole."""
    number = 0
    while line := text.readline(max_record + 1):
        number += 1
        if len(line) > max_record and not line.endswith(("\n", "\r")):
            raise _too_long(path, number, max_record)
        yield line


def _read_table(path: str, delimiter: str, max_record: int,
                counter: ReadCounter | None) -> Iterator[Batch]:
    """CSV/TSV rows as dicts of strings; the first row names the columns."""
    counter = counter if counter is not None else ReadCounter()
    try:
        binary = _open_binary(path, counter)
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


def read_folder(path: str, max_record: int = MAX_RECORD,
                counter: ReadCounter | None = None) -> Iterator[Batch]:
    """Files sharing a key form one sample, in key order.

    The key is the path relative to the folder up to the first dot of the basename (WebDataset's
    rule). Files in subfolders therefore give keys with "/" (``cats/a``), which the packer
    refuses under the key rules rather than renaming them silently. Hidden files and folders
    (a name starting with ".") are skipped; a file without an extension is an error, since its
    member would have no name. A remote folder is every object under the prefix; the files'
    bytes are read by the process that writes their shard.
    """
    counter = counter if counter is not None else ReadCounter()
    entries: list[tuple[str, str, str, int]] = []  # (key, ext, path, size)
    for relative, file_path, size in _folder_files(path):
        folder, _, name = relative.rpartition("/")
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        base, dot, ext = name.partition(".")
        if not dot or not ext:
            raise InputError(
                f"{file_path}: a file without an extension cannot be a sample member "
                "(the extension names the member)"
            )
        entries.append(((folder + "/" if folder else "") + base, ext, file_path, size))
    entries.sort()
    index = 0
    while index < len(entries):
        key = entries[index][0]
        end = index
        while end < len(entries) and entries[end][0] == key:
            end += 1
        files = tuple((ext, file_path, size) for _, ext, file_path, size in entries[index:end])
        counter.read += sum(size for _, _, size in files)
        yield Batch(path, "file", (0,), [FolderSample(key, files)])
        index = end


def _folder_files(path: str) -> list[tuple[str, str, int]]:
    """``(relative path with "/", path or URL, size)`` of every file under the folder."""
    if is_remote(path):
        return list_folder(path)
    files = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        relative = os.path.relpath(folder, path)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        for name in sorted(names):
            file_path = os.path.join(folder, name)
            files.append((prefix + name, file_path, os.path.getsize(file_path)))
    return files


_READERS = {
    "jsonl": read_jsonl,
    "csv": read_csv,
    "tsv": read_tsv,
    "parquet": read_parquet,
    "folder": read_folder,
}
