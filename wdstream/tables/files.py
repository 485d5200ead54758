"""Finding the raw files of a source (Parquet, JSON Lines, Arrow IPC) and what each is now:
its size and a tag that changes with its content (S3's ETag, GCS's generation, a local
file's modification time), and a local file's identity (device, inode, change time), so that
a file changed or replaced since the plan is noticed. Locally only regular files are taken,
and neither a folder's listing nor a pattern's matches go through a link below the folder
(or the pattern's fixed part): nothing outside it is read."""

from __future__ import annotations

import dataclasses
import glob as globmod
import os
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from wdstream.errors import InputError, ManifestError
from wdstream.printable import printable
from wdstream.sources import local_files
from wdstream.sources import urls as urlmod
from wdstream.sources.local_files import Identity
from wdstream.sources.objects import folder_path
from wdstream.sources.stores import store_for

# name ending -> format; a folder listing takes every ending but ".json" (folders beside
# Arrow files hold ``dataset_info.json``, shard folders ``index.json``), which counts as
# JSON Lines (or a JSON array) when named, or matched by a pattern, explicitly, and in a
# folder whose raw files are all ".json" (``listed_names``).
SUFFIXES = {
    ".parquet": "parquet", ".arrow": "arrow",
    ".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".jsonl.zst": "jsonl",
    ".ndjson": "jsonl", ".ndjson.gz": "jsonl", ".ndjson.zst": "jsonl",
    ".json": "jsonl", ".json.gz": "jsonl", ".json.zst": "jsonl",
}
_NAMED_ONLY = (".json", ".json.gz", ".json.zst")
# what lies beside data and is no data: a manifest, datasets' and wdstream's metadata
METADATA_NAMES = frozenset({"index.json", "dataset_info.json", "state.json",
                            "dataset_dict.json"})
FORMAT_NAMES = {"parquet": "Parquet", "jsonl": "JSON Lines", "arrow": "Arrow"}
# what a folder saved by datasets.DatasetDict.save_to_disk holds at its root
DATASET_DICT = "dataset_dict.json"
# the words the Hugging Face Hub and datasets take for splits in folder and file names
SPLIT_WORDS = frozenset({"train", "training", "test", "testing", "validation", "valid", "val",
                         "dev", "eval", "evaluation"})
GLOB_CHARACTERS = "*?["
LOOKUPS_IN_FLIGHT = 32  # metadata requests at once when files are named one by one


class NoFilesError(ManifestError):
    """A source under which no Parquet, JSON Lines or Arrow file was found."""


@dataclass(frozen=True)
class RawFile:
    """A file to stream: ``name`` is its path relative to the source (what keys and
    messages show), ``tag`` what identifies its content besides its size."""

    url: str
    name: str
    size: int
    tag: str
    # a local file's device, inode and change time (``sources.local_files.Identity``): what a
    # read checks it still is; not part of what identifies the content (a copy has others)
    identity: Identity | None = dataclasses.field(default=None, compare=False)

    @property
    def format(self) -> str:
        kind = file_format(self.name)
        if kind is None:  # a raw file is listed for its suffix
            raise InputError(f"{printable(self.name)}: not a Parquet, JSON Lines or Arrow file")
        return kind


def file_format(name: str) -> str | None:
    """"parquet", "jsonl" or "arrow" for a name with one of their endings, else None."""
    lower = name.lower()
    for suffix, kind in SUFFIXES.items():
        if lower.endswith(suffix):
            return kind
    return None


def names_raw_files(source) -> bool:
    """Whether ``source`` (a URL, a pattern or a list) names raw files or patterns of them
    rather than shards or a folder. One URL ending in ``.json`` is a manifest (or a file of
    rows: ``jsonl.json_rows_file``), a pattern ending so matches files of rows."""
    if isinstance(source, str | os.PathLike) and os.fspath(source).lower().endswith(".json") \
            and not any(c in os.fspath(source) for c in GLOB_CHARACTERS):
        return False
    items = list(source) if isinstance(source, list | tuple) else [source]
    return bool(items) and all(
        isinstance(item, str | os.PathLike) and (
            file_format(os.fspath(item)) is not None
            or any(c in os.fspath(item) for c in GLOB_CHARACTERS))
        for item in items)


