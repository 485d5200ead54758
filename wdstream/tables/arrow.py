"""Arrow IPC files (``.arrow``: the stream format ``datasets.Dataset.save_to_disk`` writes, or
the file format): runs of consecutive record batches of about ``RANGE_BYTES`` are the units.
Their row counts come from one scan of each file when the dataset is built, message by
message (one held at a time), from the messages' headers alone: nothing is decompressed or
decoded to count. A unit is read as one byte range, after the schema's bytes.

What a file claims is checked before it is believed: a record batch's rows against the bytes
that could hold them (a row takes at least a bit), and what its buffers take decoded (the
uncompressed length before each compressed buffer, or the buffer's own) against
``Limits.unit_bytes``, when cut into units and again before a unit's batches are decompressed; each
batch read is then fully validated (offsets, sizes, UTF-8) before a row is made from it.
Any of these is a ShardError naming the file and the batch's byte."""

from __future__ import annotations

from typing import NamedTuple

from wdstream.errors import LimitError, ShardError
from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import (
    MAX_METADATA_BYTES,
    MAX_UNIT_BYTES,
    MAX_UNIT_ROWS,
    FileUnits,
    Rows,
    TableFormat,
    Unit,
    invalid,
    limits_of,
)
from wdstream.tables.reads import Access, open_file, read_range

FILE_MAGIC = b"ARROW1"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
RANGE_BYTES = 32 * 1024**2  # a unit: consecutive record batches of about this size


class ArrowFormat(TableFormat):
    name = "arrow"

    def cut(self, file: RawFile, access: Access) -> FileUnits:
        """One scan of the file's messages: the schema's bytes, and the batches' ranges."""
        import pyarrow as pa

        body = open_file(file, access)
        try:
            counted = _Counted(body)
            start = len(FILE_MAGIC) + 2 if counted.peek_magic() else 0
            messages = pa.ipc.MessageReader.open_stream(pa.PythonFile(counted, mode="r"))
            return _cut_messages(file, messages, counted, start, limits_of(access).unit_bytes)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError
            raise ShardError(f"{printable(file.url)}: not a readable Arrow IPC file: {exc}"
                             ) from None
        finally:
            body.close()

    def columns(self, cut: FileUnits) -> list[str] | None:
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(cut.metadata)).names

    def read(self, file: RawFile, metadata: bytes, unit: Unit, columns, access: Access) -> Rows:
        import pyarrow as pa

        data = metadata + read_range(file, unit.part, unit.end - unit.part, access)
        starts = check_unit(file, data, len(metadata), unit, limits_of(access).unit_bytes)
        batches = []
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(data + END_OF_STREAM))
            for batch in reader:
                batch.validate(full=True)
                batches.append(batch)
            table = pa.Table.from_batches(batches, reader.schema)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError
            at = starts[min(len(batches), len(starts) - 1)] if starts else unit.part
            raise invalid(f"{printable(file.url)}: the record batch at byte {at} is not valid "
                          f"Arrow: {exc}") from None
        if table.num_rows != unit.rows:
            raise invalid(f"{printable(file.url)}: bytes {unit.part}..{unit.end} hold "
                             f"{table.num_rows} rows; {unit.rows} were counted")
        return Rows(table.select(list(columns)) if columns else table)


def _cut_messages(file: RawFile, messages, counted, start: int, most: int) -> FileUnits:
    import pyarrow as pa

    messages = iter(messages)
    schema_message = next(messages, None)
    if schema_message is None or schema_message.type != "schema":
        raise ShardError(f"{printable(file.url)}: does not start with an Arrow schema")
    pa.ipc.read_schema(schema_message)
    head_end, counted.keep = counted.position, False
    if head_end - start > MAX_METADATA_BYTES:
        raise ShardError(f"{printable(file.url)}: a schema of {head_end - start} bytes (at most "
                         f"{MAX_METADATA_BYTES})")
    units: list[Unit] = []
    unit_start, at, rows, first, decoded = head_end, head_end, 0, 0, 0
    for message in messages:
        if message.type != "record batch":
            raise ShardError(f"{printable(file.url)}: a {message.type} message at byte {at} "
                             "(only record batches are streamed; pack this file instead)")
        batch = checked_batch(file, at, message.metadata, message.body or b"", most)
        rows, decoded, at = rows + batch.rows, decoded + batch.decoded, counted.position
        if at - unit_start > MAX_UNIT_BYTES:
            raise ShardError(f"{printable(file.url)}: a record batch of more than "
                             f"{MAX_UNIT_BYTES} bytes at byte {unit_start}")
        if max(at - unit_start, decoded) >= RANGE_BYTES:
            units.append(Unit(unit_start, rows, first, at))
            unit_start, first, rows, decoded = at, first + rows, 0, 0
    if rows:
        units.append(Unit(unit_start, rows, first, at))
    return FileUnits(units, counted.head[start:head_end])


