"""A shard cache entry: the checks before one is served, and the bodies of a hit (the
entry's file) and of a miss (the source, copied into a temporary file that becomes the entry
when the whole shard was read and ended cleanly). See ``wdstream.sources.cache``."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import os
import stat as stat_mode
from typing import IO, TYPE_CHECKING

from wdstream.sources.bodies import LocalBody
from wdstream.sources.cache import folder
from wdstream.sources.hashing import HEAD_BYTES, HashingReader, head_digest

if TYPE_CHECKING:  # a real cycle: the package imports this module for its bodies
    from wdstream.sources.cache import ShardCache

log = logging.getLogger("wdstream.sources.cache")

_TAR_END = bytes(1024)  # a tar ends with two zero blocks (and maybe more zero padding)


def entry_problem(file, stat: os.stat_result, size: int | None, head: str | None,
                  sha256: str | None) -> str | None:
    """Why the entry open as ``file`` (an unbuffered file at offset 0, left there) must not be
    served, or None. Costs two small reads (the head and the end marker), and a read of the
    whole entry when ``sha256`` is given."""
    fd = file.fileno()
    if not stat_mode.S_ISREG(stat.st_mode):
        return "is not a regular file"
    if size and stat.st_size != size:
        return f"has {stat.st_size} bytes, the manifest says {size}"
    if stat.st_size < len(_TAR_END) or \
            os.pread(fd, len(_TAR_END), stat.st_size - len(_TAR_END)) != _TAR_END:
        return "does not end with a tar end-of-archive marker"
    if head and head_digest(os.pread(fd, HEAD_BYTES, 0)) != head:
        return "does not start as the manifest's head says"
    if sha256:
        reader = HashingReader(file)
        reader.drain()
        file.seek(0)
        if reader.hexdigest() != sha256:
            return "has another sha256 than the manifest's"
    return None


class CachedBody(LocalBody):
    """A cache hit: the cached file, with the attributes of a ``ReadAheadBody``."""

    # payloads are not left in a cached file for the main process to map: the cache may
    # evict the file before the main process opens it
    def region(self, position: int) -> tuple[str, int, int, int, int] | None:
        return None

    def __init__(self, url: str, file, path: str):
        super().__init__(url, file)
        self.path = path

    def __repr__(self) -> str:
        return f"<CachedBody {self.url!r} from {self.path!r}>"


class TeeBody(io.BufferedIOBase):
    """A cache miss: reads ``source`` and copies what it hands out into a temporary file,
    published by ``close()`` when the whole shard was read and ended cleanly."""

    def __init__(self, cache: ShardCache, url: str, source, path: str, *,
                 size: int | None = None, sha256: str | None = None, head: str | None = None):
        super().__init__()
        self.url, self.path = url, path
        self._cache, self._source = cache, source
        self._size, self._sha256 = size or None, sha256 or None
        self._hash = hashlib.sha256() if self._sha256 else None
        self._file: IO[bytes] | None = None  # the temporary file, made at the first byte
        self._temporary: str | None = None
        self._written = 0
        self._tail = b""  # the last len(_TAR_END) bytes
        self._head, self._first = head or None, b""  # the manifest's head; the first bytes
        self._ended = False  # the source said b"": its end
        self._short = False  # the last read returned less than asked (the end, for a ReadAheadBody)
        self._failed = False  # a read raised: this copy is never published
        self._uncached = False  # caching gave up (disk full...): stream on without it
        self._end_verified = False  # the reader checked a compressed shard's end

    @property
    def bytes_read(self) -> int:
        return self._written

    # ---- reading --------------------------------------------------------------------------
    def _copy(self, data: bytes, asked: int, exact: bool = True) -> bytes:
        """Copy ``data``, the answer to a read of ``asked`` bytes (-1: all), into the file.
        ``exact``: the read returns less than asked only at the end (``read``, not ``read1``)."""
        if not data:
            if asked != 0:
                self._ended = True
            return data
        self._short = exact and (asked < 0 or len(data) < asked)
        self._written += len(data)
        if self._uncached:
            return data
        bound = self._size if self._size is not None else self._cache.limit
        if self._written > bound:  # longer than the shard can be: never kept, stop copying
            log.warning("%s: not cached: more than the %d bytes it can have", self.url, bound)
            self._uncached = True
            self._discard()
            return data
        try:
            if self._file is None:
                self._file, self._temporary = self._cache._temporary()
            self._file.write(data)
        except OSError as exc:
            log.warning("%s: not cached (%s: %s)", self.url, self._cache.directory,
                        os.strerror(exc.errno) if exc.errno else exc)
            self._uncached = True
            self._discard()
            return data
        if self._hash is not None:
            self._hash.update(data)
        if self._head is not None and len(self._first) < HEAD_BYTES:
            self._first += data[: HEAD_BYTES - len(self._first)]
        self._tail = (self._tail + data[-len(_TAR_END):])[-len(_TAR_END):]
        return data

    def _guard(self, read, *args):
        try:
            return read(*args)
        except BaseException:
            self._failed = True
            raise

    def read(self, n: int | None = -1) -> bytes:
        self._check_open()
        asked = -1 if n is None or n < 0 else n
        return self._copy(self._guard(self._source.read, asked), asked)

    def read1(self, n: int | None = -1) -> bytes:
        self._check_open()
        asked = -1 if n is None or n < 0 else n
        return self._copy(self._guard(self._source.read1, asked), asked, exact=False)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def end_verified(self) -> None:
        """Called by the reader of a compressed shard that decompressed it to its clean end:
        that stands for the tar end-of-archive marker, which the stored bytes do not show."""
        self._end_verified = True

    def tell(self) -> int:
        return self._written

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed body")

    # ---- ending ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close the source (which may raise, e.g. a pipe's non-zero exit) and publish the copy
        if it is a whole, clean shard; otherwise delete it."""
        if self.closed:
            return
        try:
            if not self._ended and self._short and not self._failed and not self._uncached:
                # A ReadAheadBody's short read is its end; make sure without waiting for data.
                self._copy(self._guard(self._source.read, 1), 1)
            self._source.close()
        except BaseException:
            self._discard()
            raise
        else:
            self._finish()
        finally:
            super().close()

    def _complete(self) -> str | None:
        """Why this copy must not be kept, or None if it is a whole, clean shard."""
        if self._failed or self._uncached or self._file is None:
            return "not read"
        if not self._ended:
            return "closed before the end"
        if self._size is not None and self._written != self._size:
            return f"{self._written} bytes, the manifest says {self._size}"
        if self._hash is not None and self._hash.hexdigest() != self._sha256:
            return "sha256 differs from the manifest's"
        if self._head is not None and head_digest(self._first) != self._head:
            return "its first bytes differ from the manifest's head"
        if self._tail != _TAR_END and not self._end_verified:
            return "no tar end-of-archive marker at the end"
        return None

    def _finish(self) -> None:
        problem = self._complete()
        file, temporary = self._file, self._temporary
        if problem is not None or file is None or temporary is None:  # None: "not read"
            if file is not None:
                log.debug("%s: not cached: %s", self.url, problem)
            self._discard()
            return
        try:
            file.close()
            self._file = None
            os.replace(temporary, self.path)
            self._temporary = None
        except OSError as exc:
            # e.g. ENOSPC on close, or the temporary file removed as abandoned meanwhile
            level = logging.DEBUG if exc.errno == errno.ENOENT else logging.WARNING
            log.log(level, "%s: not cached (%s)", self.url, exc)
            self._discard()
            return
        self._cache._stored(self.path)

    def _discard(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self._temporary is not None:
            with contextlib.suppress(OSError):  # left to a later eviction
                folder.remove(self._temporary)
            self._temporary = None

    def __del__(self):
        # Never publish from the garbage collector (io's __del__ would call close()): only
        # make sure no temporary file is left. The source cleans up after itself.
        with contextlib.suppress(Exception):
            self._discard()

    def __repr__(self) -> str:
        return f"<TeeBody {self.url!r} -> {self.path!r}>"
