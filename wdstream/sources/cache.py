"""A local shard cache: shards read once are kept on local disk for later epochs.

``ShardCache(directory, limit)`` keeps whole shards as files in ``directory``, at most
``limit`` bytes of them (``"50GB"``, ``"512MiB"`` or a number; default ``DEFAULT_LIMIT``).
``cache.open(url, opener)`` returns a readable binary stream of the shard:

- a hit opens the cached file (and touches its mtime: eviction is least recently used first);
- a miss calls ``opener()`` (e.g. ``lambda: open_read(url, ...)``) and streams from it while
  copying what the consumer reads into a temporary file in ``directory``: the first sample
  never waits for the whole shard. The copy is renamed into place only when the stream ended
  cleanly: the consumer read it to the end, ``close()`` of the source succeeded (a pipe's exit
  status), the size (and, with ``verify_digest``, the sha256) matches the manifest's when
  known, and the data ends with the tar end-of-archive marker (for a compressed shard: the
  reader decompressed it to its clean end and said so, ``end_verified``). Anything else --
  an error, an early close, a short or corrupt shard -- deletes the temporary file. A
  consumer that stops before the end (a span that ends inside a shard) therefore leaves no
  entry; the worker that reads that shard to its end stores it.

Keys: the sha256 of the full URL, plus the manifest's byte count and sha256 when known, so a
shard replaced under the same URL (with a new manifest) is fetched again, never served stale.
Without a manifest a cached shard is served until evicted.

A directory others can write: nothing is opened through a symbolic link (``O_NOFOLLOW``, the
lock file too) and nothing that is not a regular file is read (``O_NONBLOCK``, then ``fstat``:
a FIFO planted at an entry's path never blocks), so no file outside the directory is read,
created or touched. Before a hit is served its size, its tar end marker and (when the
manifest records it) its ``head`` are checked against the manifest; with ``verify_digest``
the whole entry's sha256 too. An entry that fails is deleted and the shard read from its
source. A download's temporary file never grows past the manifest's byte count (or, unknown,
the cache's limit): the copy is given up, the read goes on.

Sharing: several DataLoader workers, ranks and jobs may use one directory. Each miss writes
its own uniquely named temporary file and publishes it with an atomic ``os.replace``; racing
readers of the same shard write identical bytes, and the last rename wins. Eviction runs after
each store under an ``flock`` on ``directory/.lock`` and deletes the least recently used entries
until the total is within the limit. Deleting a file another process is reading is safe on
POSIX: an open file lives on until closed. Temporary files of downloads in progress are not
counted (the disk may briefly hold the limit plus one shard per active reader); those left by
a killed process are removed by a later eviction. A shard larger than the limit is not kept.

The cache never makes a read fail: if the disk is full or the directory unwritable, the
stream goes on uncached (with a warning). Local files (plain paths, ``file://``) are never
cached; ``pipe:`` commands are, keyed by the command text.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import socket
import stat as stat_mode
import tempfile
import time
from collections.abc import Callable

from wdstream.errors import InputError
from wdstream.shards.identity import HEAD_BYTES as _HEAD_BYTES
from wdstream.shards.identity import head_digest
from wdstream.sizes import parse_size
from wdstream.sources import urls
from wdstream.sources.streams import LocalFile

log = logging.getLogger(__name__)

DEFAULT_LIMIT = "10GB"
TEMP_PREFIX = ".tmp-"  # temporary files: TEMP_PREFIX + host + "-" + pid + "-" + random
LOCK_NAME = ".lock"
STALE_TEMP_SECONDS = 3600.0  # a temporary file untouched this long belongs to no live reader
_TAR_END = bytes(1024)  # a tar ends with two zero blocks (and maybe more zero padding)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"


class ShardCache:
    """Whole shards on local disk, least recently used evicted first. See the module docstring.

    ``hits``, ``misses`` and ``stored`` count this object's opens and publications.
    """

    def __init__(self, directory: str | os.PathLike, limit: int | str | None = None):
        self.directory = os.path.abspath(os.fspath(directory))
        self.limit = parse_size(DEFAULT_LIMIT if limit is None else limit)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cache_dir {self.directory}: cannot create it: {exc}") from exc
        self.hits = self.misses = self.stored = 0

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, limit={self.limit})"

    # ---- keys ---------------------------------------------------------------------------
    @staticmethod
    def cacheable(url: str) -> bool:
        """Local files are read in place; everything else may be cached."""
        return urls.scheme(url) != "file"

    def path_for(self, url: str, size: int | None = None, sha256: str | None = None) -> str:
        """Where the shard ``url`` (with the manifest's ``size``/``sha256``, if known) is kept."""
        key = hashlib.sha256(json.dumps([url, size or None, sha256 or None]).encode()).hexdigest()
        tail = url.rstrip("/").rsplit("/", 1)[-1]
        readable = re.sub(r"[^A-Za-z0-9._-]", "_", tail)[-60:]  # for people listing the folder
        return os.path.join(self.directory, f"{key[:40]}-{readable}")

    # ---- reading ------------------------------------------------------------------------
    def open(self, url: str, opener: Callable[[], io.IOBase], *, size: int | None = None,
             sha256: str | None = None, verify_digest: bool = False, head: str | None = None):
        """A stream of ``url``: the cached copy, or ``opener()`` copied into the cache as it is
        read. ``size``/``sha256``/``head`` are the manifest's (size and digest are part of the
        key; all are checked before a copy is kept or served, the digest only with
        ``verify_digest``)."""
        if not self.cacheable(url):
            return opener()
        path = self.path_for(url, size, sha256)
        cached = self._open_hit(url, path, size, head, sha256 if verify_digest else None)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        return TeeStream(self, url, opener(), path, size=size,
                         sha256=sha256 if verify_digest else None, head=head)

    def _open_hit(self, url: str, path: str, size: int | None, head: str | None = None,
                  sha256: str | None = None) -> CachedStream | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symbolic link planted there
            log.warning("%s: cannot read the cached copy %s (%s); reading the source", url,
                        path, exc)
            with contextlib.suppress(OSError):
                if stat_mode.S_ISLNK(os.lstat(path).st_mode):
                    os.unlink(path)
            return None
        file = open(fd, "rb", buffering=0, closefd=True)  # owned by the stream
        try:
            stat = os.fstat(fd)
            problem = _entry_problem(fd, stat, size, head, sha256)
        except OSError as exc:
            problem = str(exc)
        if problem is not None:  # not written by us, or damaged since; drop it
            file.close()
            log.warning("%s: cached copy %s %s; dropped", url, path, problem)
            self._remove_if_same(path, stat)
            return None
        with contextlib.suppress(OSError):  # evicted meanwhile: our open file still reads
            os.utime(fd)
        return CachedStream(url, file, path)

    def forget(self, url: str, size: int | None = None, sha256: str | None = None) -> None:
        """Delete the cached copy of ``url`` if any (e.g. before a retry: a copy that failed
        the reader's checks must not be served again)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_for(url, size, sha256))

    @staticmethod
    def _remove_if_same(path: str, stat: os.stat_result) -> None:
        try:
            if os.path.samestat(os.lstat(path), stat):
                os.unlink(path)
        except OSError:
            pass

    # ---- the folder ---------------------------------------------------------------------
    def entries(self) -> list[tuple[str, int, float]]:
        """``(path, size, mtime)`` of every cached shard, least recently used first."""
        found = []
        with os.scandir(self.directory) as scan:
            for entry in scan:
                if entry.name.startswith("."):
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if entry.is_file(follow_symlinks=False):
                    found.append((entry.path, stat.st_size, stat.st_mtime))
        found.sort(key=lambda e: (e[2], e[0]))
        return found

    def total_bytes(self) -> int:
        return sum(size for _path, size, _mtime in self.entries())

    @contextlib.contextmanager
    def _locked(self):
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _open_lock(self) -> int:
        """The lock file, never through a link nor anything but a regular file: one planted
        there is removed (once) rather than followed, so that eviction goes on."""
        path = os.path.join(self.directory, LOCK_NAME)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for attempt in range(2):
            try:
                fd = os.open(path, flags, 0o644)
            except OSError as exc:
                if exc.errno != errno.ELOOP or attempt:
                    raise
            else:
                if stat_mode.S_ISREG(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
                if attempt:
                    raise OSError(errno.EINVAL, f"{path} is not a regular file")
            log.warning("%s: %s is not a regular file; replaced", self.directory, LOCK_NAME)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            flags |= os.O_EXCL
        raise AssertionError("unreachable")

    def evict(self) -> int:
        """Delete least recently used entries until the total is within the limit, and
        temporary files of readers that are gone. Returns the bytes freed."""
        freed = 0
        with self._locked():
            self._remove_abandoned_temporaries()
            entries = self.entries()
            total = sum(size for _path, size, _mtime in entries)
            for path, size, _mtime in entries:
                if total <= self.limit:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    freed += size
                total -= size
        if freed:
            log.debug("%s: evicted %d bytes", self.directory, freed)
        return freed

    def _remove_abandoned_temporaries(self) -> None:
        host, now = _host(), time.time()
        with os.scandir(self.directory) as scan:
            for entry in scan:
                if not entry.name.startswith(TEMP_PREFIX):
                    continue
                parts = entry.name[len(TEMP_PREFIX):].split("-")
                try:
                    abandoned = now - entry.stat(follow_symlinks=False).st_mtime \
                        > STALE_TEMP_SECONDS
                    if not abandoned and len(parts) >= 3 and parts[0] == host:
                        abandoned = not _alive(int(parts[1]))
                except (FileNotFoundError, ValueError):
                    continue
                if abandoned:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    # ---- called by TeeStream ------------------------------------------------------------
    def _temporary(self):
        fd, path = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{_host()}-{os.getpid()}-",
                                    dir=self.directory)
        return os.fdopen(fd, "wb"), path

    def _stored(self, path: str) -> None:
        """A shard was published at ``path``: it is the most recently used; evict."""
        self.stored += 1
        try:
            os.utime(path, follow_symlinks=False)
            self.evict()
        except OSError as exc:
            log.warning("%s: eviction failed: %s", self.directory, exc)


def _entry_problem(fd: int, stat: os.stat_result, size: int | None, head: str | None,
                   sha256: str | None) -> str | None:
    """Why the entry open at ``fd`` must not be served, or None. Costs two small reads (the
    head and the end marker), and a read of the whole entry when ``sha256`` is given."""
    if not stat_mode.S_ISREG(stat.st_mode):
        return "is not a regular file"
    if size and stat.st_size != size:
        return f"has {stat.st_size} bytes, the manifest says {size}"
    if stat.st_size < len(_TAR_END) or \
            os.pread(fd, len(_TAR_END), stat.st_size - len(_TAR_END)) != _TAR_END:
        return "does not end with a tar end-of-archive marker"
    if head and head_digest(os.pread(fd, _HEAD_BYTES, 0)) != head:
        return "does not start as the manifest's head says"
    if sha256:
        digest, offset = hashlib.sha256(), 0
        while chunk := os.pread(fd, 1 << 20, offset):
            digest.update(chunk)
            offset += len(chunk)
        if digest.hexdigest() != sha256:
            return "has another sha256 than the manifest's"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CachedStream(LocalFile):
    """A cache hit: the cached file, with the attributes of a ``ByteStream``."""

    # payloads are not left in a cached file for the main process to map: the cache may
    # evict the file before the main process opens it
    region = None

    def __init__(self, url: str, file, path: str):
        super().__init__(url, file)
        self.path = path

    def __repr__(self) -> str:
        return f"<CachedStream {self.url!r} from {self.path!r}>"


class TeeStream(io.BufferedIOBase):
    """A cache miss: reads ``source`` and copies what it hands out into a temporary file,
    published by ``close()`` when the whole shard was read and ended cleanly."""

    def __init__(self, cache: ShardCache, url: str, source, path: str, *,
                 size: int | None = None, sha256: str | None = None, head: str | None = None):
        super().__init__()
        self.url, self.path = url, path
        self._cache, self._source = cache, source
        self._size, self._sha256 = size or None, sha256 or None
        self._hash = hashlib.sha256() if self._sha256 else None
        self._file = None  # the temporary file, made at the first byte
        self._temporary: str | None = None
        self._written = 0
        self._tail = b""  # the last len(_TAR_END) bytes
        self._head, self._first = head or None, b""  # the manifest's head; the first bytes
        self._ended = False  # the source said b"": its end
        self._short = False  # the last read returned less than asked (the end, for a ByteStream)
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
        if self._head is not None and len(self._first) < _HEAD_BYTES:
            self._first += data[: _HEAD_BYTES - len(self._first)]
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
            raise ValueError(f"{self.url}: read from a closed stream")

    # ---- ending ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close the source (which may raise, e.g. a pipe's non-zero exit) and publish the copy
        if it is a whole, clean shard; otherwise delete it."""
        if self.closed:
            return
        try:
            if not self._ended and self._short and not self._failed and not self._uncached:
                # A ByteStream's short read is its end; make sure without waiting for data.
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
        if problem is not None:
            if self._file is not None:
                log.debug("%s: not cached: %s", self.url, problem)
            self._discard()
            return
        try:
            self._file.close()
            self._file = None
            os.replace(self._temporary, self.path)
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
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temporary)
            self._temporary = None

    def __del__(self):
        # Never publish from the garbage collector (io's __del__ would call close()): only
        # make sure no temporary file is left. The source cleans up after itself.
        with contextlib.suppress(Exception):
            self._discard()

    def __repr__(self) -> str:
        return f"<TeeStream {self.url!r} -> {self.path!r}>"
