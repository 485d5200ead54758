"""GCS objects through the ranged reader's JSON API client (``gcs_ranges.py``) rather than
gcsfs: what the store says of an object (its size and generation, whether it exists), alone
or with its first bytes, and a folder's listing, page by page. The S3 counterpart is
``s3_objects.py``."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

from wdstream.errors import StreamError
from wdstream.limits import json_loads
from wdstream.sources import urls
from wdstream.sources.failures import stream_error
from wdstream.sources.gcs_ranges import GcsRanges, gcs_client, status_error
from wdstream.sources.range_fetchers import HttpStatusError

TIMEOUT = 60.0  # seconds, for these requests made outside a body's read
LIST_PAGE_SIZE = 1000  # objects per page of a listing (GCS's most)
LIST_PAGE_LIMIT = 64 << 20  # bytes of one page of a listing: 1,000 objects' metadata is ~1 MB
# what a listing's objects are asked for (a tenth of their whole metadata)
LIST_FIELDS = "items(name,size,generation,updated),prefixes,nextPageToken"


def describe(url: str, timeout: float = TIMEOUT) -> dict:
    """``{"size": bytes, "generation": ...}`` of the GCS object at ``url``, from its metadata
    (one request with the reader's client, without loading gcsfs). Raises ``HttpStatusError``
    (a missing object: 404)."""
    fetcher = GcsRanges(url, timeout)
    fetcher.connect()
    metadata = fetcher.metadata()
    return {"size": int(metadata["size"]), "generation": metadata["generation"]}


def exists(url: str, timeout: float = TIMEOUT) -> bool:
    """Whether the GCS object at ``url`` exists (its metadata asked with the reader's client,
    without loading gcsfs); failures other than "not found" raise StreamError naming it."""
    try:
        describe(url, timeout)
    except HttpStatusError as exc:
        if exc.code == 404:
            return False
        raise stream_error(url, exc) from exc
    except StreamError:
        raise
    except Exception as exc:
        raise stream_error(url, exc) from exc
    return True


def head_and_start(url: str, nbytes: int, timeout: float = TIMEOUT) -> tuple[dict, bytes]:
    """What ``describe`` tells of the GCS object at ``url``, and its first ``nbytes`` bytes
    (fewer when the object is shorter), by one ranged download: a round trip less for an
    object that is often read whole right after (an emulator, whose downloads do not say the
    generation, is asked its metadata first). Raises ``HttpStatusError`` (a missing object) or
    ``PastEnd`` (an empty one, which has no byte 0)."""
    fetcher = GcsRanges(url, timeout)
    fetcher.connect()
    response = fetcher.get(0, nbytes - 1, None)
    start = memoryview(bytearray(nbytes))
    filled = 0
    try:
        while filled < nbytes:  # a server that ignored the range: the rest is not read
            count = response.readinto(start[filled:])
            if not count:
                break
            filled += count
    finally:
        response.close()
    return {"size": response.size, "generation": response.version}, bytes(start[:filled])


def list_folder(url: str, recursive: bool = False, timeout: float = TIMEOUT,
                on_page: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """What lies in the folder ``url`` (``gs://bucket/prefix/``), as fsspec lists it: an
    entry per object (``name`` "bucket/name", ``type`` "file", ``size``, ``generation``,
    ``updated``) and, unless ``recursive``, per subfolder (``type`` "directory"); an object
    named like the folder itself (a "folder marker") is left out. Empty when no object is
    there; a missing bucket raises StreamError, as do refused credentials and a page that is
    not a listing. ``on_page`` is called with each page's entries (``LIST_PAGE_SIZE``
    objects) as it comes, before the next is asked for."""
    bucket, key = urls.bucket_key(url)
    prefix = key if not key or key.endswith("/") else key + "/"
    client = gcs_client(timeout)
    query = {"prefix": prefix, "maxResults": str(LIST_PAGE_SIZE), "fields": LIST_FIELDS,
             **({} if recursive else {"delimiter": "/"})}
    entries: list[dict] = []
    token = None
    tokens: set[str] = set()  # a server handing out a token twice would list forever
    while True:
        page = _list_page(url, client, bucket, query if token is None
                          else {**query, "pageToken": token})
        found = _page_entries(url, bucket, prefix, page)
        entries += found
        if on_page is not None:
            on_page(found)
        token = page.get("nextPageToken")
        if not token:
            return entries
        if not isinstance(token, str):
            raise StreamError(url, "the listing's page token is not a string")
        if token in tokens:
            raise StreamError(url, "the listing gave the same page token twice")
        tokens.add(token)


def _list_page(url: str, client, bucket: str, query: dict[str, str]) -> dict:
    """One page of the listing, parsed (its failures as StreamErrors naming ``url``)."""
    request = f"{client.endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?" \
              + urllib.parse.urlencode(query)
    try:
        response = client.get(request, {}, stream=True)
    except Exception as exc:
        raise stream_error(url, exc) from exc
    try:
        if response.status == 404:
            raise StreamError(url, f"bucket {bucket!r} not found (or not accessible)")
        if response.status != 200:
            raise stream_error(url, status_error(client, response))
        body = response.read(LIST_PAGE_LIMIT + 1)
    except StreamError:
        raise
    except Exception as exc:
        raise stream_error(url, exc) from exc
    finally:
        response.close()
    if len(body) > LIST_PAGE_LIMIT:
        raise StreamError(url, f"a page of the listing is over {LIST_PAGE_LIMIT} bytes")
    try:
        page = json_loads(body)
    except ValueError as exc:
        raise StreamError(url, f"a page of the listing is not JSON ({exc})") from None
    if not isinstance(page, dict):
        raise StreamError(url, "a page of the listing is not a JSON object")
    return page


def _page_entries(url: str, bucket: str, prefix: str, page: dict) -> list[dict]:
    """fsspec's entries of a page's objects and subfolders under ``prefix``."""
    items, folders = page.get("items", []), page.get("prefixes", [])
    if not isinstance(items, list) or not isinstance(folders, list):
        raise StreamError(url, "a page of the listing has no list of objects")
    found = []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        size = item.get("size") if isinstance(item, dict) else None
        if not isinstance(name, str) or not isinstance(size, str | int) \
                or not str(size).isdigit():
            raise StreamError(url, "an object of the listing has no name or size")
        if name.startswith(prefix) and name != prefix:
            found.append({"name": f"{bucket}/{name}", "type": "file", "size": int(size),
                          "generation": str(item.get("generation") or ""),
                          "updated": item.get("updated")})
    for folder in folders:
        if not isinstance(folder, str):
            raise StreamError(url, "a subfolder of the listing is not a name")
        if folder.startswith(prefix) and folder.rstrip("/") != prefix.rstrip("/"):
            found.append({"name": f"{bucket}/{folder.rstrip('/')}", "type": "directory",
                          "size": 0})
    return found
