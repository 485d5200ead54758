"""Byte ranges of a raw file through wdstream's readers (``read_at``: one request for a small
range, ``open_read``'s stream for a large one), and the check that a file is still the one
planned: on S3 and GCS through the sdk reader, by the store on every GET of a range (the
listed ETag as ``If-Match``, the generation as ``ifGenerationMatch``); elsewhere by asking
for the file's size and tag before a unit is read (``check_unchanged``)."""

from __future__ import annotations

from dataclasses import dataclass

from wdstream.errors import ShardError, ShardMismatchError
from wdstream.limits import Limits
from wdstream.printable import printable
from wdstream.sources import urls
from wdstream.sources.openers import open_read
from wdstream.sources.range_reads import checks_version, read_at
from wdstream.tables.files import RawFile, describe

_VERSIONS = {"s3": ("ETag", "etag"), "gs": ("generation",)}  # the tags a store checks on GETs


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
    data = read_at(file.url, start, length, opener=access.opener, timeout=access.timeout,
                   size=file.size, version=planned_version(file))
    if len(data) < length:
        raise ShardMismatchError(
            f"{printable(file.url)}: ended at byte {start + len(data)}; {file.size} bytes "
            "were planned (truncated since)")
    return data


def open_file(file: RawFile, access: Access):
    """``file`` as a read stream from its start (``open_read``), its version checked as
    ``read_range``'s are."""
    return open_read(file.url, opener=access.opener, timeout=access.timeout, size=file.size,
                     version=planned_version(file))


def planned_version(file: RawFile) -> str | None:
    """The version the store checks ``file``'s GETs against: an S3 object's listed ETag, a GCS
    object's generation; None for other files (or a tag of another kind)."""
    kind, _, value = file.tag.partition(":")
    if not value or kind not in _VERSIONS.get(urls.scheme(file.url), ()):
        return None
    return value


def reads_check_version(file: RawFile, access: Access) -> bool:
    """Whether every read of ``file`` has the store check its planned version."""
    return planned_version(file) is not None and checks_version(file.url, access.opener)


def check_unchanged(file: RawFile) -> None:
    """ShardMismatchError when ``file`` is no longer the one planned (its size or its
    content tag changed)."""
    now = describe(file.url, file.name)
    if (now.size, now.tag) != (file.size, file.tag):
        raise ShardMismatchError(
            f"{printable(file.url)}: changed since the plan ({now.size} bytes, "
            f"{now.tag or 'no tag'}; planned {file.size} bytes, {file.tag or 'no tag'}); "
            "build the dataset again to stream it as it is now")
