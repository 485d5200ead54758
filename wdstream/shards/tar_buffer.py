"""The buffer the tar reader parses from: large reads of a shard stream, payloads cut from them.

Slicing payloads out of large reads is several times faster than many small ``read()`` calls.
A payload the buffer holds only part of is joined once from the pieces as read, read whole
where the stream can seek (a local file), read straight into memory a caller provides, or left
in a local file unread. A stream of known length is never read past it.
"""

from __future__ import annotations

from typing import BinaryIO, cast

from wdstream.errors import ShardError, ShardMismatchError

READ_SIZE = 1 << 20  # large reads: slicing from a buffer beats many small read() calls
MAX_READ = 1 << 26  # one read's cap, however large the member (or a corrupt size field)
EXACT_READ = 1 << 17  # payloads from this size on are read whole where the stream can seek
TARGET_READ = 1 << 15  # payloads from this size on are offered to a payload target (shared
# memory, a local file left in place): from 32 KiB that beats pickling them through a worker's
# pipe (docs/benchmarks.md)
_READ_AFTER_EXACT = 1 << 13  # the read after one: mostly the next header (the rest is re-read)
DRAIN_MAX = 1 << 20  # read after the end marker when the shard's length is unknown (GNU tar
# pads to 10 KiB records)


class TarBuffer:
    """Bytes of ``stream`` read ahead for a parser: ``_data[_pos:]`` is not parsed yet,
    ``offset`` counts the bytes consumed so far."""

    def __init__(self, stream: BinaryIO, url: str, limit: int | None = None):
        self.url = url
        self._limit = limit  # the stream's length when known: a byte beyond it is an error
        self._readinto = getattr(stream, "readinto", None)
        self._region = getattr(stream, "region", None)  # a local file's: see _skip
        # read1 where there is one: it hands over a stream's chunk as it is (one lent by the
        # source, copied once), without waiting for more (read(n) of a ReadAheadBody joins
        # chunks to give exactly n bytes).
        self._read = getattr(stream, "read1", None) or stream.read
        self._end = 0  # stream position after the last byte read
        if limit is not None:
            self._raw_read, self._read = self._read, self._bounded_read
        # A seekable stream (a local file) gives a large payload in one exact read.
        seekable = getattr(stream, "seekable", None)
        self._stream = stream if seekable is not None and seekable() else None
        self._data = b""  # buffered bytes; _data[_pos:] not yet parsed
        self._pos = 0
        self._base = 0  # stream offset of _data[0]
        self._read_size = READ_SIZE  # of the next fill; small after an exact payload read

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def _bounded_read(self, n: int) -> bytes:
        """``read`` when the stream's length is known: never asks beyond one byte past it."""
        limit = cast(int, self._limit)  # this read is used only when the length is known
        chunk = self._raw_read(max(1, min(n, limit + 1 - self._end)))
        self._end += len(chunk)
        if self._end > limit:
            raise ShardMismatchError(f"{self.url}: the stream goes on past the {self._limit} "
                                     f"bytes recorded for it")
        return chunk

    def _fill(self, need: int) -> bool:
        """Make at least ``need`` unparsed bytes available; False if the stream ends first."""
        rest = len(self._data) - self._pos
        read = self._read
        read_size = self._read_size
        if read_size < READ_SIZE:  # grows back while members are small
            self._read_size = read_size * 2
        if rest == 0:  # the common case: nothing left over, no join
            chunk = read(min(max(read_size, need), MAX_READ))
            if type(chunk) is not bytes:
                chunk = bytes(chunk)  # payloads are bytes, whatever the stream returns
            self._base += self._pos
            self._data, self._pos = chunk, 0
            if len(chunk) >= need or not chunk:
                return len(chunk) >= need
            rest = len(chunk)
        parts: list[bytes | memoryview] = [memoryview(self._data)[self._pos :]]
        have = rest
        while have < need:
            # only what is missing (the rest of a header): a large read joined to the rest
            # would be copied whole; the next fill reads large again, with nothing to join
            chunk = read(min(need - have, MAX_READ))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        self._base += self._pos
        self._data = b"".join(parts)
        self._pos = 0
        return have >= need

    def _gather(self, start: int, size: int, padded: int, into=None, region=None):
        """The payload of ``size`` bytes at ``_data[start:]``, which the buffer holds only
        part of, with its padding (``padded`` bytes in all) consumed; None if the stream ends
        first. The payload is joined once from the pieces as read (no join of the buffer with
        each new read, no slicing afterwards), and the last piece becomes the buffer; or read
        into the memory of ``into``, ``(payload, memory)`` from the payload target, or left
        in the file (``memory`` None)."""
        if into is not None:
            if into[1] is None:
                return self._skip(start, padded, into[0], region)
            return self._read_into(start, size, padded, *into)
        if self._stream is not None and EXACT_READ <= size <= MAX_READ:
            return self._read_exact(start, size, padded)
        data = self._data
        read = self._read
        parts: list[bytes | memoryview] = [memoryview(data)[start:]] if start < len(data) else []
        have = len(data) - start
        base = self._base + len(data)  # stream offset of the next piece read
        chunk = data
        while have < padded:
            chunk = read(min(max(READ_SIZE, padded - have), MAX_READ))
            if not chunk:
                self._base, self._data, self._pos = base, b"", 0  # offset: all that was read
                return None
            if type(chunk) is not bytes:
                chunk = bytes(chunk)  # it may become the buffer, sliced into payloads
            parts.append(chunk)
            have += len(chunk)
            base += len(chunk)
        self._base = base - len(chunk)
        self._data, self._pos = chunk, len(chunk) - (have - padded)
        excess = have - size  # bytes of padding and beyond, at the end of the parts
        while excess:
            last = parts[-1]
            if len(last) <= excess:
                parts.pop()
                excess -= len(last)
            else:
                parts[-1] = memoryview(last)[: len(last) - excess]
                excess = 0
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]  # a read that was exactly the payload
        return b"".join(parts)

    def _read_exact(self, start: int, size: int, padded: int) -> bytes | None:
        """``_gather`` on a seekable stream: seek back to the payload and read it whole. The
        next fill is then small: a large read would mostly fetch the next payload twice."""
        offset = self._base + start  # the payload's stream offset
        self._read_size = _READ_AFTER_EXACT
        stream = cast(BinaryIO, self._stream)  # _gather reads exactly only a seekable stream
        stream.seek(offset)
        payload = stream.read(size)
        if len(payload) == size and padded > size:
            padding = stream.read(padded - size)
            end = offset + size + len(padding)
        else:
            end = offset + len(payload)
        self._base, self._data, self._pos = end, b"", 0
        self._end = end
        return payload if end == offset + padded else None

    def _skip(self, start: int, padded: int, payload, region):
        """A payload the target takes where it lies in a local file (``region``, from the
        stream's ``region``): seek past it and its padding; None when the file ends first."""
        offset = self._base + start
        end = offset + min(padded, region[2] - region[1])  # not past the end of the file
        cast(BinaryIO, self._stream).seek(end)  # a region is a seekable local file's
        self._base, self._data, self._pos = end, b"", 0
        self._end = end
        self._read_size = _READ_AFTER_EXACT
        return payload if end == offset + padded else None

    def _read_into(self, start: int, size: int, padded: int, payload, memory: memoryview):
        """``_gather`` into ``memory``: the part already buffered is copied, the rest read
        straight into it, then the padding is consumed; ``payload`` or None."""
        data = self._data
        have = min(max(len(data) - start, 0), size)
        memory[:have] = memoryview(data)[start : start + have]
        offset = self._base + start + have  # stream offset of the next byte to read
        read, readinto = self._read, self._readinto
        while have < size:
            if readinto is not None:
                count = readinto(memory[have:])
            else:
                chunk = read(min(size - have, MAX_READ))
                count = len(chunk)
                memory[have : have + count] = chunk
            if not count:
                break
            have += count
            offset += count
        padding = padded - max(size, len(data) - start)  # still to read
        self._end = max(self._end, offset)
        while have == size and padding > 0:
            count = len(read(padding))
            if not count:
                break
            padding -= count
            offset += count
        self._base, self._data, self._pos = offset, b"", 0
        self._read_size = _READ_AFTER_EXACT
        return payload if have == size and padding <= 0 else None

    def _error(self, message: str, at: int) -> ShardError:
        return ShardError(f"{self.url}: {message} at byte {at}")

    def _drain(self) -> None:
        """Read the rest of the stream so that ``offset`` counts every byte: up to the known
        length (a byte more is an error), else at most ``DRAIN_MAX`` bytes."""
        self._base += len(self._data)
        self._data, self._pos = b"", 0
        read = self._read
        budget = DRAIN_MAX if self._limit is None else None
        while chunk := read(READ_SIZE if budget is None else min(READ_SIZE, budget + 1)):
            self._base += len(chunk)
            if budget is not None:
                budget -= len(chunk)
                if budget < 0:
                    raise ShardMismatchError(f"{self.url}: the stream goes on for more than "
                                             f"{DRAIN_MAX} bytes after the end-of-archive marker")
