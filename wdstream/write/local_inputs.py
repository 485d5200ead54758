"""The local files ``pack`` reads: regular files only, and of a folder only what lies inside it.

A folder is walked one directory at a time, each opened from the folder's own descriptor
without following a link (``O_NOFOLLOW``), and every entry is looked at with ``lstat``: a
regular file is listed with its size and identity (device, inode); a symbolic link is
resolved to its real path and followed only if that lies inside the folder (or
``follow_links``); a FIFO, a device, a socket, a link to nothing or a link that loops is an
``InputError`` naming it. Hidden entries (a name starting with ".") are skipped unread.

A file is opened by ``sources.local_files.open_regular``: without blocking (``O_NONBLOCK``:
a FIFO put there later cannot hang the read), checked to be a regular file, and for a folder's file checked to be the one listed
(its identity), so that swapping an entry or a folder for a link after the listing is
refused rather than read.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from wdstream.errors import InputError
from wdstream.sources.local_files import kind
from wdstream.sources.local_files import open_regular as open_regular  # what pack opens

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FolderFile(NamedTuple):
    """A file of a folder input: where it is under the folder ("/"-separated, as named
    through links), the real path it is read from, its size and (device, inode)."""

    relative: str
    path: str
    size: int
    identity: tuple[int, int]


def identity_of(file) -> tuple[int, int]:
    """``(device, inode)`` of an open file."""
    info = os.fstat(file.fileno())
    return info.st_dev, info.st_ino


def regular_size(path: str) -> int:
    """The size of the file the user named (a link given as the input is followed);
    InputError if it is a FIFO, a device or a socket."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path}: {kind(info.st_mode)}; pack reads only regular files and "
                         "folders (give one file's bytes as - on stdin)")
    return info.st_size


def folder_files(folder: str, follow_links: bool = False) -> list[FolderFile]:
    """Every regular file under ``folder`` (hidden ones aside), in the order of their
    relative paths; InputError for an entry pack does not read (see the module docstring)."""
    root = os.path.realpath(folder)
    walk = _Walk(folder, root, follow_links)
    top = os.stat(root)
    pending = [("", root, frozenset({(top.st_dev, top.st_ino)}))]  # (prefix, real path, above)
    while pending:
        prefix, real, above = pending.pop()
        for name, info in _entries(walk, prefix, real):
            relative = prefix + name
            target, info = walk.resolve(relative, os.path.join(real, name), info)
            if stat.S_ISDIR(info.st_mode):
                if (info.st_dev, info.st_ino) in above:
                    raise InputError(f"{walk.shown(relative)}: a link to a folder that holds "
                                     "it (a loop)")
                pending.append((relative + "/", target, above | {(info.st_dev, info.st_ino)}))
            elif stat.S_ISREG(info.st_mode):
                walk.files.append(FolderFile(relative, target, info.st_size,
                                             (info.st_dev, info.st_ino)))
            else:
                raise InputError(f"{walk.shown(relative)}: {kind(info.st_mode)}; pack reads "
                                 "only regular files and folders")
    return sorted(walk.files)


class _Walk:
    """What ``folder_files`` keeps while walking: the folder as named and its real path,
    whether links out of it are followed, and the files found."""

    def __init__(self, folder: str, root: str, follow_links: bool):
        self.folder, self.root, self.follow_links = folder, root, follow_links
        self.files: list[FolderFile] = []

    def shown(self, relative: str) -> str:
        return os.path.join(self.folder, relative)

    def inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root.rstrip(os.sep) + os.sep)

    def open_folder(self, real: str) -> int:
        """A descriptor of the folder at ``real``: inside the folder, opened step by step
        from the root without following a link; outside it (``follow_links``), as named."""
        if not self.inside(real):
            return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in os.path.relpath(real, self.root).split(os.sep):
                if part != ".":
                    fd, parent = os.open(part, _DIRECTORY, dir_fd=fd), fd
                    os.close(parent)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def resolve(self, relative: str, path: str, info: os.stat_result):
        """``(real path, stat)`` of an entry: itself, or what its link points to."""
        if not stat.S_ISLNK(info.st_mode):
            return path, info
        target = os.path.realpath(path)
        if not self.inside(target) and not self.follow_links:
            raise InputError(f"{self.shown(relative)}: a symbolic link out of the folder "
                             f"(to {target}); pack reads only what lies inside it (copy the "
                             "file in, or follow links with --follow-links)")
        try:
            if self.inside(target):  # looked at from the root, no link followed on the way
                folder, name = os.path.split(target)
                fd = self.open_folder(folder)
                try:
                    return target, os.stat(name, dir_fd=fd, follow_symlinks=False)
                finally:
                    os.close(fd)
            return target, os.stat(target)
        except OSError as error:
            raise InputError(f"{self.shown(relative)}: a symbolic link to {target}, which "
                             f"cannot be read: {error.strerror or error}") from None


def _entries(walk: _Walk, prefix: str, real: str) -> list[tuple[str, os.stat_result]]:
    """The folder's entries that are not hidden, with their ``lstat``."""
    try:
        fd = walk.open_folder(real)
        try:
            with os.scandir(fd) as scan:
                return sorted((entry.name, entry.stat(follow_symlinks=False))
                              for entry in scan if not entry.name.startswith("."))
        finally:
            os.close(fd)
    except OSError as error:
        raise InputError(f"{walk.shown(prefix) if prefix else walk.folder}: cannot list: "
                         f"{error.strerror or error}") from None
