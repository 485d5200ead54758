"""What every raw format gives the unit table: a file's units (parts with known row counts)
from what its metadata says, and a unit's rows. One class per format
(``parquet.ParquetFormat``, ``jsonl.JsonLinesFormat``, ``arrow.ArrowFormat``)."""

from __future__ import annotations

from dataclasses import dataclass

from wdstream.errors import ShardError
from wdstream.limits import Limits
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
class FileUnits:
    """A file's units and the metadata (bytes) that reading them needs."""

    units: list[Unit]
    metadata: bytes = b""


class Rows:
    """A unit's rows, read: ``len()`` and ``rows(start, stop)`` as dicts of their columns.
    A column of lists (or fixed-size lists) of integers or floats without nulls (token ids,
    labels, embeddings) is copied once into one numpy array, and each row gets a writable
    view of its part of it: no Python object per number, and the default collate stacks
    equal lengths into one tensor. The other columns become Python values as rows are
    asked for. ``nbytes``: what the rows hold in memory (Arrow's count of the table's).
    """

    def __init__(self, table):
        self.nbytes = table.nbytes
        self.arrays = {}  # column -> (its values, each row's start and end in them)
        for name, kind in zip(table.column_names, table.schema.types, strict=True):
            if _numeric_lists(kind):
                split = _flat_values(table.column(name))
                if split is not None:
                    self.arrays[name] = split
        self.table = table.drop_columns(list(self.arrays)) if self.arrays else table

    def __len__(self) -> int:
        return self.table.num_rows

    def rows(self, start: int, stop: int) -> list[dict]:
        rows = self.table.slice(start, stop - start).to_pylist()
        for name, (values, bounds) in self.arrays.items():
            ends = bounds[start:stop + 1].tolist()
            for row, first, last in zip(rows, ends[:-1], ends[1:], strict=True):
                row[name] = values[first:last]
        return rows


def _numeric_lists(kind) -> bool:
    import pyarrow.types as types

    return (types.is_list(kind) or types.is_large_list(kind)
            or types.is_fixed_size_list(kind)) and (
        types.is_integer(kind.value_type) or types.is_floating(kind.value_type))


def _flat_values(column):
    """A list column's values as one writable numpy array (one copy, whatever the number of
    chunks) and the rows' bounds in it (``len + 1`` of them); None when a row or a value is
    null (the rows are then Python lists, or None). Read from Arrow's buffers: pyarrow's
    ``flatten`` and ``to_numpy`` import ``pyarrow.compute`` and pandas, most of a DataLoader
    worker's start."""
    import numpy as np

    pieces = [_chunk_values(chunk) for chunk in column.chunks]
    if not pieces or any(piece is None for piece in pieces):
        return None
    shifts = np.cumsum([0] + [len(values) for values, _ in pieces[:-1]])
    bounds = np.concatenate([np.zeros(1, np.int64)] + [
        ends[1:] + shift for (_, ends), shift in zip(pieces, shifts, strict=True)])
    return np.concatenate([values for values, _ in pieces]), bounds


def _chunk_values(array):
    """One chunk's values as a read-only numpy view and its rows' bounds in it, from 0;
    None when a row or a value is null."""
    import numpy as np
    import pyarrow as pa

    child = array.values
    if array.null_count or child.null_count:
        return None
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        bounds = np.arange(len(array) + 1, dtype=np.int64) * size
        first = array.offset * size
    else:
        offsets = _buffer_array(array.buffers()[1], array.offsets.type,
                                array.offset, len(array) + 1)
        first = int(offsets[0])
        bounds = offsets.astype(np.int64) - first
    return _buffer_array(child.buffers()[1], child.type, child.offset + first,
                         int(bounds[-1])), bounds


_FLOATS = {"halffloat": "float16", "float": "float32", "double": "float64"}


def _buffer_array(buffer, kind, offset: int, count: int):
    """``count`` values of a primitive Arrow type from ``offset`` in ``buffer``, as a numpy
    view (read-only)."""
    import numpy as np

    dtype = np.dtype(_FLOATS.get(str(kind), str(kind)))
    if buffer is None:  # an empty array may have none
        return np.empty(0, dtype)
    return np.frombuffer(buffer, dtype, count, offset * dtype.itemsize)


class TableFormat:
    """A raw format: how its files are cut into units and those read."""

    name = ""

    def cut(self, file: RawFile, access: Access) -> FileUnits:
        raise NotImplementedError

    def columns(self, cut: FileUnits) -> list[str] | None:
        """The column names a file's metadata declares (None: known only from its rows)."""
        return None

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns: tuple[str, ...] | None,
             access: Access) -> Rows:
        raise NotImplementedError


def invalid(message: str) -> ShardError:
    """A ShardError for a raw file's bytes that were read whole and are not what they
    claim: never retried (the same bytes fail the same way)."""
    error = ShardError(message)
    error.transient = False
    return error


def limits_of(access: Access) -> Limits:
    """The ``wdstream.Limits`` reads through ``access`` honour."""
    return access.limits if access.limits is not None else Limits()


def units_from_counts(counts: list[int]) -> list[Unit]:
    """Units numbered 0, 1... of the given row counts, empty ones left out."""
    units, first = [], 0
    for part, rows in enumerate(counts):
        if rows:
            units.append(Unit(part, rows, first))
        first += rows
    return units