def find_files(source, entries: list[dict] | None = None,
               on_page: Callable[[list[dict]], None] | None = None,
               one_dataset: bool = False) -> list[RawFile]:
    """The raw files of ``source``: a folder (every Parquet, JSON Lines and Arrow file under
    it, at any depth, as the Hugging Face Hub lays out ``<name>/<split>-*.parquet``), a
    pattern (``*``, ``?``, ``[...]``; ``**`` for any depth), a file, or a list of those.
    Sorted by URL within each item, items in the order given. ``entries``: fsspec's listing
    of everything under the remote folder ``source`` when the caller made it (for a single
    folder only: the folders of a list are listed each); ``on_page``: called with each page
    of a remote folder's listing as it comes (``s3_objects.list_folder``). ``one_dataset``:
    what a ``StreamingDataset`` reads, refused where it would guess (``check_one_dataset``)."""
    items = list(source) if isinstance(source, list | tuple) else [source]
    found: list[RawFile] = []
    named: list[str] = []
    for item in items:
        item = os.fspath(item)
        if any(c in item for c in GLOB_CHARACTERS):
            found.extend(_matching(item))
        elif file_format(item) is not None:
            named.append(item)
        else:
            found.extend(_under(item, None if len(items) > 1 else entries, on_page,
                                one_dataset))
    found.extend(_described(named))
    if not found:
        raise NoFilesError(f"{printable(', '.join(map(os.fspath, items)))}: no Parquet, "
                           "JSON Lines or Arrow files there")
    if one_dataset:
        check_one_format(items, found)
    return found


def _under(folder: str, entries: list[dict] | None = None,
           on_page: Callable[[list[dict]], None] | None = None,
           one_dataset: bool = False) -> list[RawFile]:
    """Every raw file below ``folder`` (links on a local disk are not followed); a remote
    one is listed unless ``entries`` holds its listing. ``one_dataset``: a folder of splits
    refused (``check_one_split``)."""
    base = folder if folder.endswith("/") else folder + "/"
    path = urlmod.to_local_path(folder)
    if path is not None:
        fulls = {}
        for root, _, names in os.walk(path or "."):
            for name in names:
                full = os.path.join(root, name)
                relative = os.path.relpath(full, path or ".").replace(os.sep, "/")
                if not os.path.islink(full):
                    fulls[relative] = full
        found = [_local_file(urlmod.child(base, relative), fulls[relative], relative)
                 for relative in listed_names(list(fulls))]
        saved_splits = os.path.isfile(os.path.join(path or ".", DATASET_DICT))
    else:
        if entries is None:
            entries = _everything_under(folder, on_page)
        found = listed_files(folder, entries)
        root_file = folder_path(folder) + "/" + DATASET_DICT
        saved_splits = any(info["name"] == root_file for info in entries)
    found.sort(key=_by_url)
    if one_dataset:
        check_one_split(folder, found, saved_splits)
    return found


def listed_files(folder: str, entries: list[dict]) -> list[RawFile]:
    """The raw files among ``entries``, a listing of what lies under the remote ``folder``
    (folders and other files left out), in the listing's order."""
    base = folder if folder.endswith("/") else folder + "/"
    prefix = folder_path(folder) + "/"
    infos = {}
    for info in entries:
        key = info["name"]
        if info.get("type", "file") == "file" and key.startswith(prefix):
            infos[key[len(prefix):]] = info
    return [_remote_file(_child(base, name), name, infos[name])
            for name in listed_names(list(infos))]


def listed_names(names: list[str]) -> list[str]:
    """The raw files among the names a folder's listing holds, in their order: every
    ending but ``.json`` (plain or compressed); where there is none, the ``.json`` files
    but metadata (``METADATA_NAMES``), as a folder of ``train.json`` and ``test.json``."""
    taken = [name for name in names if _listed_kind(name)]
    if taken:
        return taken
    return [name for name in names if file_format(name) is not None
            and name.rsplit("/", 1)[-1].lower() not in METADATA_NAMES]


