"""Local files read as data: regular files only, opened without blocking (``O_NONBLOCK``: a FIFO
cannot hold the reader waiting for a writer) and, for a name found in a folder, without
following a link in its last component (``O_NOFOLLOW``); then checked with ``fstat`` on the
open descriptor, so what is read is what was checked. A file's ``Identity`` (device, inode,
change time) tells whether the file is still the one listed: copying a size and a
modification time onto another file, or a link, does not fake it."""

from __future__ import annotations

import errno
import io
import os
import stat
from typing import NamedTuple

from wdstream.errors import InputError, WdstreamError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"))
_CHUNK = 1 << 20  # what a bounded read asks for at once


class Identity(NamedTuple):
    """What tells a local file from another one with the same size and modification time:
    its device and inode (another file, or what a link points to, has others) and its change
    time in nanoseconds (set by the kernel whenever the file's content or metadata is set,
    ``utime`` included, and never settable by a user)."""

    device: int
    inode: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Identity:
        return cls(info.st_dev, info.st_ino, info.st_ctime_ns)


def kind(mode: int) -> str:
    """``"a FIFO"``, ``"a character device"``, ... for what is not a regular file."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str, identity: tuple[int, int] | None = None, nofollow: bool = False,
                 *, error: type[WdstreamError] = InputError, reader: str = "pack",
                 changed: str = "changed while packing") -> io.FileIO:
    """``path`` opened for reading if it is a regular file (and, given ``identity``, the file
    of that ``(device, inode)`` read or listed there before; ``nofollow``: a folder's file,
    whose last component is not followed if it is a link now); ``error`` otherwise, naming
    the path and ``reader``, or saying it ``changed``. Opening never blocks, whatever is
    there."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if nofollow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as failure:
        shown = "a symbolic link" if failure.errno == errno.ELOOP and nofollow else \
            f"cannot read: {failure.strerror or failure}"
        raise error(f"{path}: {shown}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: {kind(info.st_mode)}; {reader} reads only regular files")
        if identity is not None and (info.st_dev, info.st_ino) != tuple(identity[:2]):
            raise error(f"{path}: {changed} (another file is there now)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return io.FileIO(fd, "rb")


def read_regular(path: str, most: int, *, error: type[WdstreamError] = InputError,
                 what: str = "a file", setting: str = "") -> bytes:
    """The whole regular file at ``path`` if it holds at most ``most`` bytes: its size
    checked on the open file before a byte is read, and the read stopped one byte past
    ``most`` (a file growing meanwhile); ``error`` naming the path otherwise (``what`` the
    file is, ``setting``: the variable that changes the limit)."""
    with open_regular(path, error=error, reader="wdstream") as file:
        size = os.fstat(file.fileno()).st_size
        chunks, total = [], 0
        while size <= most and (chunk := file.read(min(_CHUNK, most + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
            if total > most:
                break
    if max(size, total) > most:
        how = f" (set {setting} to change it)" if setting else ""
        raise error(f"{path}: {max(size, total):,} bytes, more than the {most:,} bytes "
                    f"{what} may have{how}")
    return b"".join(chunks)
