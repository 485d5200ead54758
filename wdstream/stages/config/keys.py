"""The keys of a config (``wdstream.from_config``): one row each in ``TOP_KEYS`` or
``DATASET_KEYS`` (its type, limits, aliases), read and checked into plain values with every
mistake collected in one report (``Report``), before anything is built."""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wdstream.errors import InputError, ManifestError
from wdstream.options import CHOICES
from wdstream.printable import short_repr
from wdstream.sources.openers import OPENERS
from wdstream.stream.plan.epoch import REMAINDER_POLICIES

log = logging.getLogger("wdstream.config")  # the logger name users configure
LARGEST = (1 << 63) - 1  # the largest number a config may give (int64)
# Longer than any model's context (16M tokens); a sequence's arrays are 8 bytes a token.
MAX_SEQ_LEN = 1 << 24

@dataclass(frozen=True)
class Key:
    """A known key: the types it accepts (``description`` says them in errors), an optional
    minimum (numbers) or list of choices (strings), and ``alias_of``: the key it is another
    name for."""

    kinds: tuple[type, ...]
    description: str
    minimum: float | None = None
    choices: tuple[str, ...] | None = None
    alias_of: str | None = None
    maximum: int = LARGEST  # numbers: what int64 arithmetic holds, or less

    def problem(self, value) -> str | None:
        if isinstance(value, bool) and bool not in self.kinds or not isinstance(value, self.kinds):
            shown = short_repr(value, 60)
            return f"must be {self.description}, not {type(value).__name__} {shown}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            pass
        elif self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum:g}, not {short_repr(value, 60)}"
        elif value > self.maximum:
            return f"must be at most {self.maximum:,}, not {short_repr(value, 60)}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, not {short_repr(value, 60)}"
        return None


def _int(minimum=None, alias_of=None, maximum=LARGEST):
    return Key((int,), "an integer", minimum, alias_of=alias_of, maximum=maximum)


def _str(choices=None, alias_of=None):
    return Key((str,), "a string", choices=choices, alias_of=alias_of)


_BOOL = Key((bool,), "true or false")
_START = Key((int, type(None)), "an integer or null", 1)  # shuffle_start: null, windows of one size
_NUMBER = Key((int, float), "a number")
_ENTRIES = Key((list, Mapping), "a list of datasets")

TOP_KEYS: dict[str, Key] = {
    "datasets": _ENTRIES,
    "pretraining_dataset": _ENTRIES,
    "seed": _int(),
    "stop": _str(CHOICES["stop"]),
    "samples_per_epoch": _int(1),
    "streaming": _BOOL,
    "shuffle": _BOOL,
    "shuffle_merged_datasets": Key((bool,), "true or false", alias_of="shuffle"),
    "shuffle_window": _int(1),
    "shuffle_start": _START,
    "opener": _str(OPENERS),
    "text_field": _str(),
    "text_column": _str(alias_of="text_field"),
    "seq_len": _int(1, maximum=MAX_SEQ_LEN),
    "sequence_len": _int(1, alias_of="seq_len", maximum=MAX_SEQ_LEN),
    "tokenizer": _str(),
    "eos": Key((int, str), "a token id or a token string"),
    "special_tokens": Key((Mapping,), "a mapping of token names to tokens"),
    "sequences_per_epoch": _int(1),
    "tokens_per_epoch": _int(1),
    "schedule": Key((list,), "a list of stages {start, weights}"),
    "long_documents": _str(CHOICES["long_documents"]),
}

DATASET_KEYS: dict[str, Key] = {
    "path": _str(),
    "name": _str(),  # a subset: the folder ``path/name/``
    "split": _str(),  # a split: the folder ``path[/name]/split/``
    "data_files": Key((str, list), "a file name or a list of them"),
    "label": _str(),  # the source's name in the mixture (``__source__``)
    "weight": _NUMBER,
    "streaming": _BOOL,
    "type": Key((str, Mapping), "a dataset type"),
    "text_field": _str(),
    "field": _str(alias_of="text_field"),
    "text_column": _str(alias_of="text_field"),
    "shuffle": _BOOL,
    "shuffle_window": _int(1),
    "shuffle_start": _START,
    "seed": _int(),
    "opener": _str(OPENERS),
    "remainder": _str(REMAINDER_POLICIES),
}

# A trainer's numbers that a plugin passes on to wdstream (axolotl's names), as ``TOP_KEYS``'
# rows: the batch and the workers a ``DataLoader`` starts (one process each), the steps.
TRAINER_KEYS: dict[str, Key] = {
    "sequence_len": TOP_KEYS["sequence_len"],
    "sequences_per_epoch": TOP_KEYS["sequences_per_epoch"],
    "tokens_per_epoch": TOP_KEYS["tokens_per_epoch"],
    "micro_batch_size": _int(1, maximum=1 << 20),
    "gradient_accumulation_steps": _int(1, maximum=1 << 20),
    "dataloader_num_workers": _int(0, maximum=1024),
    "max_steps": _int(0),
    "num_epochs": Key((int, float), "a number", 0, maximum=1 << 20),
}

