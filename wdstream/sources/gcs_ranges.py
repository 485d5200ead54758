"""Ranged GETs of one GCS object for the ranged reader (``ranged.py``): the JSON API's media
download, ``GET {endpoint}/download/storage/v1/b/BUCKET/o/NAME?alt=media`` with ``Range``,
over urllib3 (one pool per process), and the object's metadata (``GcsRanges.metadata``; the
object operations on them are ``gcs_objects.py``).

Endpoint and credentials, as gcsfs and the Google SDKs find them
    ``STORAGE_EMULATOR_HOST`` (an emulator: no credentials), else
    ``https://storage.googleapis.com`` with Application Default Credentials from google-auth
    (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the
    attached service account), refreshed as they expire, and once more when GCS refuses a
    token (401: revoked, or expired by GCS's clock), the request then asked again; without
    any, requests go unauthenticated (public buckets). google-auth is imported only then.

Names
    The bucket and the object's name are each one percent-encoded path segment (``/``, ``?``,
    ``#``, ``%``, spaces all encoded; a name of only dots too, which a URL would otherwise
    resolve away), so a name from a manifest fetches exactly that object.

Versions
    A response's generation (``x-goog-generation``, which GCS sends with every download) is
    its version; parts asked once it is known, or given (a plan's), send ``ifGenerationMatch``
    (412 once replaced).
    An emulator (``STORAGE_EMULATOR_HOST``) may not say it: there the object's metadata is
    asked before the first download and again after the last byte, and a different
    generation fails the read (the emulator serves one request at a time, so asking while a
    body is open would wait behind it).

Stored bytes
    Downloads send ``Accept-Encoding: gzip``, so that a ``Content-Encoding: gzip`` object comes
    as stored (GCS would otherwise decompress it and ignore ``Range``); a response encoded
    otherwise than the object is stored (``x-goog-stored-content-encoding``: decompressed on
    the way) fails the read rather than hand over other bytes.

Errors
    Statuses other than 200/206 raise ``HttpStatusError`` (``code``: the status), which
    ``failures.stream_error`` classifies like any store's: 404 missing, 401/403 denied,
    408/429/5xx transient; urllib3's connection errors are transient.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

from wdstream.errors import StreamError
from wdstream.limits import json_loads
from wdstream.printable import printable
from wdstream.sources import urls
from wdstream.sources.body_reads import LargeReads
from wdstream.sources.clients import cached_client
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

if TYPE_CHECKING:
    from google.auth.transport.urllib3 import Request

GCS_ENDPOINT = "https://storage.googleapis.com"
READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
POOL_SIZE = 32  # connections kept per host: parts of the bodies of a process


def endpoint() -> str:
    """The JSON API's root: the emulator's (``STORAGE_EMULATOR_HOST``) or GCS's."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not host:
        return GCS_ENDPOINT
    if "://" not in host:
        host = "http://" + host
    return host.rstrip("/")


def object_path(bucket: str, name: str) -> str:
    """``/b/BUCKET/o/NAME`` with each one path segment (see the module docstring)."""
    return f"/b/{_segment(bucket)}/o/{_segment(name)}"


def _segment(text: str) -> str:
    quoted = urllib.parse.quote(text, safe="")
    if quoted.strip(".") == "":  # "", ".", "..": URL resolution would drop or climb them
        quoted = quoted.replace(".", "%2E")
    return quoted


class _Client:
    """The process's urllib3 pool and credentials (None: anonymous) for one endpoint."""

    def __init__(self, timeout: float):
        import urllib3

        self.endpoint = endpoint()
        self.pool = urllib3.PoolManager(
            num_pools=4, maxsize=POOL_SIZE, retries=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout))
        self.credentials: Any = None  # google-auth's credentials (None: anonymous)
        self.emulator = self.endpoint != GCS_ENDPOINT
        self.anonymous_reason = "an emulator" if self.emulator else None
        if not self.emulator:
            self.credentials, self.anonymous_reason = _default_credentials()
        self._lock = threading.Lock()
        self._auth_request: Request | None = None

    def headers(self, url: str) -> dict[str, str]:
        """Authorization for a request to ``url`` (refreshing the token when it expired)."""
        headers: dict[str, str] = {}
        if self.credentials is None:
            return headers
        with self._lock:
            if self._auth_request is None:
                from google.auth.transport.urllib3 import Request

                self._auth_request = Request(self.pool)
            self.credentials.before_request(self._auth_request, "GET", url, headers)
        return headers

    def get(self, url: str, headers: dict[str, str], stream: bool):
        sent = self.headers(url)
        response = self._request(url, {**sent, **headers}, stream)
        if response.status == 401 and self.credentials is not None:
            # a token GCS no longer takes, though valid by our clock: a new one, and once more
            response.close()
            self._refresh(sent)
            response = self._request(url, {**self.headers(url), **headers}, stream)
        return response

    def _request(self, url: str, headers: dict[str, str], stream: bool):
        return self.pool.request("GET", url, headers=headers, preload_content=not stream,
                                 decode_content=False, redirect=False)

    def _refresh(self, refused: dict[str, str]) -> None:
        """A new token, unless another request already replaced the one ``refused`` carried
        (the parts that met the same 401 refresh it once)."""
        with self._lock:
            current: dict[str, str] = {}
            self.credentials.apply(current)
            if current.get("authorization") == refused.get("authorization"):
                self.credentials.refresh(self._auth_request)


