"""A local shard cache: shards read once are kept on local disk for later epochs.

``ShardCache(directory, limit)`` keeps whole shards as files in ``directory``, at most
``limit`` bytes of them (``"50GB"``, ``"512MiB"`` or a number; default ``DEFAULT_LIMIT``).
``cache.open(url, opener)`` returns the shard's body, read as a binary file:

- a hit opens the cached file (and touches its mtime: eviction is least recently used first);
- a miss calls ``opener()`` (e.g. ``lambda: open_read(url, ...)``) and streams from it while
  copying what the consumer reads into a temporary file in ``directory``: the first sample
  never waits for the whole shard. The copy is renamed into place only when the body ended
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

Only the cache's own files are counted and deleted: regular files named as its entries or
temporary files (``folder.own``; the name is checked before every unlink). Other files
in the directory, links and folders are left alone, and a link is never followed. An entry it
may not delete (another user's, in a shared folder with the sticky bit) is skipped, with one
warning naming it per ``ShardCache``, and other entries are evicted in its place; if what is
left still exceeds the limit, a warning says so, once.

The cache never makes a read fail: if the disk is full or the directory unwritable, the
read goes on uncached (with a warning). Local files (plain paths, ``file://``) are never
cached; ``pipe:`` commands are, keyed by the command text.

Here: the keys, hits and misses. The bodies of a hit and a miss, and the checks of an entry,
are in ``entry``; the folder's listing, lock and eviction in ``folder``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import stat as stat_mode
from collections.abc import Callable

from wdstream.errors import InputError
from wdstream.sizes import parse_size
from wdstream.sources.cache import folder
from wdstream.sources.cache.entry import CachedBody, TeeBody, entry_problem
from wdstream.sources.stores import store_for

log = logging.getLogger(__name__)

DEFAULT_LIMIT = "10GB"


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
        self._stuck: set[str] = set()  # files eviction could not delete, already warned of
        self._over_limit = False  # whether it warned that those exceed the limit

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, limit={self.limit})"

    # ---- keys ---------------------------------------------------------------------------
    @staticmethod
    def cacheable(url: str) -> bool:
        """Local files are read in place; everything else may be cached."""
        return not store_for(url).local

    def path_for(self, url: str, size: int | None = None, sha256: str | None = None) -> str:
        """Where the shard ``url`` (with the manifest's ``size``/``sha256``, if known) is kept."""
        key = hashlib.sha256(json.dumps([url, size or None, sha256 or None]).encode()).hexdigest()
        return os.path.join(self.directory, folder.entry_name(key, url))

    # ---- reading ------------------------------------------------------------------------
    def open(self, url: str, opener: Callable[[], io.IOBase], *, size: int | None = None,
             sha256: str | None = None, verify_digest: bool = False, head: str | None = None):
        """The body of ``url``: the cached copy, or ``opener()`` copied into the cache as it is
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
        return TeeBody(self, url, opener(), path, size=size,
                         sha256=sha256 if verify_digest else None, head=head)

    def _open_hit(self, url: str, path: str, size: int | None, head: str | None = None,
                  sha256: str | None = None) -> CachedBody | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symbolic link planted there
            log.warning("%s: cannot read the cached copy %s (%s); reading the source", url,
                        path, exc)
            with contextlib.suppress(OSError):
                if stat_mode.S_ISLNK(os.lstat(path).st_mode):
                    folder.remove(path)  # the link, never what it points to
            return None
        file = open(fd, "rb", buffering=0, closefd=True)  # owned by the body
        try:
            stat = os.fstat(fd)
            problem = entry_problem(file, stat, size, head, sha256)
        except OSError as exc:
            problem = str(exc)
        if problem is not None:  # not written by us, or damaged since; drop it
            file.close()
            log.warning("%s: cached copy %s %s; dropped", url, path, problem)
            self._remove_if_same(path, stat)
            return None
        with contextlib.suppress(OSError):  # evicted meanwhile: our open file still reads
            os.utime(fd)
        return CachedBody(url, file, path)

    def forget(self, url: str, size: int | None = None, sha256: str | None = None) -> None:
        """Delete the cached copy of ``url`` if any (e.g. before a retry: a copy that failed
        the reader's checks must not be served again)."""
        path = self.path_for(url, size, sha256)
        try:
            folder.remove(path)
        except OSError as exc:
            log.warning("%s: cannot delete the cached copy %s: %s", url, path, exc)

    @staticmethod
    def _remove_if_same(path: str, stat: os.stat_result) -> None:
        try:
            if os.path.samestat(os.lstat(path), stat):
                folder.remove(path)
        except OSError:
            pass

    # ---- the folder (folder.py) ---------------------------------------------------------
    def entries(self) -> list[tuple[str, int, float]]:
        """``(path, size, mtime)`` of every cached shard, least recently used first."""
        return folder.entries(self.directory)

    def total_bytes(self) -> int:
        return sum(size for _path, size, _mtime in self.entries())

    def evict(self) -> int:
        """Delete least recently used entries until the total is within the limit, and
        temporary files of readers that are gone. Returns the bytes freed. A file it may not
        delete is skipped and named in a warning, once."""
        result = folder.evict(self.directory, self.limit)
        for path, reason in result.stuck:
            if path not in self._stuck:
                self._stuck.add(path)
                log.warning("%s: cannot delete this cache file (%s); evicting others in its "
                            "place", path, reason)
        if result.total > self.limit and not self._over_limit:
            self._over_limit = True
            log.warning("%s: %d bytes of entries it cannot delete exceed cache_limit (%d)",
                        self.directory, result.total, self.limit)
        return result.freed

    # ---- called by TeeBody ------------------------------------------------------------
    def _temporary(self):
        return folder.temporary(self.directory)

    def _stored(self, path: str) -> None:
        """A shard was published at ``path``: it is the most recently used; evict."""
        self.stored += 1
        try:
            os.utime(path, follow_symlinks=False)
            self.evict()
        except OSError as exc:
            log.warning("%s: eviction failed: %s", self.directory, exc)
