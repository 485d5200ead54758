"""A slice of a split in a ``datasets:`` entry (``split: train[:20%]``, ``train[100:200]``,
``train[-5%:]``), read as Hugging Face ``datasets`` reads it: rows ``start`` to ``stop`` of the
split's files in their order, a percentage rounded to the closest row. Streamed, the split's
files are read and the rows outside the slice give no example (a function of each row's file
and row number alone, so the same on every run, resume and layout)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from wdstream.errors import InputError
from wdstream.printable import printable
from wdstream.tables.units import UnitTable

SLICED = re.compile(r"(?P<split>[^\[\]+]+)\[(?P<start>[^:\]]*):(?P<stop>[^\]]*)\]\Z")
BOUND = re.compile(r"-?\d+%?\Z")  # as datasets reads them: whole rows or percents


def split_slice(split: str, where: str) -> tuple[str, tuple[str, str] | None]:
    """The split's name and its slice's bounds as written (None: the whole split)."""
    if "[" not in split and "+" not in split:
        return split, None
    match = SLICED.match(split.strip())
    if match is None or any(b and not BOUND.match(b.strip()) for b in match.group("start",
                                                                                 "stop")):
        raise InputError(f"{where}: split {printable(repr(split))}: a stream reads one split, "
                         "or a slice of it ('train[:20%]', 'train[100:200]'); give each split "
                         "its own entry")
    return match["split"].strip(), (match["start"].strip(), match["stop"].strip())


def bound(text: str, rows: int, default: int) -> int:
    """A slice's bound as ``datasets`` reads it: rows or a percentage (the closest row),
    negative from the end, within the split."""
    if not text:
        return default
    value = int(round(int(text[:-1]) * rows / 100.0)) if text.endswith("%") else int(text)
    if value < 0:
        value = max(rows + value, 0)
    return min(value, rows)


@dataclass(frozen=True)
class RowSlice:
    """The rows ``start`` to ``stop`` of a source's files in their order (``offsets``: each
    file's first row among them, by its name, as ``__key__`` starts)."""

    offsets: Mapping[str, int]
    start: int
    stop: int

    def holds(self, key: str) -> bool:
        name, _, row = key.rpartition(":")
        return self.start <= self.offsets[name] + int(row) < self.stop


def row_slice(dataset, bounds: tuple[str, str], where: str) -> RowSlice:
    """The ``RowSlice`` of a ``StreamingDataset`` of raw files."""
    table = getattr(dataset, "shards", None)
    if not isinstance(table, UnitTable) or table.options.key_column is not None:
        raise InputError(f"{where}: a slice of a split is taken of raw files' rows (Parquet, "
                         "JSON Lines, Arrow, numbered in their order); give shards' whole "
                         "split")
    rows = np.bincount(table.file, weights=table.samples, minlength=len(table.files))
    firsts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    total = int(rows.sum())
    return RowSlice({f.name: int(first) for f, first in zip(table.files, firsts, strict=True)},
                    bound(bounds[0], total, 0), bound(bounds[1], total, total))


def row_slices(mix, entries: list, kind: str = "datasets") -> dict:
    """Each sliced ``datasets:`` (or ``kind``) entry's ``RowSlice``, by its source's name in
    ``mix``."""
    from wdstream.integrations.axolotl_checks import label_of

    found = {}
    for index, (entry, name, dataset) in enumerate(zip(entries, mix.names, mix.datasets,
                                                       strict=True)):
        split = entry.get("split") if isinstance(entry, Mapping) else None
        where = label_of(kind, index, entry)
        bounds = split_slice(split, where)[1] if isinstance(split, str) else None
        if bounds is not None:
            found[name] = row_slice(dataset, bounds, where)
    return found