TEXT_TYPES = ("pretrain", "completion")  # raw documents of text (or token ids), packed as is
_PACKING_KEYS = ("tokenizer", "eos", "sequences_per_epoch", "long_documents", "tokens_per_epoch")


class Report:
    """Collects every error of a config, and the keys it ignores."""

    def __init__(self, where: str):
        self.where = where
        self.errors: list[str] = []
        self.ignored: list[str] = []
        self.manifest_errors = 0

    def error(self, label: str, message: str, kind: type = InputError) -> None:
        self.errors.append(f"{label}: {message}")
        self.manifest_errors += kind is ManifestError

    def raise_errors(self) -> None:
        if len(self.errors) == 1:  # a bad manifest stays a ManifestError
            raise (ManifestError if self.manifest_errors else InputError)(self.errors[0])
        if self.errors:
            raise InputError(f"{self.where}: {len(self.errors)} errors:\n  - "
                             + "\n  - ".join(self.errors))

    def warn_ignored(self) -> None:
        if self.ignored:
            log.warning("%s: ignored keys (not used by wdstream): %s", self.where,
                        ", ".join(self.ignored))


def resembled(key, known: Iterable[str], cutoff: float = 0.8) -> str:
    """`` (did you mean 'KEY'?)`` with the known key ``key`` most resembles, or ``""``."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_keys(entry: Mapping, known: Mapping[str, Key], label: str, prefix: str,
               report: Report) -> dict:
    """The entry's known keys, under their canonical names, each checked against its row;
    unknown keys are noted as ignored (with the known key they resemble)."""
    values: dict = {}
    given: dict[str, str] = {}  # canonical name -> the key it was given as
    for key, value in entry.items():
        row = known.get(key)
        if row is None:
            report.ignored.append(f"{prefix}{key}{resembled(key, known)}")
            continue
        if value is None and type(None) not in row.kinds:
            continue  # an empty key (``special_tokens:`` in YAML): not set
        problem = row.problem(value)
        if problem is not None:
            report.error(label, f"{key!r} {problem}")
            continue
        name = row.alias_of or key
        if name in values and values[name] != value:
            report.error(label, f"{given[name]!r} and {key!r} are the same setting with "
                         f"different values ({short_repr(values[name], 60)}, "
                         f"{short_repr(value, 60)})")
            continue
        values[name], given[name] = value, key
    return values


def check_values(values: Mapping, known: Mapping[str, Key], where: str) -> dict:
    """``values`` checked against the rows of ``known`` (those it has), as a config's keys
    are: an ``InputError`` naming each wrong one; the values under their canonical names."""
    report = Report(where)
    checked = read_keys({key: value for key, value in values.items() if key in known},
                        known, where, "", report)
    report.raise_errors()
    return checked


def type_problem(kind) -> str | None:
    if kind in TEXT_TYPES:
        return None
    shown = kind if isinstance(kind, str) else "a custom format"
    return (f"'type' {shown!r} is a prompt format: formatting prompts and chats is the "
            "trainer's part, and wdstream streams raw text (type: pretrain or completion). "
            "Render each record into one text field first (the trainer's prompt template "
            "applied), pack those with `wdstream pack`, and give that field with "
            "'type: completion' and 'field'")


def check_entry(entry: dict, label: str, report: Report) -> bool:
    ok = True

    def error(message):
        nonlocal ok
        ok = False
        report.error(label, message)

    if not entry.get("path"):
        error("'path' is missing")
    weight = entry.get("weight", 1.0)
    if not math.isfinite(weight) or weight < 0:
        error(f"'weight' must be a finite number >= 0, not {weight!r}")
    if entry.get("streaming", True) is not True:
        error("'streaming: false' is not supported: wdstream streams")
    problem = type_problem(entry.get("type", "pretrain"))
    if problem:
        error(problem)
    files = entry.get("data_files")
    if isinstance(files, list) and (not files or not all(isinstance(f, str) for f in files)):
        error("'data_files' must be a file name or a non-empty list of them")
    return ok


def check_top(top: dict, report: Report) -> None:
    where = report.where
    if top.get("streaming", True) is not True:
        report.error(where, "'streaming: false' is not supported: wdstream streams")
    if (top.get("stop", "first_exhausted") == "fixed") != ("samples_per_epoch" in top):
        report.error(where, "'samples_per_epoch' goes with 'stop: fixed', and only with it")
    if "seq_len" not in top:
        stray = [key for key in _PACKING_KEYS if key in top]
        if stray:
            report.error(where, f"{stray[0]!r} is for packing, which needs 'seq_len' "
                         "('sequence_len')")
    elif eos_of(top) is None:
        report.error(where, "packing ('seq_len') needs 'eos' (or special_tokens.eos_token), "
                     "the end-of-document token")


def eos_of(top: dict):
    if "eos" in top:
        return top["eos"]
    token = top.get("special_tokens", {}).get("eos_token")
    return token if isinstance(token, int | str) and not isinstance(token, bool) else None
