"""The unit table: raw files cut into units of known row counts (Parquet row groups, Arrow
record batches, JSON Lines byte ranges or files), which the epoch plan sees as it sees
shards, and what reading unit ``i`` gives: rows as samples with ``__key__`` and ``__url__``."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np

from wdstream.errors import InputError, ShardError, WdstreamError
from wdstream.printable import printable
from wdstream.tables.arrow import ArrowFormat
from wdstream.tables.files import RawFile, listed_files
from wdstream.tables.formats import FileUnits, Rows, TableFormat, Unit, limits_of
from wdstream.tables.jsonl import JsonLinesFormat
from wdstream.tables.node_units import NodeUnits
from wdstream.tables.parquet import ParquetFormat, check_columns
from wdstream.tables.reads import Access, check_unchanged, reads_check_version
from wdstream.tables.row_range import RowRange
from wdstream.tables.unit_index import indexed_units, read_index
from wdstream.tables.unit_processes import Cutters, cpu_share, cut_in_processes

log = logging.getLogger("wdstream.dataset")  # the logger name users configure

FORMATS: dict[str, TableFormat] = {"parquet": ParquetFormat(), "jsonl": JsonLinesFormat(),
                                   "arrow": ArrowFormat()}
FILES_IN_FLIGHT = 32  # files whose metadata is read (or JSON Lines files scanned) at once
FOOTER_FORMATS = ("parquet", "arrow")  # cut from their own metadata, read by ranged GETs


@dataclass(frozen=True)
class Totals:
    """A source's rows and bytes, as a manifest's totals (the shuffle window's byte bound and
    the reader's list sizes use them)."""

    samples: int
    bytes: int


@dataclass(frozen=True)
class RawOptions:
    """What a raw source is read as: ``columns`` (None: all), the ``key_column`` whose value
    is a row's ``__key__`` (None: file and row number), the ``index`` of its JSON Lines files
    (a URL; None: they are scanned), the ``rows`` streamed (None: all)."""

    columns: tuple[str, ...] | None = None
    key_column: str | None = None
    index: str | None = None
    rows: RowRange | None = None

    @property
    def read_columns(self) -> tuple[str, ...] | None:
        if self.columns is None or self.key_column is None or self.key_column in self.columns:
            return self.columns
        return (*self.columns, self.key_column)


class UnitTable:
    """Units of raw files as arrays (file, part, end, first row, rows as cut), the files, and
    the metadata each file's units are read with. ``samples``: the rows of each unit streamed,
    after the first ``skip`` of them; all of them unless ``options.rows`` keeps a range, when
    only the units holding rows of the range are kept."""

    def __init__(self, source: str, files: Sequence[RawFile], file_units: Sequence[FileUnits],
                 options: RawOptions):
        self.source, self.files, self.options = source, tuple(files), options
        self.metadata = tuple(cut.metadata for cut in file_units)
        units = [(i, u.part, u.end, u.first_row, u.rows)
                 for i, cut in enumerate(file_units) for u in cut.units]
        if not units:
            raise ShardError(f"{printable(source)}: its files hold no rows")
        cut = np.asarray(units, dtype=np.int64).T
        self.all_rows = int(cut[4].sum())
        columns = np.vstack([cut, np.zeros_like(cut[4]), cut[4]])
        if options.rows is not None:
            columns = self._in_range(columns, options.rows)
        self.file, self.part, self.end, self.first_row, self.cut_rows, self.skip, \
            self.samples = columns

    def _in_range(self, columns: np.ndarray, rows: RowRange) -> np.ndarray:
        """The units holding rows of ``rows`` (numbered over the files in order), each with
        the rows before the range (``skip``) and after it left out of its samples."""
        start, stop = rows.rows(self.all_rows)
        ends = np.cumsum(columns[4])
        starts = ends - columns[4]
        kept = (ends > start) & (starts < stop)
        if not kept.any():
            raise InputError(f"{printable(self.source)}: rows {rows} hold none of its "
                             f"{self.all_rows:,} rows")
        columns, starts, ends = columns[:, kept], starts[kept], ends[kept]
        columns[5] = np.maximum(start - starts, 0)
        columns[6] = np.minimum(ends, stop) - starts - columns[5]
        return columns

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def urls(self) -> list[str]:
        return [self.files[i].url for i in self.file]

    @property
    def totals(self) -> Totals:
        """The rows streamed, and the files' bytes (a range's share of them)."""
        samples = int(self.samples.sum())
        return Totals(samples, sum(f.size for f in self.files) * samples // self.all_rows)

    def fingerprint(self) -> str:
        """Identifies the files as planned (names, sizes, tags), their units and rows
        streamed, and the columns."""
        digest = hashlib.sha256(json.dumps([self.options.columns, self.options.key_column]).encode())
        for f in self.files:
            digest.update(f"\n{f.name}\0{f.size}\0{f.tag}".encode())
        columns = (self.file, self.part, self.end, self.samples)
        for column in columns if self.options.rows is None else (*columns, self.skip):
            digest.update(np.ascontiguousarray(column).tobytes())
        return digest.hexdigest()[:16]

    def unit(self, index: int) -> tuple[RawFile, Unit]:
        """Unit ``index`` as cut (all its rows: they are read, and counted, whole)."""
        return self.files[int(self.file[index])], Unit(
            int(self.part[index]), int(self.cut_rows[index]), int(self.first_row[index]),
            int(self.end[index]))

    def read(self, index: int, access: Access) -> Rows:
        """Unit ``index``'s rows, from its file as planned: where the store does not check
        the planned version on each read, the file's size and tag are checked first."""
        file, unit = self.unit(index)
        if not reads_check_version(file, access):
            check_unchanged(file)
        return FORMATS[file.format].read(file, self.metadata[int(self.file[index])], unit,
                                         self.options.read_columns, access)

    def samples_of(self, index: int, rows: Rows, start: int, stop: int) -> list[dict]:
        """Samples ``start`` .. ``stop - 1`` of unit ``index`` (its rows after ``skip``)."""
        file, unit = self.unit(index)
        skip = int(self.skip[index])
        start, stop = start + skip, stop + skip
        samples = rows.rows(start, stop)
        first, url = unit.first_row + start, file.url
        keys: Iterable[str] = map(f"{file.name}:{{}}".format, range(first, first + len(samples)))
        key_column, columns = self.options.key_column, self.options.columns
        if key_column is not None:
            keys = [key if value is None else str(value)
                    for key, value in zip(keys, (s.get(key_column) for s in samples),
                                          strict=True)]
            if columns is not None and key_column not in columns:  # read for the key only
                for sample in samples:
                    del sample[key_column]
        for sample, key in zip(samples, keys, strict=True):
            sample["__key__"] = key
            sample["__url__"] = url
        return samples


def cut_files(files: Sequence[RawFile], access: Access) -> list[FileUnits]:
    """Every file's units from its metadata (or a scan), ``FILES_IN_FLIGHT`` at once."""
    unsupported = {f.format for f in files} - set(FORMATS)
    if unsupported:
        raise InputError(f"{printable(files[0].url)}: {', '.join(sorted(unsupported))} files "
                         "are not streamed where they lie (yet); pack them with `wdstream pack`")
    if not files:
        return []
    file_units: list[FileUnits | None] = [None] * len(files)
    todo = iter(range(len(files)))  # each thread takes the next file: no task per file
    failed = threading.Event()  # one file's error: the others stop at their next file

    def cut_each() -> None:
        for index in todo:
            if failed.is_set():
                return
            try:
                file_units[index] = FORMATS[files[index].format].cut(files[index], access)
            except BaseException:
                failed.set()
                raise

    threads = min(FILES_IN_FLIGHT, len(files))
    with ThreadPoolExecutor(threads) as pool:
        for running in [pool.submit(cut_each) for _ in range(threads)]:
            running.result()
    return cast(list[FileUnits], file_units)  # every file cut, or the error raised


class UnitsAhead(Cutters):
    """The Parquet and Arrow files of a remote folder cut into units while it is still listed:
    ``on_page`` takes each page of the listing as it comes; ``cut_units`` with this
    ``ahead`` waits for their units. With ``node``, only where this process leads the
    node's units of the folder (``NodeUnits.lead``)."""

    def __init__(self, folder: str, access: Access, node: NodeUnits | None = None):
        super().__init__(access, cut_files, cpu_share())
        self.folder, self.node = folder, node

    def on_page(self, entries: list[dict]) -> None:
        try:
            files = listed_files(self.folder, entries)
        except WdstreamError:  # an entry find_files reports if the folder is read as raw files
            return
        files = [f for f in files if f.format in FOOTER_FORMATS]
        if files and (self.node is None or self.node.lead()):
            self.add(files)


def cut_units(source: str, files: Sequence[RawFile], options: RawOptions,
               access: Access, ahead: Cutters | None = None,
               node: NodeUnits | None = None) -> UnitTable:
    """A ``UnitTable`` of ``files``: Parquet and Arrow files cut from their metadata, JSON
    Lines files from ``options.index``, or else from one scan of each. ``ahead``: the
    cutters some of the files were added to as they were listed (``UnitsAhead``); ``node``:
    the units the ranks of the node share (``node_units``)."""
    index = read_index(options.index) if options.index is not None else None
    file_units = node.units(files, lambda: _cut(source, files, options, access, ahead, index),
                       index[1] if index is not None else None) \
        if node is not None else _cut(source, files, options, access, ahead, index)
    named = options.read_columns or ((options.key_column,) if options.key_column else ())
    for file, cut in zip(files, file_units, strict=True):
        available = FORMATS[file.format].columns(cut) if named else None
        if available is not None:
            check_columns(file, available, named)
    return UnitTable(source, files, file_units, options)


def _described(files: Sequence[RawFile]) -> str:
    """"3 JSON Lines files", or "3 JSON Lines or JSON array files" when a name ends in
    ``.json`` (which holds either, as its scan finds)."""
    arrays = any(f.name.endswith((".json", ".json.gz", ".json.zst")) for f in files)
    kind = "JSON Lines or JSON array file" if arrays else "JSON Lines file"
    return f"{len(files)} {kind}{'s' if len(files) != 1 else ''}"


def _cut(source: str, files: Sequence[RawFile], options: RawOptions, access: Access,
           ahead: Cutters | None, index: tuple[dict, str] | None) -> list[FileUnits]:
    lines = [f for f in files if f.format == "jsonl"]
    if index is not None and options.index is not None:  # index: what options.index holds
        indexed = dict(zip(lines, indexed_units(options.index, index[0], lines,
                                                limits_of(access).unit_bytes), strict=True))
    else:
        indexed = {}
        if lines:
            log.warning("%s: counting the rows of %s (%d bytes) by reading each whole; "
                        "`wdstream index %s --output URL` records the counts once", source,
                        _described(lines), sum(f.size for f in lines), source)
    todo = [f for f in files if f not in indexed]
    cut_now = iter(ahead.units(todo) if ahead is not None and ahead.started
                   else cut_in_processes(todo, access, cut_files))
    return [indexed[f] if f in indexed else next(cut_now) for f in files]