def check_one_split(folder: str, files: Sequence[RawFile], saved_splits: bool) -> None:
    """Refuse a folder that holds the splits of a dataset rather than one: a ``DatasetDict``
    saved by ``save_to_disk`` (``saved_splits``: a ``dataset_dict.json`` at its root, each
    split a subfolder), or files of two or more splits told apart by a folder or a name's
    first word (``train/``, ``test/``; ``train-00000-of-00002.parquet``)."""
    if saved_splits:
        names = sorted({f.name.split("/", 1)[0] for f in files if "/" in f.name})
        example = urlmod.join(folder, _preferred(names) or "train") + "/"
        raise InputError(
            f"{printable(folder)}: a Hugging Face DatasetDict ({DATASET_DICT}) with the splits "
            f"{', '.join(map(repr, names)) or 'none'}; a dataset streams one split: pass its "
            f"folder, e.g. {printable(example)}")
    splits: dict[str, str] = {}
    for file in files:
        split = split_of(file.name)
        if split is not None:
            splits.setdefault(split, file.name)
    if len(splits) > 1:
        named = ", ".join(f"{split!r} ({printable(name)})" for split, name in
                          sorted(splits.items()))
        first = splits[cast(str, _preferred(sorted(splits)))]  # of two or more: never None
        folder_of = first.rsplit("/", 1)[0] + "/" if "/" in first else ""
        if folder_of.rstrip("/").rsplit("/", 1)[-1] in SPLIT_WORDS:
            example = urlmod.join(folder, folder_of)
        else:
            example = urlmod.join(folder, f"{folder_of}{split_of(first)}-*")
        raise InputError(
            f"{printable(folder)}: holds the files of several splits: {named}; a dataset "
            f"streams one split: pass its folder or a pattern of its files, e.g. "
            f"{printable(example)} (a list names files to read together)")


def _preferred(splits: list[str]) -> str | None:
    """The split a message shows as the one to pass, of ``splits`` in sorted order: the first
    train split (``train``, else ``train_sft``...), else the first."""
    return next((s for s in splits if s.startswith("train")), next(iter(splits), None))


def split_of(name: str) -> str | None:
    """The split a file's path names: a folder called ``train``, ``test``, ``validation``...
    on its way, or else the first word of its name (``train-00000-of-00002.parquet``), with
    the letters after an underscore (``train_sft-00000-of-00003.parquet``: ``train_sft``;
    ``train_01.jsonl``: ``train``)."""
    *folders, base = name.split("/")
    for part in folders:
        if part.lower() in SPLIT_WORDS:
            return part.lower()
    head, _, tail = base.lower().replace(".", "-").split("-", 1)[0].partition("_")
    if head not in SPLIT_WORDS:
        return None
    return f"{head}_{tail}" if tail.isalpha() else head


def check_one_format(items: Sequence, files: Sequence[RawFile]) -> None:
    """Refuse files of more than one format (Parquet and JSON Lines, say) in one source,
    naming one file of each."""
    first: dict[str, RawFile] = {}
    for file in files:
        first.setdefault(file.format, file)
    if len(first) < 2:
        return
    named = ", ".join(f"{FORMAT_NAMES[kind]} ({printable(file.url)})"
                      for kind, file in first.items())
    file = next(iter(first.values()))
    pattern = ("**/*" if "/" in file.name else "*") + _ending(file.name)
    if len(items) == 1 and not names_raw_files(items):  # one folder
        pattern = urlmod.join(os.fspath(items[0]), pattern)
    raise InputError(f"{printable(', '.join(map(os.fspath, items)))}: files of several "
                     f"formats: {named}; a dataset streams one format: pass a pattern such "
                     f"as {printable(pattern)}, or a list of one format's files")


def _ending(name: str) -> str:
    lower = name.lower()
    return next(suffix for suffix in SUFFIXES if lower.endswith(suffix))


def _everything_under(folder: str, on_page: Callable[[list[dict]], None] | None) -> list[dict]:
    """The listing of every object below the remote ``folder``, its store's (``Store.list``:
    S3's through botocore and GCS's through its JSON API, ``on_page`` called with each page;
    the others' through fsspec's ``find``, ``on_page`` called once)."""
    return store_for(folder).list(folder, recursive=True, on_page=on_page)


def _child(base: str, name: str) -> str:
    """The URL of a listed name under ``base``: a name, never a URL of its own (fsspec chains
    URLs at "::" but for s3:// and gs://: ``Store.chains_names``)."""
    if "::" in name and store_for(base).chains_names:
        raise InputError(f"{printable(base)}: object {printable(repr(name))} cannot be read by "
                         "name through fsspec ('::' chains URLs); rename it")
    return urlmod.child(base, name)


