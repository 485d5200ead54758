"""What the ranged reader (``ranged.py``) asks of a store: one GET of a byte range, and its
response's size, version and status. One small fetcher per store; the scheduling of parts
(how many, how large, in order, retried) is the reader's and the same for all of them.

``Fetcher.get(begin, last, version)`` returns a ``RangeResponse`` (``partial``: the store
honoured the range and the body starts at ``begin``; else the body is the whole object),
raises ``PastEnd(size)`` when ``begin`` is at or past the object's end, ``ObjectChanged`` when
the store says the object is no longer ``version``, or the store's own exception for anything
else, which ``failures.stream_error`` classifies (missing, denied, transient).

The S3 fetcher is ``s3_ranges.py`` (presigned GETs, ``If-Match`` on the ETag), the GCS one
``gcs_ranges.py``; both raise ``HttpStatusError`` for a status the store's own client would
have raised as its error.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable

from wdstream.errors import ShardMismatchError
from wdstream.printable import redact

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
ERROR_BODY_LIMIT = 16 << 10  # bytes of an error response read for its message, at most


class PastEnd(Exception):  # noqa: N818 - a signal, not a failure
    """The range starts at or past the object's end; ``size`` is the object's size."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


class ObjectChanged(Exception):  # noqa: N818 - the reader turns it into its StreamError
    """The store says the object is not the version the earlier responses read."""


def not_the_version(url: str, version: str | None) -> ShardMismatchError:
    """The error for a read that expected ``version`` (a plan's ETag or generation) of the
    object at ``url``, which the store no longer holds."""
    return ShardMismatchError(f"{url}: changed since the plan (the store no longer holds "
                              f"version {version}); build the dataset again to stream it as "
                              "it is now")


class HttpStatusError(Exception):
    """A response with a status other than 200/206 (``code``), with the store's message
    (redacted: a server may echo the signed URL it was asked for)."""

    def __init__(self, code: int, message: str):
        super().__init__(f"HTTP {code}: {redact(message)}" if message else f"HTTP {code}")
        self.code = code


class RangeResponse:
    """One response: ``partial`` (206 with the range asked for), ``first`` (the body's first
    byte), ``size`` (the object's), ``version`` (ETag, generation; None if not said),
    ``content_range`` (for messages); ``readinto(buffer)`` the body (``LargeReads.readinto``),
    ``close()`` once done."""

    __slots__ = ("close", "content_range", "first", "partial", "readinto", "size", "version")

    def __init__(self, *, partial: bool, first: int, size: int, version: str | None,
                 readinto: Callable[[memoryview], int], close: Callable[[], None],
                 content_range: str = ""):
        self.partial, self.first, self.size, self.version = partial, first, size, version
        self.readinto, self.close, self.content_range = readinto, close, content_range


def parse_content_range(value: str | None) -> tuple[int, int] | None:
    """``(first byte, object size)`` from ``bytes FIRST-LAST/SIZE``, else None."""
    match = _CONTENT_RANGE.fullmatch(str(value or "").strip())
    if not match:
        return None
    first, _last, size = (int(g) for g in match.groups())
    return first, size


def range_response(status: int | None, content_range: str | None, content_length,
                   version: str | None, body) -> RangeResponse:
    """The ``RangeResponse`` of a 200/206 response: a 206's ``Content-Range`` gives its first
    byte and the object's size, else the body is the whole object of ``content_length``
    bytes. ``body`` (``LargeReads``) is closed, and ``HttpStatusError`` raised, when neither
    says the size."""
    content_range = str(content_range or "")
    parsed = parse_content_range(content_range) if status == 206 else None
    if parsed is None:
        length = str(content_length if content_length is not None else "")
        if not length.isdigit():
            body.close()
            raise HttpStatusError(status or 0, "a response without its length")
        parsed = 0, int(length)  # the whole object (an empty one: no range)
        partial = False
    else:
        partial = True
    first, size = parsed
    return RangeResponse(partial=partial, first=first, size=size, version=version,
                         readinto=body.readinto, close=body.close, content_range=content_range)


def unsatisfied_range_size(value: str | None) -> int | None:
    """The object's size from a 416's ``bytes */SIZE``, else None."""
    value = str(value or "")
    if value.startswith("bytes */") and value[8:].isdigit():
        return int(value[8:])
    return None


class Fetcher(abc.ABC):
    """Ranged GETs of one object (``url``). ``scheme`` names the ``Link`` the reader shares
    with the other bodies of the process on the same store."""

    url: str
    scheme: str

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Make or take the process's client (called in the reader's thread, before any get)."""

    @abc.abstractmethod
    def get(self, begin: int, last: int | None, version: str | None) -> RangeResponse:
        """Bytes ``begin`` to ``last`` (None: to the end), of ``version`` if given."""

    def check_end(self, version: str | None) -> str | None:
        """After the last byte: why the object read is not ``version`` any more, if a store
        whose responses do not say their version can tell (None: nothing to say)."""
        return None
