"""The inputs of ``wdstream pack``: JSON Lines, Parquet, CSV/TSV, folders and stdin, told by
their names, checked before anything is read, and read in order as batches of records.

Types are told by the name: ``.jsonl``/``.ndjson`` (JSON Lines), ``.csv``, ``.tsv`` (each also
``.gz`` or ``.zst``), ``.parquet``/``.pq``, a directory, and ``-`` for JSON Lines on stdin.
pyarrow and zstandard are imported only when a Parquet or ``.zst`` input is read. Each may
also be an s3://, gs://, https:// or other fsspec URL, and a glob pattern (``remote``), read
as they arrive, without a local copy. The readers: ``jsonl``, ``tables``, ``folders``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from wdstream.errors import InputError
from wdstream.write.folders import read_folder
from wdstream.write.jsonl_inputs import read_jsonl
from wdstream.write.local_inputs import folder_files, regular_size
from wdstream.write.record_batches import MAX_RECORD, STDIN, Batch, ReadCounter, source_name
from wdstream.write.remote import Found, expand_local, expand_remote, has_glob, is_remote
from wdstream.write.tables import read_csv, read_parquet, read_tsv

_JSONL = (".jsonl", ".ndjson")
_COMPRESSED = ("", ".gz", ".zst")
_PARQUET = (".parquet", ".pq")


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


def check_inputs(paths: Iterable[str], follow_links: bool = False) -> list[Input]:
    """Every input, glob patterns expanded (each to its matches in sorted order), checked
    before anything is read or written: a missing file or object, an empty match, an
    unknown type, a refused credential, a FIFO or device, or a folder's entry that pack does
    not read (``local_files``; links out of it unless ``follow_links``) is an InputError
    naming it."""
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
            checked += [_local(match, follow_links) for match in expand_local(path)]
        else:
            checked.append(_local(path, follow_links))
    return checked


def _checked(found: Found) -> Input:
    if found.folder:
        return Input(found.url, "folder", found.size)
    return Input(found.url, input_kind(found.url), found.size)


def _local(path: str, follow_links: bool) -> Input:
    kind = input_kind(path)
    if kind == "folder":
        return Input(path, kind, sum(file.size for file in folder_files(path, follow_links)))
    return Input(path, kind, regular_size(path))


def read_in_worker(item: Input) -> bool:
    """Whether a pool worker reads this input (``worker_reads``): JSON Lines that is
    compressed or remote. A plain local file is cheap to read here, and its lines go to the
    shard writers by reference."""
    if item.kind != "jsonl" or item.path == STDIN:
        return False
    name = item.path.split("?", 1)[0].lower() if is_remote(item.path) else item.path.lower()
    return is_remote(item.path) or name.endswith((".gz", ".zst"))


def iter_batches(inputs: Iterable[Input | tuple], *, max_record: int = MAX_RECORD,
                 counter: ReadCounter | None = None,
                 worker_reader: Callable[[str, int, ReadCounter], Iterator[Batch]] | None = None,
                 follow_links: bool = False) -> Iterator[Batch]:
    """Batches of records of every input in order; InputError if there are no records at all.

    ``max_record``: the largest record accepted, in bytes (a JSON line, a CSV/TSV record, a
    Parquet row, a folder's file); a larger one is refused before it is read whole, so memory
    stays within a few times this. ``follow_links``: a folder's links out of it are read.
    ``worker_reader``: reads the inputs that ``read_in_worker`` names in a pool worker (the
    same batches as ``read_jsonl``).
    """
    items = [item if isinstance(item, Input) else Input(item[0], item[1], 0) for item in inputs]
    counter = counter if counter is not None else ReadCounter()
    count = 0
    for item in items:
        before = counter.read
        read: Callable[[str, int, ReadCounter], Iterator[Batch]] = _READERS[item.kind]
        if item.kind == "folder":
            read = functools.partial(read_folder, follow_links=follow_links)
        if worker_reader is not None and read_in_worker(item):
            read = worker_reader
        for batch in read(item.path, max_record, counter):
            count += len(batch.values)
            yield batch
        if item.size:
            counter.read = before + item.size  # whatever the reader counted on the way
    if count == 0:
        names = ", ".join(source_name(item.path) for item in items)
        raise InputError(f"no records in the input ({names})")



_READERS = {
    "jsonl": read_jsonl,
    "csv": read_csv,
    "tsv": read_tsv,
    "parquet": read_parquet,
    "folder": read_folder,
}
