"""Bodies, the bytes of an object or file as they are read: a ``ReadAheadBody`` filled by a
background thread from a ``BodySource``, and a ``LocalBody`` read in the caller's thread.
``wdstream.sources.openers.open_read`` makes them.

How a body is read
    A ReadAheadBody's background thread reads the source in chunks of up to 1 MiB into a buffer
    holding up to 8 MiB, so opening the next shard while the current one is parsed prefetches
    it for free. ``read()`` waits at most ``timeout`` seconds for the next chunk; a longer stall
    raises ``StreamError(transient=True)`` and stops the source. Opening does no data I/O: a
    missing object or a refused connection is raised by the first ``read()``.
    A local file needs no thread (the page cache reads ahead): it is read in the caller's
    thread, is seekable (the tar reader reads a large payload whole, in one copy), and a
    missing file is raised when it is opened.

Chunks a source reads into buffers of its own
    A chunk is ``bytes``, or a ``memoryview`` of a buffer the source lent (the ranged reader
    reads into reused buffers: a buffer fresh from the allocator costs the kernel the zeroing
    of its pages, on every chunk, at the first byte written). The body copies a lent chunk
    out (``readinto``, or ``bytes`` for ``read``) and gives its buffer back to the source
    (``recycle``) once it moves past it (a ``read`` that gathered more than
    ``RECYCLED_PER_READ``, a whole object, lets them go); a chunk never leaves the body
    otherwise.

How a body ends
    ``read()`` returns ``b""`` at the end. ``close()`` then checks how a command (``pipe:`` or a
    CLI) ended: a non-zero exit status raises ``StreamError`` with the tail of its stderr, also
    when the failure came after all the data was written (a truncated shard that happens to end
    on a sample boundary is only visible this way). A consumer that stops within
    ``DRAIN_BYTES`` of the end (a tar reader at the end-of-archive marker, before the padding)
    gets the same check: ``close()`` drops the rest and waits up to ``DRAIN_SECONDS`` for the
    command to end by itself. Closing earlier than that stops the command (its whole process
    group, so ``pipe:a | b`` leaves nothing behind) and raises nothing: an early close is not
    an error.
"""

from __future__ import annotations

import abc
import collections
import io
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable

from wdstream.errors import StreamError, WdstreamError
from wdstream.sources.failures import stream_error

CHUNK_SIZE = 1 << 20  # largest piece the reader thread hands over
READ_AHEAD = 8 << 20  # bytes the reader thread may get ahead of the consumer (its figures:
# docs/decisions.md)
RECYCLED_PER_READ = 4  # lent chunks one read(n) gives back; more (a whole object, a
# manifest) go to the allocator rather than fill a pool that a body's reads would not use
DRAIN_BYTES = 64 << 10  # unread bytes a close may drop to reach a command's end (tar padding
DRAIN_SECONDS = 2.0  # is at most 10 KiB) and how long it waits for that end


class BodySource(abc.ABC):
    """What a ReadAheadBody reads: ``run`` produces chunks in the reader thread."""

    start = 0
    # True when, once stopped, run() returns at once (a killed process, a local file): close()
    # then waits for the reader thread. A network read instead ends by itself within the
    # client's read timeout, and close() does not wait for it.
    stops_promptly = False
    has_exit_status = False  # True: check_end() has something to check

    @abc.abstractmethod
    def run(self, put: Callable[[bytes], bool]) -> None:
        """Pass chunks to ``put`` until the end; return early when ``put`` returns False."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Make ``run`` return soon (called from the consumer's thread)."""

    def reading(self) -> None:  # noqa: B027 - optional hook
        """The consumer asked for data for the first time (called once, from its thread)."""

    def recycle(self, chunk: memoryview) -> None:  # noqa: B027 - optional hook
        """The consumer is done with ``chunk``, a view of a buffer this source lent (its
        bytes were copied out): the source may read into that buffer again."""

    def check_end(self, timeout: float) -> None:  # noqa: B027 - optional hook
        """After ``run`` returned by itself: raise StreamError if the source failed."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """Free what the source holds (processes, threads); called once, last."""



_POPULATED = getattr(mmap, "MAP_POPULATE", 0)  # Linux
_BUFFER_TYPE = mmap.mmap if _POPULATED else bytearray


def new_buffer(size: int) -> bytearray | mmap.mmap:
    """``size`` writable bytes for reads to fill. On Linux, anonymous memory whose pages the
    kernel maps at once (``MAP_POPULATE``), zeroed once, where a ``bytearray`` is zeroed twice
    (the kernel's fault of each page, then its own fill) and faults page by page."""
    if not _POPULATED:
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATED)


