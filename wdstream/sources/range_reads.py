"""One byte range of an object, read whole: ``read_at(url, start, length)``.

A range of at most ``ONE_REQUEST_BYTES`` (a Parquet footer, a small column chunk) is one
request, made in the caller's thread: ``os.pread`` on a local file, one ranged GET on S3 (a
presigned URL over the ranged reader's urllib3 pool, ``s3_ranges``) and GCS (its JSON API
client, ``gcs_ranges``), one read of a file fsspec opens with a block of the range's size
(whose HTTP files stop reading a server that ignores ``Range``). No ``ReadAheadBody``, no part
threads: for a few KiB those cost more CPU than the request. A transient failure is asked
again as the ranged reader retries a part (``ranged.PART_RETRIES``, ``RETRY_BACKOFF``
doubling); failures are wdstream's errors naming the URL, never a signed URL's secrets
(``failures.stream_error``).

A larger range, and any range through a command (``pipe:``, the cli opener), is read from
``open_read``'s body: concurrent parts where the store has them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from wdstream.errors import StreamError
from wdstream.sources import urls
from wdstream.sources.clients import filesystem
from wdstream.sources.failures import stream_error
from wdstream.sources.openers import open_read, resolve_opener
from wdstream.sources.range_fetchers import ObjectChanged, PastEnd, not_the_version
from wdstream.sources.ranged import PART_RETRIES, RETRY_BACKOFF
from wdstream.sources.stores import store_for

ONE_REQUEST_BYTES = 1 << 20  # at most this many: one request (see above)


def read_at(url: str, start: int, length: int, *, opener: str | None = None,
            timeout: float = 60.0, size: int | None = None, version: str | None = None) -> bytes:
    """``length`` bytes of the object at ``url`` from byte ``start``; fewer only when the
    object ends sooner (the caller says what a short read means). ``opener`` as
    ``open_read``'s; ``size``: the object's size if known (it sizes the body's parts);
    ``version``: its expected ETag or generation, checked by the store on each GET where
    ``checks_version`` says so (another version: ``not_the_version``'s ShardMismatchError)."""
    if start < 0 or length < 0:
        raise StreamError(url, f"bytes {start}..{start + length}: not a range of an object")
    if length == 0:
        return b""
    reader = resolve_opener(opener, url)
    one_request = _ONE_REQUEST.get(reader)
    if one_request is None or length > ONE_REQUEST_BYTES:
        body = open_read(url, opener=opener, timeout=timeout, start=start, size=size,
                           first_bytes=length, version=version)
        with body:
            return _filled(body.read, length)
    attempt = 0
    while True:
        try:
            return one_request(url, start, length, timeout, version)
        except ObjectChanged:
            raise not_the_version(url, version) from None
        except Exception as exc:  # classified: retried when transient, else raised
            error = stream_error(url, exc)
            if not getattr(error, "transient", False) or attempt >= PART_RETRIES:
                raise error from error.__cause__
        time.sleep(RETRY_BACKOFF * 2 ** attempt)
        attempt += 1


def _filled(read: Callable[[int], bytes], length: int) -> bytes:
    """Up to ``length`` bytes from ``read(n)`` calls, fewer only once it gives nothing."""
    parts, missing = [], length
    while missing > 0:
        part = read(missing)
        if not part:
            break
        parts.append(part)
        missing -= len(part)
    return b"".join(parts)


def checks_version(url: str, opener: str | None = None) -> bool:
    """Whether ``read_at`` and ``open_read`` have the store check a ``version`` given for
    ``url``: the sdk reader's GETs of S3 and GCS objects."""
    return resolve_opener(opener, url) == "sdk"


def _pread(url: str, start: int, length: int, timeout: float, version: str | None) -> bytes:
    # O_NONBLOCK: a FIFO named like a data file opens at once, and its pread fails
    fd = os.open(urls.local_path(url), os.O_RDONLY | os.O_NONBLOCK)
    try:
        return _filled(lambda n: os.pread(fd, n, start + length - n), length)
    finally:
        os.close(fd)


def _ranged_get(url: str, start: int, length: int, timeout: float,
                version: str | None) -> bytes:
    """One GET of the range with the ranged reader's fetcher of the store (``If-Match`` or
    ``ifGenerationMatch`` on ``version``; either refused, or another version in the answer:
    ObjectChanged)."""
    fetcher = store_for(url).sdk_fetcher(url, timeout)
    fetcher.connect()
    try:
        response = fetcher.get(start, start + length - 1, version)
    except PastEnd:
        return b""
    buffer = memoryview(bytearray(length))
    try:
        if version is not None and response.version not in (None, version):
            raise ObjectChanged(f"version {response.version}")  # a store that ignored it
        if response.partial and response.first != start:
            raise StreamError(url, f"asked for bytes from {start}, got "
                              f"{response.content_range}")
        skip = 0 if response.partial else start  # the whole object came: read up to start
        while skip:
            count = response.readinto(buffer[:min(skip, length)])
            if not count:
                return b""
            skip -= count
        filled = 0
        while filled < length and (count := response.readinto(buffer[filled:])):
            filled += count
    finally:
        response.close()
    return bytes(buffer[:filled])


def _fsspec_read(url: str, start: int, length: int, timeout: float,
                 version: str | None) -> bytes:
    fs, path = filesystem(url, timeout)
    with fs.open(path, "rb", block_size=length) as file:
        file.seek(start)
        return _filled(file.read, length)


_ONE_REQUEST: dict[str, Callable[[str, int, int, float, str | None], bytes]] = {
    "file": _pread, "sdk": _ranged_get, "fsspec": _fsspec_read}
