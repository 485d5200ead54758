"""Memory that DataLoader workers fill (or leave in place) and the main process reads without
a copy through the worker: shared-memory segments, and regions of local files in the page
cache.

A fresh segment costs more than the copy into it (docs/decisions.md), so each
worker keeps an ``Arena`` of segments mapped once, cut in order into payloads and packed
batches, and reused once nothing cut from them is alive in the worker or the main process
(which clears the flag a batch raised in its segment's first bytes, ``holds``). Large
payloads of local files stay where they lie (``FileSpan``): the main process reads them from
the page cache, or maps the file copy-on-write for views (``WorkerFile``)."""

from __future__ import annotations

import collections
import functools
import itertools
import mmap
import os

import torch

from wdstream.errors import StreamError
from wdstream.stream.transfer.torch_internals import new_shared_storage

_POPULATE_READ, _POPULATE_WRITE = 22, 23  # MADV_POPULATE_*: Linux 5.14+, EINVAL before


def allocate(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 tensor in shared memory, its pages already mapped. Allocated in
    shared memory directly: ``share_memory_()`` on a private tensor would copy it once more."""
    try:
        storage = new_shared_storage(nbytes)
        tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
    except (AttributeError, RuntimeError, TypeError):  # a torch without _new_shared
        tensor = torch.empty(nbytes, dtype=torch.uint8)
        if hasattr(tensor, "share_memory_"):
            tensor.share_memory_()
    populate(tensor, write=True)
    return tensor


def populate(tensor: torch.Tensor, write: bool = False) -> None:
    """Map all the pages of ``tensor`` with one ``madvise`` call rather than a fault per 4 KiB
    page; best effort (nothing where the kernel or the C library cannot)."""
    madvise = _madvise()
    if madvise is not None and tensor.numel():
        address = tensor.data_ptr()
        start = address - address % mmap.PAGESIZE
        madvise(start, tensor.numel() + address - start, _POPULATE_WRITE if write else
                _POPULATE_READ)


@functools.cache
def _madvise():
    libc = linux_libc()
    if libc is None or not hasattr(libc, "madvise"):
        return None
    import ctypes

    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc.madvise


@functools.cache
def linux_libc():
    """The process's C library through ctypes on Linux (madvise, mallopt), else None."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


class MemorySegment:
    """One shared-memory buffer of an arena: ``HOLDS`` flag bytes, then spans cut in order."""

    HOLDS = 1024  # batches using one segment that the main process may hold at once

    __slots__ = ("tensor", "array", "used", "live", "uid", "sent", "_cursor")

    def __init__(self, tensor: torch.Tensor, uid: int):
        self.tensor = tensor
        self.array = tensor.numpy()
        self.used = self.HOLDS  # offset of the next span
        self.live = 0  # spans cut from it still alive in this process
        self.uid = uid  # its number in this worker
        self.sent = False  # handed to the main process, which keeps it mapped
        self._cursor = 0  # the flag after the last one raised: batches come back in order

    @property
    def capacity(self) -> int:
        return self.array.size

    def hold(self) -> int:
        """Raise a free flag for a batch the main process will hold: its offset, or -1 when
        all are raised."""
        flag = self._cursor
        if self.array[flag]:  # not the usual case: look for any free flag
            free = (self.array[: self.HOLDS] == 0).nonzero()[0]
            if not len(free):
                return -1
            flag = int(free[0])
        self.array[flag] = 1
        self._cursor = (flag + 1) % self.HOLDS
        return flag

    def idle(self) -> bool:
        """Nothing cut from it alive here, and no batch using it held by the main process."""
        return not self.live and not self.array[: self.HOLDS].any()


def release(buffer: torch.Tensor, flag: int) -> None:
    """In the main process: the batch that raised ``flag`` in this segment is no longer held."""
    buffer.numpy()[flag] = 0


class SharedSpan:
    """``len(span)`` bytes of an arena's segment: a payload read straight into shared memory,
    or a batch's ``bytes`` packed there. Its segment is not reused while it lives."""

    __slots__ = ("segment", "start", "end")

    def __init__(self, segment: MemorySegment, start: int, end: int):
        self.segment, self.start, self.end = segment, start, end
        segment.live += 1

    def __del__(self):
        self.segment.live -= 1

    def __len__(self) -> int:
        return self.end - self.start

    def memory(self) -> memoryview:
        """The span's bytes, writable."""
        # numpy's stub declares ndarray.__buffer__ only for Python >= 3.12
        return memoryview(self.segment.array)[self.start : self.end]  # type: ignore[arg-type]

    def __bytes__(self) -> bytes:
        return self.segment.array[self.start : self.end].tobytes()

    def __repr__(self) -> str:
        return f"SharedSpan({len(self)} bytes)"


CAN_MAP_FILES = hasattr(mmap, "MAP_PRIVATE")  # POSIX


class FileSpan:
    """``size`` bytes of a local file at ``offset``: a payload the worker leaves where it is,
    which the main process reads or maps from the page cache rather than a worker copying it
    into shared memory first. The file's device and inode tell the main process that it opens
    the file the worker read."""

    __slots__ = ("path", "offset", "size", "file_size", "identity")

    def __init__(self, region: tuple[str, int, int, int, int], size: int):
        self.path, self.offset, self.file_size = region[0], region[1], region[2]
        self.identity = region[3:5]
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        file = WorkerFile(self.path, self.identity, self.file_size)
        return file.read([(self.offset, self.offset + self.size)])[0]

    def __repr__(self) -> str:
        return f"FileSpan({self.path!r}, {self.offset}, {self.size})"


class WorkerFile:
    """In the main process: the local file a worker left a batch's payloads in, checked to be
    the file the worker read (its device and inode, and at least ``file_size`` bytes). Payloads
    copied out into ``bytes`` are read from it (one copy from the page cache, as ``cat``
    does); views of them (``bytes_as="tensor"``) map it."""

    __slots__ = ("path", "identity", "file_size")

    def __init__(self, path: str, identity: tuple[int, int], file_size: int):
        self.path, self.identity, self.file_size = path, tuple(identity), file_size

    def _open(self) -> int:
        """A descriptor of the file. Raises StreamError if the file was removed, replaced or
        truncated since the worker read it."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as error:
            raise StreamError(f"{self.path}: cannot open the shard read by a worker "
                              f"({error.strerror})") from None
        status = os.fstat(fd)
        if (status.st_dev, status.st_ino) != self.identity or status.st_size < self.file_size:
            os.close(fd)
            raise StreamError(f"{self.path}: replaced or truncated while being read")
        return fd

    def map(self) -> torch.Tensor:
        """A uint8 tensor over the first ``file_size`` bytes, mapped copy-on-write (the tensors
        are writable; the file never changes)."""
        fd = self._open()
        try:
            memory = mmap.mmap(fd, self.file_size, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return torch.frombuffer(memory, dtype=torch.uint8)

    def read(self, bounds: list[tuple[int, int]]) -> list[bytes]:
        """The bytes from each ``(start, end)`` of ``bounds``."""
        fd = self._open()
        try:
            values = [os.pread(fd, end - start, start) for start, end in bounds]
        except OSError as error:
            raise StreamError(f"{self.path}: cannot read the shard read by a worker "
                              f"({error.strerror})") from None
        finally:
            os.close(fd)
        if any(len(value) != end - start for value, (start, end) in zip(values, bounds,
                                                                          strict=True)):
            raise StreamError(f"{self.path}: truncated while being read")
        return values


class Arena:
    """A worker's shared memory for the payloads it reads and the batches it packs: ``cut``
    gives spans in order from the current segment; a full segment is set aside and used again
    once idle.

    ``SEGMENT`` and ``KEEP`` trade memory for speed: a segment holds what is in flight, and the
    fewer bytes it leaves unused the less is allocated (each new page costs more than a copy;
    the figures behind ``SEGMENT``: docs/decisions.md). The first segment is
    ``FIRST`` bytes and each new one twice the last, up to ``SEGMENT``: a worker's first batch
    waits for a small segment to be mapped, and a worker with little in flight maps less;
    each new segment crosses to the main process once, as a file descriptor."""

    FIRST = 4 << 20  # bytes of the first new segment
    SEGMENT = 16 << 20  # bytes of a new segment once grown (more when one span needs more)
    KEEP = 32 << 20  # bytes of idle segments kept mapped beyond those in use
    ALIGN = 64  # spans start on a cache line

    def __init__(self):
        self._current: MemorySegment | None = None
        self._set_aside: list[MemorySegment] = []
        self._uids = itertools.count()
        self._grown = self.FIRST  # bytes of the next new segment
        # the most bytes of segments in use at once: idle segments are kept up to it, so a
        # shuffle window that fills, empties and fills again reuses its segments rather
        # than mapping (and the kernel zeroing) new ones each time
        self._peak = 0
        # segments let go after the main process mapped them: it unmaps them when told (a
        # deque: batches are pickled in another thread, and append/popleft are atomic)
        self.dropped: collections.deque[int] = collections.deque()

    def cut(self, nbytes: int) -> SharedSpan:
        segment = self._current
        if segment is None or segment.capacity - segment.used < nbytes:
            segment = self._current = self._next_segment(nbytes)
        start = segment.used
        segment.used = min(segment.capacity, -(-(start + nbytes) // self.ALIGN) * self.ALIGN)
        return SharedSpan(segment, start, start + nbytes)

    def _next_segment(self, nbytes: int) -> MemorySegment:
        if self._current is not None:
            self._set_aside.append(self._current)
        idle = [s for s in self._set_aside if s.idle()]
        chosen = next((s for s in idle if s.capacity - MemorySegment.HOLDS >= nbytes), None)
        size = chosen.capacity if chosen is not None else max(min(self._grown, self.SEGMENT),
                                                              MemorySegment.HOLDS + nbytes)
        busy = sum(s.capacity for s in self._set_aside) - sum(s.capacity for s in idle) + size
        self._peak = max(self._peak, busy)
        limit = max(self._peak, busy + self.KEEP)  # bytes mapped, idle segments included
        kept = busy
        for segment in idle:  # beyond the limit, idle segments are let go (and unmapped)
            if segment is chosen:
                continue
            if kept + segment.capacity > limit:
                self._set_aside.remove(segment)
                if segment.sent:
                    self.dropped.append(segment.uid)
            else:
                kept += segment.capacity
        if chosen is None:
            self._grown = min(2 * self._grown, self.SEGMENT)
            return MemorySegment(allocate(size), next(self._uids))
        self._set_aside.remove(chosen)
        chosen.used = MemorySegment.HOLDS
        return chosen


_arenas: dict[int, Arena] = {}  # per process id: a forked worker starts its own


def arena() -> Arena:
    """This process's arena."""
    found = _arenas.get(os.getpid())
    if found is None:
        found = _arenas[os.getpid()] = Arena()
    return found


def read_target(nbytes: int) -> tuple[SharedSpan, memoryview]:
    """Where the tar reader puts a large payload from a remote stream in a DataLoader worker:
    a span of this process's arena and its writable memory."""
    span = arena().cut(nbytes)
    return span, span.memory()


# ---- the main process's side ----------------------------------------------------------------
# The segments each worker has sent, kept mapped (pages included) for the worker's later
# batches: a batch then crosses with the numbers of its segments, without passing a file
# descriptor (a round trip to the worker) or mapping and unmapping memory in the main process.
_kept: dict[int, dict[int, torch.Tensor]] = {}  # worker pid -> segment uid -> its tensor


def keep_mapped(worker: int, uid: int, tensor: torch.Tensor) -> None:
    populate(tensor)
    _kept.setdefault(worker, {})[uid] = tensor


def mapped(worker: int, uid: int) -> torch.Tensor:
    return _kept[worker][uid]


def unmap(worker: int, uids) -> None:
    """Forget segments a worker let go."""
    segments = _kept.get(worker, {})
    for uid in uids:
        segments.pop(uid, None)


def unmap_workers(workers) -> None:
    """Forget every segment of these worker processes (when an iteration ends)."""
    for worker in workers:
        _kept.pop(worker, None)