class BufferPool:
    """Buffers of ``size`` bytes that a process's reads fill again and again. A buffer given
    back waits for the next ``take`` while fewer wait than were ever out at once (and at most
    ``keep``): a process whose reads had N out makes no more than N as long as they come
    back, however the N are spread over its bodies (a body's parts in flight, its
    read-ahead, the next body's first parts), and holds no more than N idle. ``take`` and
    ``give`` may be called from any thread; ``allocated`` counts the buffers made."""

    def __init__(self, size: int = CHUNK_SIZE, keep: int = 64):
        self.size, self.keep = size, keep
        self.allocated = 0
        self._free: list[bytearray | mmap.mmap] = []
        self._lock = threading.Lock()
        self._out = 0  # taken and not given back
        self._peak = 0  # the most out at once

    def take(self) -> bytearray | mmap.mmap:
        with self._lock:
            self._out += 1
            self._peak = max(self._peak, self._out)
            if self._free:
                return self._free.pop()
            self.allocated += 1
        return new_buffer(self.size)

    def give(self, chunk: memoryview | bytearray | mmap.mmap) -> None:
        """Take back the buffer under ``chunk`` (a view of one that ``take`` handed out)."""
        buffer = chunk.obj if isinstance(chunk, memoryview) else chunk
        if type(buffer) is not _BUFFER_TYPE or len(buffer) != self.size:
            return
        with self._lock:
            self._out = max(0, self._out - 1)
            if len(self._free) < min(self._peak, self.keep):
                self._free.append(buffer)


