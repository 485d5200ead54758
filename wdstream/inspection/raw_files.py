"""Raw files (Parquet, JSON Lines, Arrow) looked at from a shell: what ``wdstream ls``,
``verify`` and ``cat`` show of a source that ``StreamingDataset`` streams where it lies."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from wdstream.errors import InputError, WdstreamError
from wdstream.stream.read.resolve import resolve_source
from wdstream.tables.jsonl import ARRAY
from wdstream.tables.reads import Access
from wdstream.tables.units import UnitTable

ROWS_AT_ONCE = 256


@dataclass
class FileSummary:
    name: str
    url: str
    format: str
    units: int
    rows: int
    bytes: int
    problem: str | None = None


def raw_units(source, opener: str | None = None) -> UnitTable:
    """The unit table ``StreamingDataset`` plans for a raw ``source`` (its files' metadata
    read, JSON Lines files scanned)."""
    table = resolve_source(source, access=Access(opener)).table
    if not isinstance(table, UnitTable):
        raise InputError(f"{source}: shards, not raw files")
    return table


def summarize(table: UnitTable) -> list[FileSummary]:
    """Per file: its format ("json" for a JSON array, read as JSON Lines are), units, rows
    and bytes."""
    found = [FileSummary(f.name, f.url, "json" if metadata == ARRAY else f.format, 0, 0, f.size)
             for f, metadata in zip(table.files, table.metadata, strict=True)]
    for file, rows in zip(table.file.tolist(), table.samples.tolist(), strict=True):
        found[file].units += 1
        found[file].rows += rows
    return found


def summary_dict(source: str, files: list[FileSummary]) -> dict:
    """What ``wdstream ls --json`` prints for raw files."""
    return {"source": source, "how": "raw files", "files": len(files),
            "units": sum(f.units for f in files), "samples": sum(f.rows for f in files),
            "bytes": sum(f.bytes for f in files), "formats": sorted({f.format for f in files}),
            "shards": [asdict(f) for f in files]}


def check_units(table: UnitTable, workers: int = 8, opener: str | None = None,
                progress: Callable[[int], object] | None = None) -> list[FileSummary]:
    """Read every unit whole (each file checked unchanged, every row parsed, the counts
    compared with the plan's), ``workers`` at a time; per file, the first problem found."""
    summaries = summarize(table)
    access = Access(opener)

    def check(index: int) -> tuple[int, str | None]:
        try:
            rows = table.read(index, access)
            for start in range(0, len(rows), ROWS_AT_ONCE):
                rows.rows(start, min(len(rows), start + ROWS_AT_ONCE))
        except WdstreamError as error:
            return index, str(error)
        return index, None

    with ThreadPoolExecutor(max(1, workers)) as pool:
        for index, problem in pool.map(check, range(len(table))):
            summary = summaries[int(table.file[index])]
            if problem is not None and summary.problem is None:
                summary.problem = problem
            if progress is not None:
                progress(summary.bytes // max(1, summary.units))
    return summaries


def iter_rows(table: UnitTable, *, key: str | None = None, limit: int | None = None,
              opener: str | None = None) -> Iterator[dict]:
    """The samples in file order (unit by unit, no shuffling); ``key``: only the first
    sample with that key (InputError if none has it); ``limit``: at most that many."""
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    access, given = Access(opener), 0
    for index in range(len(table)):
        rows, start = table.read(index, access), 0
        while start < len(rows):
            step = ROWS_AT_ONCE if limit is None else min(ROWS_AT_ONCE, limit - given)
            if step <= 0:
                return  # rows after the last one shown are not parsed
            for sample in table.samples_of(index, rows, start, min(len(rows), start + step)):
                if key is None or sample["__key__"] == key:
                    yield sample
                    given += 1
                    if key is not None:
                        return
            start += step
    if key is not None:
        raise InputError(f"{table.source}: no row with key {key!r} in "
                         f"{int(table.samples.sum()):,} rows")


def row_to_json(sample: dict, *, fields: Sequence[str] | None = None,
                base64_bytes: bool = False) -> dict:
    """A row as ``wdstream cat`` prints it: its columns (``fields``: only those, with
    ``__key__``), ``bytes`` values as their size or, with ``base64_bytes``, their bytes,
    numpy arrays (list columns of numbers) as lists."""
    shown = {}
    for name, value in sample.items():
        if fields is not None and name != "__key__" and name not in fields:
            continue
        if isinstance(value, bytes):
            value = {"base64": base64.b64encode(value).decode("ascii")} if base64_bytes \
                else {"bytes": len(value)}
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        shown[name] = value
    return shown
