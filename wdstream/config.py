"""A declarative dataset list, as training frameworks write them, turned into a dataset.

```yaml
seed: 17
stop: first_exhausted          # or cycle, or fixed (with samples_per_epoch)
seq_len: 2048                  # optional: tokenize and pack (needs eos, and tokenizer for text)
tokenizer: tokenizer.json
eos: "</s>"
datasets:
  - path: s3://bucket/web/
    weight: 0.7
    streaming: true
    type: pretrain
    text_field: text
  - path: s3://bucket/code/
    weight: 0.3
    text_field: content
```

``from_config`` returns a ``Mix`` of ``StreamingDataset``s, wrapped in ``PackedSequences``
when ``seq_len`` is given. Unknown keys, wrong types and impossible values raise
``InputError`` naming the key and the entry. Relative local paths in a config file resolve
against the file's folder.

A config file is read from storage, so its ``path:`` and ``tokenizer:`` values are data: a
``pipe:`` command there is refused (write it in a dict passed from code), and in a config read
from a URL (``s3://…/mix.yaml``) they are names under that URL's prefix unless
``allow_external_paths=True``. See docs/security.md.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InputError, ManifestError, StreamError, WdstreamError
from .plan import REMAINDER_POLICIES
from .printable import printable
from .shards.names import outside_prefix
from .sources import urls
from .sources.openers import OPENERS
from .sources.writers import read_bytes

# key -> (accepted types, description for errors)
_INT = ((int,), "an integer")
_NUMBER = ((int, float), "a number")
_STR = ((str,), "a string")
_BOOL = ((bool,), "true or false")

TOP_KEYS = {
    "datasets": ((list,), "a list of datasets"),
    "seed": _INT,
    "stop": _STR,
    "samples_per_epoch": _INT,
    "shuffle": _BOOL,
    "shuffle_window": _INT,
    "opener": _STR,
    "text_field": _STR,
    "seq_len": _INT,
    "tokenizer": _STR,
    "eos": ((int, str), "a token id or a token string"),
    "sequences_per_epoch": _INT,
    "long_documents": _STR,
}

DATASET_KEYS = {
    "path": _STR,
    "name": _STR,
    "weight": _NUMBER,
    "streaming": _BOOL,
    "type": _STR,
    "text_field": _STR,
    "shuffle": _BOOL,
    "shuffle_window": _INT,
    "seed": _INT,
    "opener": _STR,
    "remainder": _STR,
}

DATASET_TYPES = ("pretrain",)  # documents of text (or token ids) packed for a causal LM
_PACKING_KEYS = ("tokenizer", "eos", "sequences_per_epoch", "long_documents")


def from_config(config, *, allow_external_paths: bool = False,
                allow_external_shards: bool = False):
    """A ready dataset from ``config``: a dict, or the path or URL of a YAML or JSON file.

    ``allow_external_paths``: a config read from a URL may name datasets and a tokenizer
    outside its prefix. ``allow_external_shards`` is passed to each ``StreamingDataset``."""
    origin = None
    if isinstance(config, str | os.PathLike):
        where = os.fspath(config)
        config = load_config_file(where)
        origin = _Origin.of(where, bool(allow_external_paths))
    else:
        where = "config"
    return _build(config, where, origin, bool(allow_external_shards))


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
        if urls.scheme(url) == "pipe":  # a command the user wrote: its paths as a local file's
            return cls(url, os.getcwd(), False, allow_external)
        if local is not None:
            return cls(url, os.path.dirname(os.path.abspath(local)), False, allow_external)
        return cls(url, urls.parent(url), True, allow_external)


def load_config_file(url: str) -> dict:
    """The dict in a YAML (``.yaml``/``.yml``, PyYAML needed) or JSON file."""
    try:
        text = read_bytes(url).decode("utf-8")
    except (WdstreamError, OSError, UnicodeDecodeError) as error:
        raise InputError(f"{url}: cannot read the config: {error}") from error
    if url.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{url}: not valid JSON: {error}") from error
    try:
        import yaml
    except ImportError as error:
        raise InputError(f"{url}: reading YAML needs PyYAML (pip install 'wdstream[llm]'); "
                         "or pass a dict or a .json file") from error
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InputError(f"{url}: not valid YAML: {error}") from error


def _check_keys(entry: Mapping, known: Mapping, where: str) -> None:
    for key, value in entry.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(f"{where}: unknown key {key!r}{hint} (known: {', '.join(known)})")
        kinds, description = known[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise InputError(f"{where}: {key!r} must be {description}, not "
                             f"{type(value).__name__} {value!r}")


def _positive(entry: Mapping, key: str, where: str) -> None:
    if key in entry and entry[key] < 1:
        raise InputError(f"{where}: {key!r} must be at least 1, not {entry[key]}")


def _resolve(path: str, origin: _Origin | None, where: str) -> str:
    """A path read from a config file (``where`` names the key): a relative local path is
    relative to the file's folder; in a file read from a URL, a name under its prefix. A
    ``pipe:`` command from a file is refused. A dict from code is taken as it is."""
    if origin is None:
        return path
    shown = printable(repr(path))
    if urls.scheme(path) == "pipe":
        raise InputError(f"{where} {shown}: a pipe: command; commands are never taken from a "
                         "config file (pass the config as a dict from code to use one)")
    if not origin.remote:
        if urls.scheme(path) != "file" or os.path.isabs(urls.to_local_path(path)):
            return path
        return os.path.join(origin.folder, urls.to_local_path(path))
    problem = outside_prefix(path, f"the config's prefix {origin.folder}")
    if problem is None:
        return urls.join(origin.folder, path)
    if origin.allow_external:
        return path
    raise InputError(f"{where} {shown}: {problem} (pass allow_external_paths=True to "
                     "from_config to allow it)")


def _build(config, where: str, origin: _Origin | None, allow_external_shards: bool = False):
    from .dataset import StreamingDataset
    from .mix import STOP_RULES, Mix
    from .packing import LONG_DOCUMENTS, PackedSequences

    if not isinstance(config, Mapping):
        raise InputError(f"{where}: a config is a mapping with a 'datasets' list, not "
                         f"{type(config).__name__}")
    _check_keys(config, TOP_KEYS, where)
    entries = config.get("datasets")
    if not entries:
        raise InputError(f"{where}: 'datasets' is missing or empty")
    for key in ("samples_per_epoch", "shuffle_window", "seq_len", "sequences_per_epoch"):
        _positive(config, key, where)
    stop = config.get("stop", "first_exhausted")
    if stop not in STOP_RULES:
        raise InputError(f"{where}: 'stop' must be one of {', '.join(STOP_RULES)}, not {stop!r}")
    if (stop == "fixed") != ("samples_per_epoch" in config):
        raise InputError(f"{where}: 'samples_per_epoch' goes with 'stop: fixed', and only "
                         "with it")
    if "seq_len" not in config:
        stray = [key for key in _PACKING_KEYS if key in config]
        if stray:
            raise InputError(f"{where}: {stray[0]!r} is for packing, which needs 'seq_len'")
    elif "eos" not in config:
        raise InputError(f"{where}: packing ('seq_len') needs 'eos', the end-of-document token")
    if config.get("long_documents", "split") not in LONG_DOCUMENTS:
        raise InputError(f"{where}: 'long_documents' must be one of "
                         f"{', '.join(LONG_DOCUMENTS)}, not {config['long_documents']!r}")

    seed = config.get("seed", 0)
    datasets, weights, names, fields = [], [], [], []
    for index, entry in enumerate(entries):
        label = f"{where}: datasets[{index}]"
        if not isinstance(entry, Mapping):
            raise InputError(f"{label}: a dataset is a mapping with a 'path', not "
                             f"{type(entry).__name__}")
        if "path" in entry and isinstance(entry["path"], str):
            label += f" ({printable(entry['path'])})"
        _check_keys(entry, DATASET_KEYS, label)
        if not entry.get("path"):
            raise InputError(f"{label}: 'path' is missing")
        weight = entry.get("weight", 1.0)
        if not math.isfinite(weight) or weight < 0:
            raise InputError(f"{label}: 'weight' must be a finite number >= 0, not {weight!r}")
        if entry.get("streaming", True) is not True:
            raise InputError(f"{label}: 'streaming: false' is not supported: wdstream streams")
        if entry.get("type", "pretrain") not in DATASET_TYPES:
            raise InputError(f"{label}: 'type' {entry['type']!r} is not supported "
                             f"(supported: {', '.join(DATASET_TYPES)})")
        _positive(entry, "shuffle_window", label)
        options = {
            "seed": entry.get("seed", seed),
            "shuffle": entry.get("shuffle", config.get("shuffle", True)),
            "shuffle_window": entry.get("shuffle_window", config.get("shuffle_window", 1000)),
            "opener": entry.get("opener", config.get("opener", "auto")),
            "remainder": entry.get("remainder", "drop"),
        }
        for key, allowed in (("opener", OPENERS), ("remainder", REMAINDER_POLICIES)):
            if options[key] not in allowed:
                raise InputError(f"{label}: {key!r} must be one of {', '.join(allowed)}, not "
                                 f"{options[key]!r}")
        try:
            path = _resolve(entry["path"], origin, f"{label}: 'path'")
            datasets.append(StreamingDataset(path, allow_external_shards=allow_external_shards,
                                             **options))
        except ManifestError as error:
            raise ManifestError(f"{label}: {error}") from error
        except StreamError as error:
            if error.transient:
                raise
            raise InputError(f"{label}: {error}") from error  # a missing path, no access
        weights.append(weight)
        names.append(entry.get("name", entry["path"]))
        fields.append(entry.get("text_field", config.get("text_field", "text")))
    if sum(weights) <= 0:
        raise InputError(f"{where}: the datasets' weights must add up to a positive number")
    if len(set(names)) != len(names):
        raise InputError(f"{where}: dataset names (default: the path) must be distinct; set "
                         f"'name' (names: {names})")
    mix = Mix(datasets, weights, seed=seed, stop=stop,
              samples_per_epoch=config.get("samples_per_epoch"), names=names)
    if "seq_len" not in config:
        return mix
    text_field = fields[0] if len(set(fields)) == 1 else dict(zip(names, fields, strict=True))
    tokenizer = config.get("tokenizer")
    return PackedSequences(
        mix, _resolve(tokenizer, origin, f"{where}: 'tokenizer'") if tokenizer else None,
        config["seq_len"],
        eos=config["eos"], text_field=text_field,
        long_documents=config.get("long_documents", "split"),
        sequences_per_epoch=config.get("sequences_per_epoch"))