def _default_credentials():
    """(credentials, None) from Application Default Credentials, or (None, why not)."""
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return None, "google-auth is not installed"
    try:
        credentials, _project = google.auth.default(scopes=[READ_SCOPE])
    except DefaultCredentialsError:
        return None, "no Application Default Credentials were found"
    return credentials, None


def gcs_client(timeout: float) -> _Client:
    return cached_client("gcs-json", "gs", timeout, lambda: _Client(timeout))


class GcsRanges(Fetcher):
    """Media downloads of one object with ``Range``; the version is its generation."""

    scheme = "gs"

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout
        bucket, name = urls.bucket_key(url)
        self._path = object_path(bucket, name)
        self._client: _Client | None = None
        self._asked_generation: str | None = None  # from the metadata (an emulator)
        self._lock = threading.Lock()

    def connect(self) -> None:
        self._client = gcs_client(self.timeout)

    def _fail(self, response) -> HttpStatusError:
        return status_error(self._connected(), response)

    def _connected(self) -> _Client:
        """The client ``connect`` took (the reader connects before any get)."""
        if self._client is None:
            raise StreamError(self.url, "read before the client was made")
        return self._client

    def get(self, begin: int, last: int | None, version: str | None) -> RangeResponse:
        client = self._connected()
        if client.emulator:  # which sends no generation with a download, nor checks one
            with self._lock:  # asked before the download: a one-request-at-a-time emulator
                if self._asked_generation is None:  # would hold it behind an open body
                    self._asked_generation = self.metadata()["generation"]
        query = "alt=media" + (f"&ifGenerationMatch={version}" if version is not None else "")
        url = f"{client.endpoint}/download/storage/v1{self._path}?{query}"
        # stored bytes as they are (a gzip-encoded object is not transcoded, so Range holds)
        headers = {"Range": f"bytes={begin}-{'' if last is None else last}",
                   "Accept-Encoding": "gzip"}
        response = client.get(url, headers, stream=True)
        status = response.status
        if status not in (200, 206):
            try:
                if status == 412:
                    raise ObjectChanged(f"its generation is no longer {version}")
                if status == 416:
                    raise PastEnd(self._size_past_end(response))
                raise self._fail(response)
            finally:
                response.close()
        why = _not_as_stored(response.headers)
        if why is not None:
            response.close()
            raise StreamError(self.url, f"GCS served it {why}, not its stored bytes")
        got = response.headers
        return range_response(
            status, got.get("Content-Range"),
            got.get("x-goog-stored-content-length") or got.get("Content-Length"),
            got.get("x-goog-generation") or self._asked_generation, LargeReads(response))

    def _size_past_end(self, response) -> int:
        size = unsatisfied_range_size(response.headers.get("Content-Range"))
        return size if size is not None else int(self.metadata()["size"])

    def metadata(self) -> dict[str, str]:
        """The object's generation and size from its metadata."""
        client = self._connected()
        url = f"{client.endpoint}/storage/v1{self._path}?fields=generation,size"
        response = client.get(url, {}, stream=True)
        try:
            if response.status != 200:
                raise self._fail(response)
            body = response.read(ERROR_BODY_LIMIT)  # two fields: a longer body is not theirs
        finally:
            response.close()
        try:
            meta = json_loads(body)
            return {"generation": str(meta["generation"]), "size": str(int(meta["size"]))}
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpStatusError(response.status, f"unreadable object metadata ({exc})") from None

    def check_end(self, version: str | None) -> str | None:
        if self._asked_generation is None:
            return None  # the responses said their generation, or nothing was read
        now = self.metadata()["generation"]
        if now != self._asked_generation:
            return f"generation {self._asked_generation}, then {now}"
        return None


def status_error(client: _Client, response) -> HttpStatusError:
    """The error a response that is not a success stands for, with GCS's message (and why no
    credentials were sent, when the store refused a request without them)."""
    message = _error_message(response)
    if response.status in (401, 403) and client.credentials is None and not client.emulator:
        message += f" (sent without credentials: {client.anonymous_reason})"
    return HttpStatusError(response.status, message)


def _not_as_stored(headers) -> str | None:
    """How the body is encoded otherwise than GCS says the object is stored, or None (as
    stored, or an emulator that does not say how it is stored)."""
    stored = headers.get("x-goog-stored-content-encoding")
    if stored is None:
        return None
    stored, served = _coding(stored), _coding(headers.get("Content-Encoding"))
    if served == stored:
        return None
    if served == "identity":
        return "decompressed (decompressive transcoding of a gzip-encoded object)"
    return "encoded otherwise than it is stored (Content-Encoding)"


def _coding(value: str | None) -> str:
    return (value or "").strip().lower() or "identity"


def _error_message(response) -> str:
    """GCS's own message from an error body (JSON or text; of a streamed response, its first
    ``ERROR_BODY_LIMIT`` bytes), cut short and escaped."""
    try:
        body = response.read(ERROR_BODY_LIMIT) or (response.data or b"")[:ERROR_BODY_LIMIT]
    except Exception:  # noqa: BLE001 - a body that cannot be read says nothing more
        return ""
    try:
        message = json_loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")
    return printable(" ".join(str(message).split())[:300])