class Batch(NamedTuple):
    """What a record batch's header declares: its rows and the bytes its buffers take
    decoded (decompressed)."""

    rows: int
    decoded: int


def checked_batch(file: RawFile, at: int, header, body, most: int) -> Batch:
    """The record batch at byte ``at`` of ``file`` from its message's ``header`` (the
    flatbuffer) and ``body`` (bytes-like; the compressed buffers' uncompressed lengths are
    read from it, nothing is decompressed); a ShardError for a header that cannot be read, a
    buffer outside the body, rows that its bytes cannot hold, and a LimitError for more than
    ``most`` bytes decoded."""
    where = f"{printable(file.url)}: the record batch at byte {at}"
    try:
        rows, buffers, compressed = batch_header(bytes(header))
        decoded = sum(_decoded(body, offset, length, compressed) for offset, length in buffers)
    except (ValueError, IndexError) as exc:
        raise invalid(f"{where}: its header cannot be read ({exc})") from None
    if not 0 <= rows <= MAX_UNIT_ROWS or rows > 8 * decoded:
        raise invalid(f"{where} claims {rows} rows; its buffers hold {decoded} bytes "
                         "decoded (a row takes at least a bit)")
    if decoded > most:
        raise LimitError(f"{where} takes {decoded:,} bytes decoded, more than {most:,} (the "
                         "limit unit_bytes of wdstream.Limits)")
    return Batch(rows, decoded)


def _decoded(body, offset: int, length: int, compressed: bool) -> int:
    """What one buffer takes decoded: its length, or for a compressed one the uncompressed
    length its first 8 bytes give (-1: stored uncompressed after them)."""
    if offset < 0 or length < 0 or offset + length > len(body):
        raise ValueError(f"a buffer at {offset}..{offset + length} outside the body of "
                         f"{len(body)} bytes")
    if not compressed or length == 0:
        return length
    if length < 8:
        raise ValueError("a compressed buffer shorter than its length prefix")
    size = int.from_bytes(bytes(body[offset:offset + 8]), "little", signed=True)
    if size < -1:
        raise ValueError(f"a compressed buffer claims {size} bytes")
    return length - 8 if size == -1 else size


def check_unit(file: RawFile, data: bytes, start: int, unit: Unit, most: int) -> list[int]:
    """Every record batch's header in ``data`` (a unit's bytes from ``start``, after the
    schema's) checked as when cut, before any is decompressed: the unit's decoded bytes
    at most ``most``. Where in the file each batch starts."""
    view, pos, decoded, starts = memoryview(data), start, 0, []
    while pos < len(data):
        at = unit.part + pos - start
        starts.append(at)
        try:
            header, body_start, body_end = _message_at(view, pos)
        except (ValueError, IndexError) as exc:
            raise invalid(f"{printable(file.url)}: the message at byte {at} cannot be read "
                          f"({exc})") from None
        decoded += checked_batch(file, at, header, view[body_start:body_end], most).decoded
        if decoded > most:
            raise LimitError(f"{printable(file.url)}: bytes {unit.part}..{unit.end} take more "
                             f"than {most:,} bytes decoded (the limit unit_bytes of "
                             "wdstream.Limits)")
        pos = body_end
    return starts


def _message_at(view: memoryview, pos: int) -> tuple[memoryview, int, int]:
    """The flatbuffer header of the IPC message at ``pos`` and its body's bounds."""
    length = int.from_bytes(view[pos:pos + 4], "little", signed=True)
    pos += 4
    if length == -1:  # the continuation marker, then the length
        length = int.from_bytes(view[pos:pos + 4], "little", signed=True)
        pos += 4
    if length <= 0 or pos + length > len(view):
        raise ValueError(f"a header of {length} bytes")
    header = view[pos:pos + length]
    body_start = pos + length
    body_end = body_start + message_body_length(header)
    if body_end > len(view):
        raise ValueError("a body past the unit's end")
    return header, body_start, body_end