class _ChunkBuffer:
    """Chunks handed from the reader thread to the consumer, bounded by total bytes."""

    def __init__(self, limit: int):
        self._limit = limit
        self._chunks: collections.deque[bytes | memoryview] = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self.ended = False  # the producer finished: end of data, or an error
        self.error: BaseException | None = None  # how it finished, if it failed
        self.closed = False  # the consumer is gone

    def put(self, chunk: bytes | memoryview) -> bool:
        """Wait for room and append; False once the consumer has closed."""
        with self._cond:
            while self._bytes >= self._limit and not self.closed:
                self._cond.wait()
            if self.closed:
                return False
            self._chunks.append(chunk)
            self._bytes += len(chunk)
            self._cond.notify_all()
            return True

    def end(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.ended, self.error = True, error
            self._cond.notify_all()

    def get(self, timeout: float) -> bytes | memoryview | None:
        """The next chunk; None at the end. Raises the producer's error, or TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._chunks and not self.ended:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self._cond.wait(remaining)
            if self._chunks:
                chunk = self._chunks.popleft()
                self._bytes -= len(chunk)
                self._cond.notify_all()
                return chunk
            if self.error is not None:
                raise self.error
            return None

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._chunks.clear()
            self._bytes = 0
            self._cond.notify_all()


class ReadAheadBody(io.BufferedIOBase):
    """The read-only body of one URL, filled by a background thread.

    ``read(n)`` returns exactly ``n`` bytes unless the data ends first (``read1(n)`` returns what
    is at hand); ``url`` is the URL, ``bytes_read`` the bytes handed out so far.
    """

    def __init__(self, url: str, source: BodySource, timeout: float):
        super().__init__()
        self.url = url
        self.bytes_read = 0
        self._source = source
        self._timeout = timeout
        self._buffer = _ChunkBuffer(READ_AHEAD)
        self._chunk: bytes | memoryview = b""  # the chunk being handed out, from self._offset on
        self._offset = 0
        self._at_end = False
        self._failed: WdstreamError | None = None  # an error already raised to the consumer
        self._asked = False  # the consumer asked for data (told to the source once)
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._produce, name=f"wdstream-read {url[:80]}", daemon=True
        )
        self._thread.start()

    def _produce(self) -> None:
        try:
            self._source.run(self._buffer.put)
        except BaseException as exc:  # handed to the consumer as a StreamError
            if not self._buffer.closed:
                self._buffer.end(stream_error(self.url, exc))
        else:
            self._buffer.end()

    # reading --------------------------------------------------------------------------------

    def _next_chunk(self, spent: list[memoryview] | None = None) -> bool:
        """Make ``self._chunk`` non-empty; False at the end of the data. A lent chunk moved
        past goes back to the source, or into ``spent`` while views of it are still to be
        copied."""
        if self._failed is not None:
            raise self._failed
        if not self._asked:
            self._asked = True
            self._source.reading()
        while self._offset >= len(self._chunk):
            if isinstance(self._chunk, memoryview):  # lent by the source, and all taken
                if spent is None:
                    self._source.recycle(self._chunk)
                else:
                    spent.append(self._chunk)
                self._chunk = b""
            if self._at_end:
                return False
            try:
                chunk = self._buffer.get(self._timeout)
            except TimeoutError:
                raise self._fail(StreamError(
                    self.url, f"no data for {self._timeout:g} s", transient=True)) from None
            except WdstreamError as exc:
                raise self._fail(exc) from None
            if chunk is None:
                self._at_end = True
                return False
            self._chunk, self._offset = chunk, 0
        return True

    def _fail(self, error: WdstreamError) -> WdstreamError:
        """Remember the error raised to the consumer and stop the source."""
        self._failed = error
        self._source.stop()
        return error

    def _take(self, n: int) -> bytes | memoryview:
        """Up to ``n`` bytes of the current chunk (which must be non-empty); a view of a lent
        chunk, which the caller copies before the next ``_next_chunk``."""
        if self._offset == 0 and n >= len(self._chunk):
            piece = self._chunk
        else:
            piece = self._chunk[self._offset : self._offset + n]
        self._offset += len(piece)
        self.bytes_read += len(piece)
        return piece

    def read(self, n: int | None = -1) -> bytes:
        self._check_open()
        if n is None or n < 0:
            n = sys.maxsize
        parts: list[bytes | memoryview] = []
        spent: list[memoryview] = []
        while n > 0 and self._next_chunk(spent):
            piece = self._take(n)
            parts.append(piece)
            n -= len(piece)
        data = parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)
        if len(spent) <= RECYCLED_PER_READ:  # a whole object read at once lets them go
            for chunk in spent:
                self._source.recycle(chunk)
        return data

    def read1(self, n: int | None = -1) -> bytes:
        self._check_open()
        if n == 0 or not self._next_chunk():
            return b""
        piece = self._take(sys.maxsize if n is None or n < 0 else n)
        return piece if type(piece) is bytes else bytes(piece)

    def readinto(self, buffer) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and self._next_chunk():
            piece = self._take(len(view) - filled)
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        return filled

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        """The position in the object (``start`` plus the bytes read)."""
        return self._source.start + self.bytes_read

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed body")

    # closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the source, or check how it ended (see the module docstring)."""
        if self.closed:
            return
        try:
            if self._source.has_exit_status and self._failed is None and self._ends_soon():
                self._source.check_end(self._timeout)  # may raise StreamError
        finally:
            self._shutdown()

    def _ends_soon(self) -> bool:
        """Whether the data ends by itself within DRAIN_BYTES of what the consumer read, and
        within DRAIN_SECONDS; the bytes in between are dropped."""
        if self.bytes_read == 0 and not self._at_end:
            return False  # nothing read: the consumer did not want this body
        unread = len(self._chunk) - self._offset
        deadline = time.monotonic() + min(DRAIN_SECONDS, self._timeout)
        while unread <= DRAIN_BYTES:
            try:
                chunk = self._buffer.get(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, WdstreamError):
                return False
            if chunk is None:
                return True
            unread += len(chunk)
        return False

    def _shutdown(self) -> None:
        if not self._buffer.ended:
            self._source.stop()
        self._buffer.close()  # wakes the reader thread if it waits for room
        self._source.release()
        if self._source.stops_promptly:
            self._thread.join(5.0)
        self._chunk = b""
        super().close()

    def __del__(self):
        # Garbage collection cleans up but never raises (io.IOBase.__del__ would call close()).
        # A forked copy owns neither the thread nor the process: it must not kill anything.
        if not self.closed and os.getpid() == self._pid:
            self._shutdown()

    def __repr__(self) -> str:
        return f"<ReadAheadBody {self.url!r} bytes_read={self.bytes_read}>"


class LocalBody(io.BufferedIOBase):
    """A local file read in the caller's thread, with the attributes of a ``ReadAheadBody``.

    No reader thread: the page cache already reads ahead. It is seekable, so the tar reader
    takes a large payload with one exact read (one copy) instead of joining chunks."""

    def __init__(self, url: str, file):
        super().__init__()
        self.url, self.bytes_read = url, 0
        self._file = file
        self._start = file.tell()

    def _call(self, method, *args):
        try:
            return method(*args)
        except OSError as exc:
            raise stream_error(self.url, exc) from None

    def read(self, n: int | None = -1) -> bytes:
        data = self._call(self._file.read, n)
        self.bytes_read += len(data)
        return data

    read1 = read  # a raw file's read returns what the file holds, without joining

    def readinto(self, buffer) -> int:
        count = self._call(self._file.readinto, buffer)
        self.bytes_read += count
        return count

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._file.seekable()

    def region(self, position: int) -> tuple[str, int, int, int, int] | None:
        """Where body position ``position`` lies on disk, for a reader that maps the file
        rather than reading it: ``(path, file offset, file size, st_dev, st_ino)``; None when
        the file has no path."""
        name = getattr(self._file, "name", None)
        if not isinstance(name, str):
            return None
        status = self._call(os.fstat, self._file.fileno())
        return (os.path.abspath(name), self._start + position, status.st_size,
                status.st_dev, status.st_ino)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Positions count from where the body started (``start`` of ``open_read``)."""
        if whence == io.SEEK_SET:
            offset += self._start
        position = self._call(self._file.seek, offset, whence) - self._start
        self.bytes_read = position
        return position

    def tell(self) -> int:
        return self.bytes_read

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()

    def __repr__(self) -> str:
        return f"<LocalBody {self.url!r} bytes_read={self.bytes_read}>"

