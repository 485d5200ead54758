"""Byte ranges of a raw file through wdstream's readers (``open_read``: a local file, the
stores' ranged GETs, fsspec), and the check that a file is still the one planned."""

from __future__ import annotations

from dataclasses import dataclass

from wdstream.errors import ShardError, ShardMismatchError
from wdstream.printable import printable
from wdstream.sources.openers import open_read
from wdstream.tables.files import RawFile, describe


@dataclass(frozen=True)
class Access:
    """How files are read: the opener (None: the default for each URL) and the timeout."""

    opener: str | None = None
    timeout: float = 60.0


def read_range(file: RawFile, start: int, length: int, access: Access) -> bytes:
    """``length`` bytes of ``file`` from ``start``; a file that ends sooner is a
    ShardMismatchError (it is shorter than planned)."""
    if start < 0 or length < 0 or start + length > file.size:
        raise ShardError(f"{printable(file.url)}: bytes {start}..{start + length} lie outside "
                         f"its {file.size} bytes")
    parts = []
    with open_read(file.url, opener=access.opener, timeout=access.timeout, start=start,
                   size=file.size, first_bytes=length) as stream:
        missing = length
        while missing > 0:
            part = stream.read(missing)
            if not part:
                raise ShardMismatchError(
                    f"{printable(file.url)}: ended at byte {start + length - missing}; "
                    f"{file.size} bytes were planned (truncated since)")
            parts.append(part)
            missing -= len(part)
    return b"".join(parts)


def check_unchanged(file: RawFile) -> None:
    """ShardMismatchError when ``file`` is no longer the one planned (its size or its
    content tag changed)."""
    now = describe(file.url, file.name)
    if (now.size, now.tag) != (file.size, file.tag):
        raise ShardMismatchError(
            f"{printable(file.url)}: changed since the plan ({now.size} bytes, "
            f"{now.tag or 'no tag'}; planned {file.size} bytes, {file.tag or 'no tag'}); "
            "build the dataset again to stream it as it is now")