# ---- the flatbuffers of IPC message headers (format/Message.fbs), read without a library --

_RECORD_BATCH = 3  # MessageHeader's union type of a RecordBatch


def _table(data: bytes, pos: int) -> tuple[int, int, int]:
    """A flatbuffer table at ``pos``: ``(pos, its vtable's position, the vtable's size)``."""
    vtable = pos - int.from_bytes(data[pos:pos + 4], "little", signed=True)
    if not 0 <= vtable <= len(data) - 4 or not 0 <= pos <= len(data) - 4:
        raise ValueError("a table outside the header")
    return pos, vtable, int.from_bytes(data[vtable:vtable + 2], "little")


def _field(data: bytes, table: tuple[int, int, int], index: int) -> int | None:
    """The position of field ``index`` of ``table``, None when absent."""
    pos, vtable, size = table
    if 4 + 2 * index + 2 > size:
        return None
    offset = int.from_bytes(data[vtable + 4 + 2 * index:vtable + 6 + 2 * index], "little")
    if not offset:
        return None
    if pos + offset >= len(data):
        raise ValueError("a field outside the header")
    return pos + offset


def _scalar(data: bytes, table, index: int, size: int, default: int = 0) -> int:
    at = _field(data, table, index)
    if at is None:
        return default
    if at + size > len(data):
        raise ValueError("a field outside the header")
    return int.from_bytes(data[at:at + size], "little", signed=True)


def _offset(data: bytes, table, index: int) -> int | None:
    """Where the table or vector field ``index`` points to, None when absent."""
    at = _field(data, table, index)
    return None if at is None else at + int.from_bytes(data[at:at + 4], "little")


def _message(data: bytes) -> tuple[int, int, int]:
    if len(data) < 8:
        raise ValueError("a header too short")
    return _table(data, int.from_bytes(data[:4], "little"))


def message_body_length(header) -> int:
    """The body's length an IPC message's header declares."""
    data = bytes(header)
    length = _scalar(data, _message(data), 3, 8)
    if length < 0:
        raise ValueError(f"a body of {length} bytes")
    return length


def batch_header(data: bytes) -> tuple[int, list[tuple[int, int]], bool]:
    """``(rows, [(offset, length)] of each buffer, whether buffers are compressed)`` of a
    record batch message's header."""
    message = _message(data)
    if _scalar(data, message, 1, 1) != _RECORD_BATCH:
        raise ValueError("not a record batch")
    at = _offset(data, message, 2)
    if at is None:
        raise ValueError("no record batch header")
    batch = _table(data, at)
    rows = _scalar(data, batch, 0, 8)
    buffers = []
    vector = _offset(data, batch, 2)
    if vector is not None:
        count = int.from_bytes(data[vector:vector + 4], "little")
        if vector + 4 + 16 * count > len(data):
            raise ValueError("buffers outside the header")
        for i in range(vector + 4, vector + 4 + 16 * count, 16):
            buffers.append((int.from_bytes(data[i:i + 8], "little", signed=True),
                            int.from_bytes(data[i + 8:i + 16], "little", signed=True)))
    return rows, buffers, _offset(data, batch, 3) is not None


class _Counted:
    """A body that counts the bytes read and keeps the first ones (at most
    ``MAX_METADATA_BYTES``) until told to stop: the schema's bytes are among them."""

    def __init__(self, body):
        self.body, self.position, self.head = body, 0, b""
        self.keep = True  # the first bytes, up to the schema's end
        self._pending = b""  # read ahead by peek_magic, not consumed
        self.closed = False

    def peek_magic(self) -> bool:
        """Whether the file is in the IPC file format (``ARROW1`` and 2 bytes of padding
        before the body), those bytes consumed if so; otherwise nothing is consumed."""
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
        data = self.body.read(n)
        if self.keep and len(self.head) < MAX_METADATA_BYTES:
            self.head += data[:MAX_METADATA_BYTES - len(self.head)]
        self.position += len(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
