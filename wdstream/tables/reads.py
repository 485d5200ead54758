"""Byte ranges of a raw file through wdstream's readers (``read_at``: one request for a small
range, ``open_read``'s body for a large one), and the check that a file is still the one
planned: on S3 and GCS through the sdk reader, by the store on every GET of a range (the
listed ETag as ``If-Match``, the generation as ``ifGenerationMatch``); a local file by its
identity (device, inode, change time) on the descriptor each read opens, never blocking and
only if it is a regular file; elsewhere by asking for the file's size and tag before a unit
is read (``check_unchanged``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from wdstream.errors import ShardError, ShardMismatchError
from wdstream.limits import Limits
from wdstream.printable import printable
from wdstream.sources import urls
from wdstream.sources.bodies import LocalBody
from wdstream.sources.local_files import Identity, open_regular
from wdstream.sources.openers import open_read
from wdstream.sources.range_reads import checks_version, read_at
from wdstream.sources.stores import store_for
from wdstream.tables.files import RawFile, describe


@dataclass(frozen=True)
class Access:
    """How files are read: the opener (None: the default for each URL), the timeout, and
    the ``wdstream.Limits`` of what they may expand to (None: the defaults)."""

    opener: str | None = None
    timeout: float = 60.0
    limits: Limits | None = None


def read_range(file: RawFile, start: int, length: int, access: Access) -> bytes:
    """``length`` bytes of ``file`` from ``start`` (``sources.range_reads.read_at``: one
    request for a small range); a file that ends sooner is a ShardMismatchError (it is
    shorter than planned)."""
    if start < 0 or length < 0 or start + length > file.size:
        raise ShardError(f"{printable(file.url)}: bytes {start}..{start + length} lie outside "
                         f"its {file.size} bytes")
    if file.identity is not None:  # a local file: the one planned, read where it is
        with _open_local(file) as local:
            data = _pread(local, start, length)
    else:
        data = read_at(file.url, start, length, opener=access.opener, timeout=access.timeout,
                       size=file.size, version=planned_version(file))
    if len(data) < length:
        raise ShardMismatchError(
            f"{printable(file.url)}: ended at byte {start + len(data)}; {file.size} bytes "
            "were planned (truncated since)")
    return data


def open_file(file: RawFile, access: Access):
    """``file``'s body from its start (``open_read``), its version checked as
    ``read_range``'s are."""
    if file.identity is not None:
        return LocalBody(file.url, _open_local(file))
    return open_read(file.url, opener=access.opener, timeout=access.timeout, size=file.size,
                     version=planned_version(file))


def _open_local(file: RawFile):
    """The local ``file`` opened as ``sources.local_files.open_regular`` opens (never
    blocking; a ShardError if it is no regular file now), if it is still the file planned:
    its device, inode and change time (a file or a link put there since, even with the size
    and modification time copied, is a ShardMismatchError)."""
    body = open_regular(urls.local_path(file.url), error=ShardError, reader="wdstream")
    now = Identity.of(os.fstat(body.fileno()))
    if now != file.identity:
        body.close()
        raise ShardMismatchError(f"{printable(file.url)}: replaced since the plan (another "
                                 "file is there now, or it was changed); build the dataset "
                                 "again to stream it as it is now")
    return body


def _pread(body, start: int, length: int) -> bytes:
    """``length`` bytes from ``start`` of an open file; fewer only where it ends."""
    parts, at = [], start
    while at < start + length:
        part = os.pread(body.fileno(), start + length - at, at)
        if not part:
            break
        parts.append(part)
        at += len(part)
    return b"".join(parts)


def planned_version(file: RawFile) -> str | None:
    """The version the store checks ``file``'s GETs against: an S3 object's listed ETag, a GCS
    object's generation (``Store.version_fields``); None for other files (or a tag of
    another kind)."""
    kind, _, value = file.tag.partition(":")
    if not value or kind not in store_for(file.url).version_fields:
        return None
    return value


def reads_check_version(file: RawFile, access: Access) -> bool:
    """Whether every read of ``file`` has the store check its planned version."""
    return planned_version(file) is not None and checks_version(file.url, access.opener)


def check_unchanged(file: RawFile) -> None:
    """ShardMismatchError when ``file`` is no longer the one planned (its size or its
    content tag changed; a local file's identity: another file is there)."""
    now = describe(file.url, file.name)
    if (now.size, now.tag, now.identity) != (file.size, file.tag, file.identity):
        raise ShardMismatchError(
            f"{printable(file.url)}: changed since the plan ({now.size} bytes, "
            f"{now.tag or 'no tag'}; planned {file.size} bytes, {file.tag or 'no tag'}); "
            "build the dataset again to stream it as it is now")
