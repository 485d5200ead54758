"""Raw files cut into units once per node: the ranks of a node building a dataset over the same
source share one cut (the files' units and metadata), as they share a large manifest.

``NodeUnits(source, index, share)`` touches nothing until raw files are found. When a
folder's listing first shows Parquet or Arrow files, ``lead()`` tries the source's lock in
the node's shared folder (``shards.shared.shared_folder``, ``share_manifest``'s) without
waiting: the process that gets it is the source's *leader* and cuts while it lists
(``UnitsAhead``); the others list the source meanwhile. ``units()`` then waits for the lock
(for a list or a pattern of files, the first process there leads). Whoever holds it uses
the entry it finds when the entry describes exactly the files just found (names, sizes,
tags, in order), else cuts them and publishes a new entry (a temporary file renamed into
place). A job started again on the same node (after a crash) finds its entry too, unless a
file changed. A source of shards takes no lock and writes no file.

Entry files: a 16-byte magic, the header's length (8 bytes, little-endian), the header
(JSON: the files as ``[name, size, tag]``, the digest of the JSON Lines unit index the units
came from (an index corrected in place is a new one), and each file's units as ``[part, rows,
first_row, end]`` and its metadata's length), then the metadata bytes in the files' order.
The folder is the user's alone (made 0700, checked as for manifests), nothing is opened
through a link, and an entry is read only if it is a regular file of the user that no one
else may write; one that is not exactly well formed, or describes other files, is ignored and
replaced: sharing never makes a build fail. The metadata (a Parquet footer) is
parsed again when a unit is read, and checked against the unit's rows there.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Sequence

from wdstream.shards.shared import shared_folder
from wdstream.tables.files import RawFile
from wdstream.tables.formats import MAX_UNIT_ROWS, FileUnits, Unit

log = logging.getLogger(__name__)

MAGIC = b"wdstream-units\x00\x00"
SUFFIX = ".units"
_LENGTH = 8  # bytes of the header's length


class NodeUnits:
    """The node's units of one raw source (see the module docstring). ``share``: True (the
    default folder), a directory, or False (each process cuts alone); ``index``: the JSON
    Lines unit index the units come from, part of what names the entry. ``leader``: whether
    this process holds the source's lock (or cuts alone). As a context manager, leaving it
    releases the lock."""

    def __init__(self, source: str, index: str | None, share):
        self.source, self.index, self.share = source, index, share
        self.path: str | None = None
        self.leader = False
        self._fd: int | None = None
        self._opened = False
        self._ahead: bool | None = None  # lead()'s answer, once asked

    def lead(self) -> bool:
        """Whether this process cuts the source's files while it lists it: it took the lock
        without waiting and finds no units published there, or units are not shared. Asked
        when the first raw files are listed; the same answer after."""
        if self._ahead is None:
            shared = self._lock(wait=False)
            self._ahead = not shared or (self.leader and self.path is not None
                                         and not os.path.exists(self.path))
        return self._ahead

    def units(self, files: Sequence[RawFile], cut: Callable[[], list[FileUnits]],
              version: str | None = None) -> list[FileUnits]:
        """The units of ``files``: the entry's when it describes them and was made from the
        same ``version`` of the index (its digest), else ``cut()``'s, published for the
        others."""
        if not self._lock(wait=True) or self.path is None:  # the leader is done (or gone),
            # or nothing is shared
            return cut()
        found = read_entry(self.path, files, version)
        if found is not None:
            return found
        file_units = cut()
        write_entry(self.path, files, file_units, version)
        return file_units

    def _lock(self, wait: bool) -> bool:
        """Take the source's lock (``wait`` False: only if it is free); False when units
        are not shared."""
        if not self._opened:
            self._open()
        if self._fd is None:
            return False
        if not self.leader:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                self.leader = True
            except BlockingIOError:
                pass
        return True

    def _open(self) -> None:
        """The entry's path and its lock file's descriptor, or neither (each process then
        cuts alone, the leader of its own units)."""
        self._opened = True
        share = self.share
        folder = shared_folder(None if share is True else share) if share else None
        if folder is not None:
            key = hashlib.sha256(json.dumps([self.source, self.index]).encode()).hexdigest()
            path = os.path.join(folder, key[:32] + SUFFIX)
            try:
                self._fd = os.open(path + ".lock",
                                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                self.path = path
                return
            except OSError as error:
                log.warning("%s: units are not shared (%s)", path, error)
        self.leader = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def __enter__(self) -> NodeUnits:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_entry(path: str, files: Sequence[RawFile], file_units: Sequence[FileUnits],
                version: str | None = None) -> None:
    """Publish the entry of ``files``' ``file_units`` (made from the index of digest
    ``version``) at ``path``; a failure is only logged."""
    header = json.dumps({
        "files": [[f.name, f.size, f.tag] for f in files], "index": version,
        "units": [[[[u.part, u.rows, u.first_row, u.end] for u in p.units], len(p.metadata)]
                  for p in file_units]}, separators=(",", ":")).encode()
    out = None
    try:
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), prefix=".units-",
                                         delete=False) as out:
            out.write(MAGIC + len(header).to_bytes(_LENGTH, "little") + header)
            for cut in file_units:
                out.write(cut.metadata)
        os.replace(out.name, path)
    except OSError as error:
        log.warning("%s: the units are not shared (%s)", path, error)
        if out is not None:
            with contextlib.suppress(OSError):
                os.unlink(out.name)


def read_entry(path: str, files: Sequence[RawFile], version: str | None = None
               ) -> list[FileUnits] | None:
    """The units the entry at ``path`` holds when it is well formed, describes exactly
    ``files`` and was made from the index of digest ``version``; None otherwise (missing,
    stale, damaged)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as entry:
        info = os.fstat(entry.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() \
                or info.st_mode & 0o022:
            log.warning("%s: not a file of this user alone; cut again", path)
            return None
        data = entry.read()
    try:
        return _parsed(data, files, version)
    except (ValueError, TypeError, KeyError, IndexError) as error:
        log.warning("%s: a damaged entry, cut again (%s)", path, error)
        return None


def _parsed(data: bytes, files: Sequence[RawFile], version: str | None
            ) -> list[FileUnits] | None:
    start = len(MAGIC) + _LENGTH
    if data[:len(MAGIC)] != MAGIC:
        raise ValueError("no magic")
    length = int.from_bytes(data[len(MAGIC):start], "little")
    header = json.loads(data[start:start + length])
    if header["files"] != [[f.name, f.size, f.tag] for f in files] or \
            header.get("index") != version:
        return None  # other files, changed ones, or another index: cut again
    if len(header["units"]) != len(files):
        raise ValueError("not units per file")
    file_units, at = [], start + length
    for file, (units, size) in zip(files, header["units"], strict=True):
        if type(size) is not int or not 0 <= size <= file.size or at + size > len(data):
            raise ValueError("metadata longer than its file, or past the end")
        file_units.append(FileUnits([_unit(item) for item in units], data[at:at + size]))
        at += size
    if at != len(data):
        raise ValueError("bytes after the metadata")
    return file_units


def _unit(item) -> Unit:
    part, rows, first, end = item
    if not all(type(v) is int and v >= 0 for v in item) or not 0 < rows <= MAX_UNIT_ROWS:
        raise ValueError(f"not a unit: {item!r}")
    return Unit(part, rows, first, end)
