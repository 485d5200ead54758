"""Arrow IPC files (``.arrow``: the stream format ``datasets.Dataset.save_to_disk`` writes, or
the file format): runs of consecutive record batches of about ``RANGE_BYTES`` are the units.
Their row counts come from one scan of each file when the dataset is built, message by
message (one held at a time); a unit is read as one byte range, after the schema's bytes."""

from __future__ import annotations

from wdstream.errors import ShardError
from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import (
    MAX_METADATA_BYTES,
    MAX_UNIT_BYTES,
    FilePlan,
    Rows,
    TableFormat,
    Unit,
)
from wdstream.tables.reads import Access, open_file, read_range

FILE_MAGIC = b"ARROW1"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
RANGE_BYTES = 32 * 1024**2  # a unit: consecutive record batches of about this size


class ArrowFormat(TableFormat):
    name = "arrow"

    def plan(self, file: RawFile, access: Access) -> FilePlan:
        """One scan of the file's messages: the schema's bytes, and the batches' ranges."""
        import pyarrow as pa

        stream = open_file(file, access)
        try:
            counted = _Counted(stream)
            start = len(FILE_MAGIC) + 2 if counted.peek_magic() else 0
            messages = pa.ipc.MessageReader.open_stream(pa.PythonFile(counted, mode="r"))
            return _plan_messages(file, messages, counted, start)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError
            raise ShardError(f"{printable(file.url)}: not a readable Arrow IPC file: {exc}"
                             ) from None
        finally:
            stream.close()

    def columns(self, plan: FilePlan) -> list[str] | None:
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(plan.metadata)).names

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns, access: Access) -> Rows:
        import pyarrow as pa

        data = metadata + read_range(file, unit.part, unit.end - unit.part, access)
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data + END_OF_STREAM)).read_all()
        except (OSError, ValueError) as exc:
            raise ShardError(f"{printable(file.url)}: bytes {unit.part}..{unit.end} cannot be "
                             f"read as record batches: {exc}") from None
        if table.num_rows != unit.rows:
            raise ShardError(f"{printable(file.url)}: bytes {unit.part}..{unit.end} hold "
                             f"{table.num_rows} rows; {unit.rows} were counted")
        return Rows(table.select(list(columns)) if columns else table)


def _plan_messages(file: RawFile, messages, counted, start: int) -> FilePlan:
    import pyarrow as pa

    messages = iter(messages)
    schema_message = next(messages, None)
    if schema_message is None or schema_message.type != "schema":
        raise ShardError(f"{printable(file.url)}: does not start with an Arrow schema")
    schema = pa.ipc.read_schema(schema_message)
    head_end, counted.keep = counted.position, False
    if head_end - start > MAX_METADATA_BYTES:
        raise ShardError(f"{printable(file.url)}: a schema of {head_end - start} bytes (at most "
                         f"{MAX_METADATA_BYTES})")
    units: list[Unit] = []
    unit_start, at, rows, first = head_end, head_end, 0, 0
    for message in messages:
        if message.type != "record batch":
            raise ShardError(f"{printable(file.url)}: a {message.type} message at byte {at} "
                             "(only record batches are streamed; pack this file instead)")
        rows += pa.ipc.read_record_batch(message, schema).num_rows
        at = counted.position
        if at - unit_start > MAX_UNIT_BYTES:
            raise ShardError(f"{printable(file.url)}: a record batch of more than "
                             f"{MAX_UNIT_BYTES} bytes at byte {unit_start}")
        if at - unit_start >= RANGE_BYTES:
            units.append(Unit(unit_start, rows, first, at))
            unit_start, first, rows = at, first + rows, 0
    if rows:
        units.append(Unit(unit_start, rows, first, at))
    return FilePlan(units, counted.head[start:head_end])


class _Counted:
    """A read stream that counts the bytes read and keeps the first ones (at most
    ``MAX_METADATA_BYTES``) until told to stop: the schema's bytes are among them."""

    def __init__(self, stream):
        self.stream, self.position, self.head = stream, 0, b""
        self.keep = True  # the first bytes, up to the schema's end
        self._pending = b""  # read ahead by peek_magic, not consumed
        self.closed = False

    def peek_magic(self) -> bool:
        """Whether the file is in the IPC file format (``ARROW1`` and 2 bytes of padding
        before the stream), those bytes consumed if so; otherwise nothing is consumed."""
        first = self._read(len(FILE_MAGIC) + 2)
        self._pending = b"" if first.startswith(FILE_MAGIC) else first
        return not self._pending

    def read(self, n: int = -1) -> bytes:
        if not self._pending:
            return self._read(n)
        size = len(self._pending) if n < 0 else min(n, len(self._pending))
        data, self._pending = self._pending[:size], self._pending[size:]
        return data + (self._read(n - size) if n < 0 or n > size else b"")

    def _read(self, n: int) -> bytes:
        data = self.stream.read(n)
        if self.keep and len(self.head) < MAX_METADATA_BYTES:
            self.head += data[:MAX_METADATA_BYTES - len(self.head)]
        self.position += len(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
