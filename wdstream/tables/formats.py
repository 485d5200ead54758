"""What every raw format gives the unit table: a file's units (parts with known row counts)
from what its metadata says, and a unit's rows. One class per format
(``parquet.ParquetFormat``, ``jsonl.JsonLinesFormat``, ``arrow.ArrowFormat``)."""

from __future__ import annotations

from dataclasses import dataclass

from wdstream.tables.files import RawFile
from wdstream.tables.reads import Access

MAX_UNIT_ROWS = 2**31 - 1  # rows a unit may claim
MAX_UNIT_BYTES = 2 * 1024**3  # bytes of a unit's columns held at once, as stored or decoded
MAX_METADATA_BYTES = 64 * 1024**2  # a footer's or a schema's bytes


@dataclass(frozen=True)
class Unit:
    """Rows ``first_row`` .. ``first_row + rows - 1`` of a file: ``part`` is a Parquet row
    group's or an Arrow record batch's number, or a JSON Lines range's first byte (``end``
    its end; 0 for the others)."""

    part: int
    rows: int
    first_row: int
    end: int = 0


@dataclass(frozen=True)
class FilePlan:
    """A file's units and the metadata (bytes) that reading them needs."""

    units: list[Unit]
    metadata: bytes = b""


class Rows:
    """A unit's rows, read: ``len()`` and ``rows(start, stop)`` as dicts of their columns.
    A column of lists of numbers (token ids, embeddings) gives each row a numpy array, views
    of one copy of the rows' values: no Python object per number, and the default collate
    stacks equal lengths into one tensor."""

    def __init__(self, table):
        self.table = table  # a pyarrow Table

    def __len__(self) -> int:
        return self.table.num_rows

    def rows(self, start: int, stop: int) -> list[dict]:
        part = self.table.slice(start, stop - start)
        arrays = [name for name, kind in zip(part.column_names, part.schema.types, strict=True)
                  if _numeric_lists(kind)]
        rows = (part.drop_columns(arrays) if arrays else part).to_pylist()
        for name in arrays:
            for row, value in zip(rows, _row_arrays(part.column(name)), strict=True):
                row[name] = value
        return rows


def _numeric_lists(kind) -> bool:
    import pyarrow.types as types

    return (types.is_list(kind) or types.is_large_list(kind)) and (
        types.is_integer(kind.value_type) or types.is_floating(kind.value_type))


def _row_arrays(column) -> list:
    """Each row's list as a writable numpy array (a view of one copy of the values); the
    rows as Python lists when a row or a value is null."""
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if array.null_count or values.null_count:
        return array.to_pylist()
    flat = values.to_numpy(zero_copy_only=False, writable=True)
    ends = (offsets - offsets[0]).tolist()
    return [flat[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]


class TableFormat:
    """A raw format: how its files are planned and its units read."""

    name = ""

    def plan(self, file: RawFile, access: Access) -> FilePlan:
        raise NotImplementedError

    def columns(self, plan: FilePlan) -> list[str] | None:
        """The column names a file's metadata declares (None: known only from its rows)."""
        return None

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns: tuple[str, ...] | None,
             access: Access) -> Rows:
        raise NotImplementedError


def units_from_counts(counts: list[int]) -> list[Unit]:
    """Units numbered 0, 1... of the given row counts, empty ones left out."""
    units, first = [], 0
    for part, rows in enumerate(counts):
        if rows:
            units.append(Unit(part, rows, first))
        first += rows
    return units