def _by_url(file: RawFile) -> str:
    return file.url


def _listed_kind(name: str) -> bool:
    lower = name.lower()
    return file_format(name) is not None and not lower.endswith(_NAMED_ONLY)


def _matching(pattern: str) -> list[RawFile]:
    """The raw files a pattern matches; names relative to the folder before its first
    pattern character."""
    head = pattern[:min(pattern.find(c) for c in GLOB_CHARACTERS if c in pattern)]
    base = urlmod.parent(head + "x")
    path = urlmod.to_local_path(pattern)
    if path is not None:
        root = urlmod.to_local_path(base) or "."
        matches = [m for m in sorted(globmod.glob(path, recursive=True))
                   if file_format(m) and os.path.isfile(m) and _no_link_below(root, m)]
        return [_local_file(m, m, os.path.relpath(m, root).replace(os.sep, "/"))
                for m in matches]
    fs, stripped = _filesystem(pattern)
    try:
        entries = fs.glob(stripped, detail=True)
    except Exception as exc:
        raise _failure(pattern, exc) from exc
    prefix = fs._strip_protocol(base).rstrip("/") + "/"
    files = []
    for key, info in sorted(entries.items()):
        if info.get("type", "file") == "file" and file_format(key) and key.startswith(prefix):
            name = key[len(prefix):]
            files.append(_remote_file(_child(base, name), name, info))
    return files


def _no_link_below(root: str, match: str) -> bool:
    """Whether the local ``match`` of a pattern is reached from ``root`` through no link (a
    link to a folder followed by ``**`` or ``*``, a link to a file): its real path is ``root``'s
    real path joined with the path below it."""
    inside = os.path.relpath(match, root)
    return not inside.startswith("..") and \
        os.path.realpath(match) == os.path.join(os.path.realpath(root), inside)


def _described(named: Sequence[str]) -> list[RawFile]:
    """Files named one by one, with their sizes and tags looked up (many at once)."""
    if not named:
        return []
    short = _short_names(named)
    with ThreadPoolExecutor(min(LOOKUPS_IN_FLIGHT, len(named))) as pool:
        return list(pool.map(describe, named, short))


def describe(url: str, name: str | None = None) -> RawFile:
    """``url`` as it is now: a ``RawFile`` with its current size and tag."""
    name = name if name is not None else url.rsplit("/", 1)[-1]
    path = urlmod.to_local_path(url)
    if path is not None:
        try:
            return _local_file(url, path, name)
        except OSError as exc:
            raise _failure(url, exc) from exc
    try:  # S3 and GCS objects through the reader's own clients: no s3fs nor gcsfs in a worker
        info = store_for(url).describe(url)
    except Exception as exc:
        raise _failure(url, exc) from exc
    return _remote_file(url, name, info)


def _short_names(named: Sequence[str]) -> list[str]:
    """Names relative to the deepest folder that holds every named file, as listing that
    folder names them; the URLs themselves when they share no folder (other buckets or
    hosts)."""
    common = os.path.commonprefix([urlmod.parent(url) for url in named])
    common = common[:common.rfind("/") + 1]
    scheme, _, rest = common.rpartition("://")
    if common and (not scheme or "/" in rest):
        return [url[len(common):] for url in named]
    return list(named)


def _local_file(url: str, path: str, name: str) -> RawFile:
    """A local file as it is now (a link named by the user followed); InputError for
    anything but a regular file, which could hold a reader waiting (a FIFO) or be endless."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{printable(url)}: {local_files.kind(info.st_mode)}; raw files are read only "
                         "from regular files")
    return RawFile(url, name, info.st_size, f"mtime:{info.st_mtime_ns}", Identity.of(info))


def _remote_file(url: str, name: str, info: dict) -> RawFile:
    size = info.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InputError(f"{printable(url)}: the store gives no size for it")
    for field in ("generation", "ETag", "etag", "VersionId", "LastModified", "mtime"):
        value = info.get(field)
        if value:
            return RawFile(url, name, size, f"{field}:{value}")
    return RawFile(url, name, size, "")


def _filesystem(url: str):
    from wdstream.sources.clients import filesystem

    return filesystem(url)


def _failure(url: str, exc: BaseException):
    from wdstream.sources.failures import stream_error

    return stream_error(url, exc)
