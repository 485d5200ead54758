"""Ranged GETs of one S3 object for the ranged reader (``ranged.py``).

A part is one GET of a presigned URL over urllib3: botocore signs the object's URL once (and
again every ``RESIGN_AFTER`` seconds, for credentials that rotate), not each part through its
whole request pipeline (parameters, events, endpoint rules, response parsing), whose CPU per
request is taken from the threads that hand the data over (figures: docs/decisions.md). Neither ``Range`` nor ``If-Match`` is part of a presigned URL's signature.
The URL's path goes out as botocore wrote it: a key's ``.`` and ``..`` segments (a name from
someone else's bucket) are not resolved away to another object's name.

botocore still carries what only it knows how to handle
    - A bucket in another region than the client's (301, 307, 400): ``get_object`` follows
      S3's redirect, and this object's later parts go through botocore too.
    - A refused signature (403): expired credentials, a clock skew, a real denial; botocore
      asks again with fresh credentials or says what is wrong, and the next part is signed
      anew.
    - A proxy (the client's configuration, ``HTTP(S)_PROXY`` not bypassed by ``NO_PROXY``) or
      a client certificate: every GET goes through ``get_object`` (``direct_pool`` is None).
    - Missing credentials: signing fails, and ``get_object`` raises botocore's own error.

Statuses
    412 (``If-Match``: the ETag changed) raises ``ObjectChanged``; 416 raises ``PastEnd`` with
    the size S3 tells (``Content-Range: bytes */SIZE`` or the error's ``ActualObjectSize``); the
    others raise ``HttpStatusError`` with S3's error code, which ``failures.stream_error``
    classifies: 404 missing, 408/429/5xx transient. An error body is read up to
    ``ERROR_BODY_LIMIT`` bytes and only its ``Code``, ``Message`` and ``ActualObjectSize`` are
    kept, escaped.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

from wdstream.printable import printable
from wdstream.sources import urls
from wdstream.sources.body_reads import LargeReads
from wdstream.sources.clients import cached_client, s3_ca_bundle, s3_client
from wdstream.sources.range_fetchers import (
    ERROR_BODY_LIMIT,
    Fetcher,
    HttpStatusError,
    ObjectChanged,
    PastEnd,
    RangeResponse,
    range_response,
    unsatisfied_range_size,
)

SIGNED_FOR = 3600  # seconds a presigned URL is valid
RESIGN_AFTER = 600  # seconds after which a part is sent with a URL signed anew
POOL_SIZE = 32  # connections kept per host, as the botocore client's pool
_BOTOCORE_STATUSES = (301, 307, 400)  # a region to follow: botocore for this object
_XML_FIELD = re.compile(rb"<(Code|Message|ActualObjectSize)>([^<]{0,300})</\1>")


def direct_pool(timeout: float):
    """The process's urllib3 pool for presigned GETs, or None where GETs must go through
    botocore (a proxy or a client certificate, see above). Decided once per process and
    environment (the proxy variables are among the settings a client is kept for), not at
    each object's first GET: urllib's proxy lookup walks the whole environment."""
    return cached_client("s3-direct", "s3", timeout, lambda: _direct_or_false(timeout)) or None


def _direct_or_false(timeout: float):
    client = s3_client(timeout)
    config = client.meta.config
    if getattr(config, "proxies", None) or getattr(config, "client_cert", None):
        return False
    endpoint = urllib.parse.urlsplit(client.meta.endpoint_url)
    if urllib.request.getproxies().get(endpoint.scheme) \
            and not urllib.request.proxy_bypass(endpoint.hostname or ""):
        return False
    return _make_pool(timeout)


def _make_pool(timeout: float):
    import urllib3

    return urllib3.PoolManager(num_pools=4, maxsize=POOL_SIZE, retries=False,
                               timeout=urllib3.Timeout(connect=timeout, read=timeout),
                               ca_certs=s3_ca_bundle())


class S3Ranges(Fetcher):
    """Ranged GETs of one object; the version is its ETag, sent as ``If-Match``."""

    scheme = "s3"

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout
        self.bucket, self.key = urls.bucket_key(url)
        self._client: Any = None  # botocore's S3 client (botocore ships no types)
        self._pool = None  # None: every GET through botocore
        self._signed: tuple[str, float] | None = None  # (URL, when signed)
        self._lock = threading.Lock()

    def connect(self) -> None:
        self._client = s3_client(self.timeout)
        self._pool = direct_pool(self.timeout)

    def get(self, begin: int, last: int | None, version: str | None) -> RangeResponse:
        if self._pool is not None:
            response = self._get_presigned(begin, last, version)
            if response is not None:
                return response
        return self._get_object(begin, last, version)

    def _signed_url(self) -> str | None:
        """The object's presigned GET URL (None: it cannot be signed, botocore will say why)."""
        with self._lock:
            now = time.monotonic()
            if self._signed is None or now - self._signed[1] > RESIGN_AFTER:
                from botocore.exceptions import BotoCoreError

                try:
                    url = self._client.generate_presigned_url(
                        "get_object", Params={"Bucket": self.bucket, "Key": self.key},
                        ExpiresIn=SIGNED_FOR)
                except BotoCoreError:  # no credentials, a bad configuration
                    return None
                self._signed = (url, now)
            return self._signed[0]

    def _get_presigned(self, begin: int, last: int | None,
                       version: str | None) -> RangeResponse | None:
        """The GET of a presigned URL; None when botocore must ask instead (see above)."""
        url = self._signed_url()
        pool = self._pool
        if url is None or pool is None:
            return None
        headers = {"Range": _range(begin, last)}
        if version is not None:
            headers["If-Match"] = version
        # the request target as signed: urllib3's request() would resolve a key's "." and
        # ".." segments away, and fetch another object
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        response = pool.connection_from_url(url).urlopen(
            "GET", target, headers=headers, preload_content=False, decode_content=False,
            redirect=False)
        status = response.status
        if status in (200, 206):
            got = response.headers
            return range_response(status, got.get("Content-Range"), got.get("Content-Length"),
                                  got.get("ETag"), LargeReads(response))
        try:
            fields = _error_fields(response)
        finally:
            response.close()
        if status in _BOTOCORE_STATUSES:
            self._pool = None
            return None
        if status == 403:
            with self._lock:
                self._signed = None
            return None
        if status == 412:
            raise ObjectChanged(f"its ETag is no longer {version}")
        if status == 416:
            size = _size_past_end(response.headers.get("Content-Range"),
                                  fields.get("ActualObjectSize"))
            if size is not None and begin >= size:
                raise PastEnd(size)
        message = ": ".join(value for value in (fields.get("Code"), fields.get("Message"))
                            if value)
        raise HttpStatusError(status, message)

    def _get_object(self, begin: int, last: int | None, version: str | None) -> RangeResponse:
        from botocore.exceptions import ClientError

        request = {"Bucket": self.bucket, "Key": self.key, "Range": _range(begin, last)}
        if version is not None:
            request["IfMatch"] = version
        try:
            response = self._client.get_object(**request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code")
            actual = str(error.get("ActualObjectSize", ""))
            if code == "InvalidRange" and actual.isdigit() and begin >= int(actual):
                raise PastEnd(int(actual)) from exc
            if code == "PreconditionFailed":
                raise ObjectChanged(f"its ETag is no longer {version}") from exc
            raise
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return range_response(status, response.get("ContentRange"),
                              response.get("ContentLength"), response.get("ETag"),
                              LargeReads(response["Body"]))


def _range(begin: int, last: int | None) -> str:
    return f"bytes={begin}-{'' if last is None else last}"


def _error_fields(response) -> dict[str, str]:
    """``Code``, ``Message`` and ``ActualObjectSize`` of an S3 error body, escaped."""
    try:
        body = response.read(ERROR_BODY_LIMIT)
    except Exception:  # noqa: BLE001 - a body that cannot be read says nothing more
        return {}
    fields: dict[str, str] = {}
    for name, value in _XML_FIELD.findall(body or b""):
        fields.setdefault(name.decode(), printable(value.decode("utf-8", "replace")))
    return fields


def _size_past_end(content_range: str | None, actual: str | None) -> int | None:
    size = unsatisfied_range_size(content_range)
    if size is None and actual is not None and actual.isdigit():
        size = int(actual)
    return size
