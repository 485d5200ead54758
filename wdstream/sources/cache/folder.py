"""The shard cache's folder: its entries, the lock eviction runs under, and eviction (least
recently used entries first, and temporary files of readers that are gone).

Nothing here follows a symbolic link or opens anything but a regular file: the folder may be
one others can write (see ``wdstream.sources.cache``). The cache's own files are known by
their names: an entry is ``ENTRY_NAME`` (40 hex digits of its key, ``-``, the URL's last
part), a temporary file ``TEMP_NAME``; anything else in the folder (a user's file, a link, a
folder) is neither counted nor touched, and ``remove`` checks the name before every unlink.
An entry that cannot be deleted (another user's, in a shared sticky folder) is skipped: the
others are evicted in its place, and ``Eviction.stuck`` names it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import socket
import stat as stat_mode
import time
from dataclasses import dataclass, field

log = logging.getLogger("wdstream.sources.cache")

TEMP_PREFIX = ".tmp-"  # temporary files: TEMP_PREFIX + host + "-" + pid + "-" + 16 hex digits
TEMP_NAME = re.compile(r"\.tmp-([A-Za-z0-9]{1,32})-([0-9]{1,7})-[0-9a-f]{16}")
ENTRY_NAME = re.compile(r"[0-9a-f]{40}-[A-Za-z0-9._-]{0,60}")
LOCK_NAME = ".lock"
STALE_TEMP_SECONDS = 3600.0  # a temporary file untouched this long belongs to no live reader


def host() -> str:
    """This machine's name as it appears in temporary file names."""
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"


def entry_name(key: str, url: str) -> str:
    """The name of the entry of ``key`` (hex digits) for the shard ``url``: the key's first 40
    digits and, for people listing the folder, the URL's last part."""
    tail = url.rstrip("/").rsplit("/", 1)[-1]
    return f"{key[:40]}-{re.sub(r'[^A-Za-z0-9._-]', '_', tail)[-60:]}"


def own(name: str) -> bool:
    """Whether ``name`` is one the cache gives its files (an entry or a temporary file)."""
    return bool(ENTRY_NAME.fullmatch(name) or TEMP_NAME.fullmatch(name))


def remove(path: str) -> bool:
    """Delete ``path`` if its name is one of the cache's own (``own``); an unlink removes a
    link itself, never what it points to. False when it is not the cache's or is gone;
    other errors (a file it may not delete) are raised."""
    if not own(os.path.basename(path)):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def temporary(directory: str):
    """A new temporary file in ``directory`` named for this process: ``(file, path)``."""
    name = f"{TEMP_PREFIX}{host()}-{os.getpid()}-{secrets.token_hex(8)}"
    path = os.path.join(directory, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb"), path


def _own_files(directory: str, pattern: re.Pattern) -> list[tuple[str, os.stat_result]]:
    """``(path, lstat)`` of the regular files in ``directory`` whose names match ``pattern``;
    links are not followed, and are not the cache's."""
    found = []
    with os.scandir(directory) as scan:
        for entry in scan:
            if not pattern.fullmatch(entry.name):
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat_mode.S_ISREG(stat.st_mode):
                found.append((entry.path, stat))
    return found


def entries(directory: str) -> list[tuple[str, int, float]]:
    """``(path, size, mtime)`` of every cached shard, least recently used first."""
    found = [(path, stat.st_size, stat.st_mtime)
             for path, stat in _own_files(directory, ENTRY_NAME)]
    found.sort(key=lambda e: (e[2], e[0]))
    return found


@contextlib.contextmanager
def locked(directory: str):
    """Hold the folder's ``flock`` (on ``directory/.lock``) for the block."""
    fd = _open_lock(directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _open_lock(directory: str) -> int:
    """The lock file, never through a link nor anything but a regular file: one planted
    there is removed (once) rather than followed, so that eviction goes on."""
    path = os.path.join(directory, LOCK_NAME)
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
        log.warning("%s: %s is not a regular file; replaced", directory, LOCK_NAME)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        flags |= os.O_EXCL
    raise AssertionError("unreachable")


@dataclass
class Eviction:
    """What an eviction did: ``freed`` bytes, ``total`` bytes of entries left, and the files
    it could not delete (``stuck``: ``(path, reason)``)."""

    freed: int = 0
    total: int = 0
    stuck: list[tuple[str, str]] = field(default_factory=list)

    def remove(self, path: str) -> bool:
        """Delete the cache's file ``path``; one it may not delete is noted in ``stuck``."""
        try:
            return remove(path)
        except OSError as exc:
            self.stuck.append((path, os.strerror(exc.errno) if exc.errno else str(exc)))
            return False


def evict(directory: str, limit: int) -> Eviction:
    """Delete least recently used entries until their total is within ``limit`` (skipping
    those that cannot be deleted), and temporary files of readers that are gone."""
    result = Eviction()
    with locked(directory):
        remove_abandoned_temporaries(directory, result)
        found = entries(directory)
        result.total = sum(size for _path, size, _mtime in found)
        for path, size, _mtime in found:
            if result.total <= limit:
                break
            if result.remove(path):
                result.freed += size
                result.total -= size
            elif not os.path.lexists(path):  # deleted by another reader meanwhile
                result.total -= size
    if result.freed:
        log.debug("%s: evicted %d bytes", directory, result.freed)
    return result


def remove_abandoned_temporaries(directory: str, result: Eviction) -> None:
    """Delete temporary files untouched for ``STALE_TEMP_SECONDS``, and those of processes of
    this machine that are gone."""
    this_host, now = host(), time.time()
    for path, stat in _own_files(directory, TEMP_NAME):
        named = TEMP_NAME.fullmatch(os.path.basename(path))
        if named is None:  # _own_files matched it
            continue
        made_by, pid = named.groups()
        abandoned = now - stat.st_mtime > STALE_TEMP_SECONDS or (
            made_by == this_host and not _alive(int(pid)))
        if abandoned:
            result.remove(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
