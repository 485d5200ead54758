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
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping

from .errors import InputError, ManifestError, StreamError, WdstreamError
from .plan import REMAINDER_POLICIES
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
    "schedule": ((list,), "a list of stages {start, weights}"),
    "tokens_per_epoch": _INT,
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
_PACKING_KEYS = ("tokenizer", "eos", "sequences_per_epoch", "long_documents", "tokens_per_epoch")


def from_config(config):
    """A ready dataset from ``config``: a dict, or the path or URL of a YAML or JSON file."""
    base = None
    if isinstance(config, str | os.PathLike):
        where = os.fspath(config)
        config = load_config_file(where)
        local = urls.to_local_path(where)
        base = os.path.dirname(os.path.abspath(local)) if local is not None else None
    else:
        where = "config"
    return _build(config, where, base)


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


def _resolve(path: str, base: str | None) -> str:
    """A relative local path in a config file is relative to the file's folder."""
    if base is None or urls.scheme(path) != "file" or os.path.isabs(urls.to_local_path(path)):
        return path
    return os.path.join(base, urls.to_local_path(path))


def _build(config, where: str, base: str | None):
    from .dataset import StreamingDataset
    from .mix import STOP_RULES, Mix
    from .packing import LONG_DOCUMENTS, PackedSequences
    from .schedule import mixture_weights

    if not isinstance(config, Mapping):
        raise InputError(f"{where}: a config is a mapping with a 'datasets' list, not "
                         f"{type(config).__name__}")
    _check_keys(config, TOP_KEYS, where)
    entries = config.get("datasets")
    if not entries:
        raise InputError(f"{where}: 'datasets' is missing or empty")
    for key in ("samples_per_epoch", "shuffle_window", "seq_len", "sequences_per_epoch",
                "tokens_per_epoch"):
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
            label += f" ({entry['path']})"
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
            datasets.append(StreamingDataset(_resolve(entry["path"], base), **options))
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
    mix = Mix(datasets, seed=seed, stop=stop, samples_per_epoch=config.get("samples_per_epoch"),
              names=names, **mixture_weights(config, names, weights, where))
    if "seq_len" not in config:
        return mix
    text_field = fields[0] if len(set(fields)) == 1 else dict(zip(names, fields, strict=True))
    tokenizer = config.get("tokenizer")
    return PackedSequences(
        mix, _resolve(tokenizer, base) if tokenizer else None, config["seq_len"],
        eos=config["eos"], text_field=text_field,
        long_documents=config.get("long_documents", "split"),
        sequences_per_epoch=config.get("sequences_per_epoch"),
        tokens_per_epoch=config.get("tokens_per_epoch"))
