"""The shard cache's folder: its entries, the lock eviction runs under, and eviction (least
recently used entries first, and temporary files of readers that are gone).

Nothing here follows a symbolic link or opens anything but a regular file: the folder may be
one others can write (see ``wdstream.sources.cache``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import socket
import stat as stat_mode
import tempfile
import time

log = logging.getLogger("wdstream.sources.cache")

TEMP_PREFIX = ".tmp-"  # temporary files: TEMP_PREFIX + host + "-" + pid + "-" + random
LOCK_NAME = ".lock"
STALE_TEMP_SECONDS = 3600.0  # a temporary file untouched this long belongs to no live reader


def host() -> str:
    """This machine's name as it appears in temporary file names."""
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"


def temporary(directory: str):
    """A new temporary file in ``directory`` named for this process: ``(file, path)``."""
    fd, path = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{host()}-{os.getpid()}-", dir=directory)
    return os.fdopen(fd, "wb"), path


def entries(directory: str) -> list[tuple[str, int, float]]:
    """``(path, size, mtime)`` of every cached shard, least recently used first."""
    found = []
    with os.scandir(directory) as scan:
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


def evict(directory: str, limit: int) -> int:
    """Delete least recently used entries until the total is within ``limit``, and temporary
    files of readers that are gone. Returns the bytes freed."""
    freed = 0
    with locked(directory):
        remove_abandoned_temporaries(directory)
        found = entries(directory)
        total = sum(size for _path, size, _mtime in found)
        for path, size, _mtime in found:
            if total <= limit:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                freed += size
            total -= size
    if freed:
        log.debug("%s: evicted %d bytes", directory, freed)
    return freed


def remove_abandoned_temporaries(directory: str) -> None:
    """Delete temporary files untouched for ``STALE_TEMP_SECONDS``, and those of processes of
    this machine that are gone."""
    this_host, now = host(), time.time()
    with os.scandir(directory) as scan:
        for entry in scan:
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            parts = entry.name[len(TEMP_PREFIX):].split("-")
            try:
                abandoned = now - entry.stat(follow_symlinks=False).st_mtime \
                    > STALE_TEMP_SECONDS
                if not abandoned and len(parts) >= 3 and parts[0] == this_host:
                    abandoned = not _alive(int(parts[1]))
            except (FileNotFoundError, ValueError):
                continue
            if abandoned:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
