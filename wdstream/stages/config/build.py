"""A trainer's config (axolotl's keys; the keys wdstream does not use are ignored with one
warning) or a declarative dataset list, turned into a ``Mix`` of ``StreamingDataset``s, in a
``PackedSequences`` when ``sequence_len`` is given; every mistake reported at once. A config
file's ``path:``, ``tokenizer:``, ``name``, ``split`` and ``data_files`` are data: never a
``pipe:`` command, whatever the options, and names under a remote file's prefix; a config a
plugin read from a trainer's file is treated as a file's (``from_file_values``;
docs/security.md). Each key is
one row of ``keys.TOP_KEYS`` or ``keys.DATASET_KEYS``; what it does is read in ``_build``
and ``_source``. See docs/llm.md."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wdstream.errors import InputError, ManifestError, StreamError, WdstreamError
from wdstream.printable import printable
from wdstream.shards.names import outside_prefix
from wdstream.sources import urls
from wdstream.sources.stores import store_for
from wdstream.stages.config.keys import (
    DATASET_KEYS,
    TOP_KEYS,
    Report,
    check_entry,
    check_top,
    eos_of,
    read_keys,
)
from wdstream.stages.config.loading import load_config_file
from wdstream.stages.mix import Mix
from wdstream.stages.schedule import mixture_weights
from wdstream.stages.sequences import PackedSequences
from wdstream.stream.load.dataset import StreamingDataset
from wdstream.stream.plan.window import DEFAULT_SHUFFLE_START
from wdstream.tables.files import split_of
from wdstream.tables.row_range import BOUND
from wdstream.tables.units import UnitTable

# The names a data path of a config file may expand to (``{000000..999999}``): a pattern of
# more is refused before braceexpand makes them all (it holds every number of a range).
MAX_EXPANDED = 1_000_000
DEFAULT_SPLIT = "train"  # the split of files that name none, as datasets reads them
# A split's slice, as Hugging Face ``datasets`` writes one: ``train[:20%]``, ``train[100:200]``
SLICED = re.compile(r"(?P<split>[^\[\]+]+)\[(?P<start>[^:\]]*):(?P<stop>[^\]]*)\]\Z")


def from_config(config, *, allow_external_paths: bool = False,
                allow_external_shards: bool = False):
    """A ready dataset from ``config``: a ``Mix`` of ``StreamingDataset``s, in a
    ``PackedSequences`` when the config gives ``sequence_len``. Every mistake in the config
    is reported at once, in one ``InputError`` naming each entry and key.

    Args:
        config (dict | str | path): the config as a dict, or the path or URL of a YAML or
            JSON file (read within bounds; its paths are data, see the module docstring).
        allow_external_paths (bool, default False): let a config read from a URL name
            datasets and a tokenizer outside its prefix.
        allow_external_shards (bool, default False): passed to each ``StreamingDataset``.
    """
    origin = None
    if isinstance(config, str | os.PathLike):
        where = os.fspath(config)
        config = load_config_file(where)
        origin = _Origin.of(where, bool(allow_external_paths))
    else:
        where = "config"
    return _build(config, where, origin, bool(allow_external_shards))


def from_file_values(config: Mapping, where: str):
    """``from_config`` of ``config`` as read from a trainer's file by a plugin (``where`` names
    it): its paths have that file's trust, not code's: no command (``check_data_path``),
    ``name``/``split``/``data_files`` below the dataset's path, relative paths from the
    current folder (as the trainer reads them)."""
    return _build(config, where, _Origin(where, os.getcwd(), False, False))


@dataclass(frozen=True)
class _Origin:
    """Where a config file was read from: ``folder``, a local folder or a URL's prefix, is
    where its paths resolve."""

    url: str
    folder: str
    remote: bool
    allow_external: bool

    @classmethod
    def of(cls, url: str, allow_external: bool) -> _Origin:
        local = urls.to_local_path(url)
        if store_for(url).runs_command:  # a command the user wrote: its paths as a local file's
            return cls(url, os.getcwd(), False, allow_external)
        if local is not None:
            return cls(url, os.path.dirname(os.path.abspath(local)), False, allow_external)
        return cls(url, urls.parent(url), True, allow_external)


def _resolve(path: str, origin: _Origin | None, where: str) -> str:
    """A path read from a config file (``where`` names the key): a relative local path is
    relative to the file's folder; in a file read from a URL, a name under its prefix. A
    command from a file is refused (``check_data_path``). A dict from code is taken as it
    is."""
    if origin is None:
        return path
    check_data_path(path, where)
    shown = printable(repr(path))
    if not origin.remote:
        if not store_for(path).local or os.path.isabs(urls.local_path(path)):
            return path
        return os.path.join(origin.folder, urls.local_path(path))
    problem = outside_prefix(path, f"the config's prefix {origin.folder}")
    if problem is None:
        return urls.join(origin.folder, path)
    if origin.allow_external:
        return path
    raise InputError(f"{where} {shown}: {problem} (pass allow_external_paths=True to "
                     "from_config to allow it)")


def _below(name: str, origin: _Origin | None, where: str) -> str:
    """A ``name``/``split``/``data_files`` value from a config file: joined to a dataset's
    path, so it must stay below it (unless the user opted in); never a command."""
    if origin is not None:
        check_data_path(name, where)
    if origin is not None and not origin.allow_external:
        problem = outside_prefix(name, "the dataset's path")
        if problem is not None:
            raise InputError(f"{where} {printable(repr(name))}: {problem}")
    return name


def check_data_path(value: str, where: str) -> None:
    """InputError, ``where`` naming the entry and key, when ``value``, a data path from a
    config file or a trainer's file handed over by a plugin (``path``, ``name``, ``split``,
    each of ``data_files``, ``tokenizer``, and the sources they are joined into), names a
    command: it, or a name its braces expand to (``{pipe:cmd,x}``), is held by a store that
    runs commands (``Store.runs_command``). No opt-in lets one through. A pattern of more
    than ``MAX_EXPANDED`` names is refused before it is expanded."""
    from braceexpand import (  # type: ignore[attr-defined]  # missing from its own stub
        UnbalancedBracesError,
        braceexpand,
    )

    shown = printable(repr(value))
    if urls.expansion_count(value, MAX_EXPANDED) > MAX_EXPANDED:
        raise InputError(f"{where} {shown}: a pattern of more than {MAX_EXPANDED:,} names")
    names: Iterable[str]
    try:
        names = braceexpand(value)
    except UnbalancedBracesError:
        names = [value]
    if any(store_for(name).runs_command for name in names):
        raise InputError(f"{where} {shown}: a pipe: command; commands are never taken from a "
                         "config file, whatever the options (pass the config as a dict from "
                         "code to use one)")


def _subfolder(prefix: str, name: str) -> str:
    return urls.join(prefix.rstrip("/") + "/", name.strip("/") + "/")


def _entries(config: Mapping, top: dict, report: Report) -> list[tuple[str, object]]:
    """``(label, entry)`` of ``datasets:`` then ``pretraining_dataset:`` (a list or one
    mapping each)."""
    found = []
    for key in ("datasets", "pretraining_dataset"):
        value = top.get(key)
        if value is None:
            continue
        items = [value] if isinstance(value, Mapping) else value
        found += [(f"{report.where}: {key}[{i}]", entry) for i, entry in enumerate(items)]
    malformed = any(config.get(key) is not None and key not in top
                    for key in ("datasets", "pretraining_dataset"))
    if not found and not malformed:
        report.error(report.where, "'datasets' (or 'pretraining_dataset') is missing or empty")
    return found


def split_slice(split: str, where: str) -> tuple[str, str | None]:
    """A ``split`` value's name and its slice's rows as ``StreamingDataset(rows=...)`` takes
    them (``train[:20%]``: ``train``, ``:20%``; None: the whole split)."""
    if "[" not in split and "+" not in split:
        return split, None
    match = SLICED.match(split.strip())
    if match is None or any(b and not BOUND.match(b.strip()) for b in match.group("start",
                                                                                 "stop")):
        raise InputError(f"{where}: split {printable(repr(split))}: a stream reads one split, "
                         "or a slice of it ('train[:20%]', 'train[100:200]'); give each split "
                         "its own entry")
    return match["split"].strip(), f"{match['start'].strip()}:{match['stop'].strip()}"


def _source(entry: dict, origin: _Origin | None, label: str, split: str | None,
            rows: str | None):
    """What ``StreamingDataset`` reads for an entry: the path, its subset and split folders,
    or its data files; and the source's default name. Without ``data_files``, where the
    split's folder holds nothing, the third value is what is read in its place, in turn
    (``_dataset``): the split's files as the Hugging Face Hub names them
    (``<name>/<split>-*.parquet``, or in ``data/`` as ``push_to_hub`` writes them), then for
    ``train`` the path itself, as ``datasets`` reads
    files that name no split. ``split`` and ``rows``: the entry's split and its slice
    (``split_slice``)."""
    where = label
    path = root = _resolve(entry["path"], origin, f"{where}: 'path'")
    others: list = []
    for key, value in (("name", entry.get("name")), ("split", split)):
        if value is not None:
            below = _below(value, origin, f"{where}: {key!r}")
            if key == "split":
                folder = path.rstrip("/") + "/"
                others = [[urls.join(folder, f"{place}{below}{end}")
                           for place in ("", "data/") for end in ("-*", ".*")]]
                if below == DEFAULT_SPLIT:
                    others.append(path)
            path = _subfolder(path, below)
    label = entry.get("label") or (path if ("name" in entry or "split" in entry)
                                   else entry["path"])
    if rows is not None and "label" not in entry:  # one name per slice of a split
        label = f"{label.rstrip('/')}[{rows}]"
    files = entry.get("data_files")
    if files is None:
        return _checked(path, others, origin, where, root), label, others
    files = [_below(f, origin, f"{where}: 'data_files'")
             for f in ([files] if isinstance(files, str) else files)]
    joined = [urls.join(path.rstrip("/") + "/", f) for f in files]
    if len(joined) == 1 and joined[0].endswith(".json"):
        return _checked(joined[0], [], origin, where, root), label, []  # a manifest
    return _checked(joined, [], origin, where, root), label, []


def _checked(source, others: list, origin: _Origin | None, where: str, root: str):
    """``source``, once it and the ``others`` read in its place, as joined from a config
    file's keys below the dataset's path ``root``, were checked as each key was
    (``check_data_path``) and, on a local disk, found to stay inside ``root`` through links
    (``_inside``)."""
    if origin is not None:
        for item in [one for each in [source, *others]
                     for one in ([each] if isinstance(each, str) else each)]:
            check_data_path(item, where)
            if item != root and not origin.allow_external:
                _inside(item, root, where)
    return source


def _inside(item: str, root: str, where: str) -> None:
    """InputError when the local ``item`` (a folder, file or pattern joined below ``root``)
    lies outside ``root``'s real path once links are followed: a link in the dataset's folder
    (``name: linked``, ``data_files: linked/*.jsonl``) does not lead out of it."""
    local, top = urls.to_local_path(item), urls.to_local_path(root)
    if local is None or top is None:
        return
    fixed = local[:min([local.find(c) for c in "*?[{" if c in local] or [len(local)])]
    real, inside = os.path.realpath(fixed), os.path.realpath(top)
    if real != inside and not real.startswith(inside.rstrip(os.sep) + os.sep):
        raise InputError(f"{where} {printable(repr(item))}: leads out of the dataset's path "
                         f"through a link (to {printable(real)}); pass "
                         "allow_external_paths=True to from_config to allow it")


def _dataset(source, others: list, split: str | None, **options):
    """``StreamingDataset(source)``, or where ``source`` (a split's folder) holds no dataset,
    the first of ``others`` that holds one whose files name no split but ``split``; else
    ``source``'s error."""
    try:
        return StreamingDataset(source, **options)
    except (ManifestError, StreamError) as error:
        if not others or getattr(error, "transient", False):
            raise
        first = error
    for other in others:
        try:
            dataset = StreamingDataset(other, **options)
        except (ManifestError, StreamError) as error:
            if getattr(error, "transient", False):
                raise
            continue
        table = dataset.shards
        if not isinstance(table, UnitTable) or all(split_of(f.name) in (None, split)
                                                   for f in table.files):
            return dataset
    raise first


def _build(config, where: str, origin: _Origin | None, allow_external_shards: bool = False):
    if not isinstance(config, Mapping):
        raise InputError(f"{where}: a config is a mapping with a 'datasets' list, not "
                         f"{type(config).__name__}")
    report = Report(where)
    top = read_keys(config, TOP_KEYS, where, "", report)
    check_top(top, report)
    seed = top.get("seed", 0)
    checked = []
    for label, entry in _entries(config, top, report):
        if not isinstance(entry, Mapping):
            report.error(label, f"a dataset is a mapping with a 'path', not "
                         f"{type(entry).__name__}")
            continue
        if isinstance(entry.get("path"), str):
            label += f" ({printable(entry['path'])})"
        prefix = label.split(": ", 1)[1].split(" (")[0] + "."
        values = read_keys(entry, DATASET_KEYS, label, prefix, report)
        if check_entry(values, label, report):
            checked.append((label, values))
    report.raise_errors()
    report.warn_ignored()

    datasets, weights, names, fields = [], [], [], []
    for label, entry in checked:
        try:
            split, rows = split_slice(entry["split"], label) if "split" in entry else (None, None)
            source, name, others = _source(entry, origin, label, split, rows)
        except InputError as error:
            report.error(label, str(error).removeprefix(f"{label}: "))
            continue
        options = {
            "seed": entry.get("seed", seed),
            "shuffle": entry.get("shuffle", top.get("shuffle", True)),
            "shuffle_window": entry.get("shuffle_window", top.get("shuffle_window", 1000)),
            "shuffle_start": entry.get("shuffle_start",
                                       top.get("shuffle_start", DEFAULT_SHUFFLE_START)),
            "opener": entry.get("opener", top.get("opener", "auto")),
            "remainder": entry.get("remainder", "drop"),
            "rows": rows,
        }
        try:
            datasets.append(_dataset(source, others, split,
                                     allow_external_shards=allow_external_shards, **options))
        except StreamError as error:
            if error.transient:
                raise
            report.error(label, str(error))  # a missing path, no access
        except WdstreamError as error:
            report.error(label, str(error), type(error))
        weights.append(entry.get("weight", 1.0))
        names.append(name)
        fields.append(entry.get("text_field", top.get("text_field", "text")))
    if weights and sum(weights) <= 0:  # none: each entry's own error is reported
        report.error(where, "the datasets' weights must add up to a positive number")
    if len(set(names)) != len(names):
        report.error(where, "dataset names (default: the path) must be distinct; set 'label' "
                     f"(names: {names})")
    report.raise_errors()

    mix = Mix(datasets, seed=seed, stop=top.get("stop", "first_exhausted"),
              samples_per_epoch=top.get("samples_per_epoch"), names=names,
              **mixture_weights(top, names, weights, where))
    if "seq_len" not in top:
        return mix
    text_field = fields[0] if len(set(fields)) == 1 else dict(zip(names, fields, strict=True))
    tokenizer = top.get("tokenizer")
    return PackedSequences(
        mix, _resolve(tokenizer, origin, f"{where}: 'tokenizer'") if tokenizer else None,
        top["seq_len"],
        eos=eos_of(top), text_field=text_field,
        long_documents=top.get("long_documents", "split"),
        sequences_per_epoch=top.get("sequences_per_epoch"),
        tokens_per_epoch=top.get("tokens_per_epoch"))
