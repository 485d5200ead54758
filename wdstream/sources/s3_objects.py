"""S3 objects through botocore's client rather than s3fs: what the store says of an object
(HEAD: its size, ETag and version), a folder's listing, deleting one, and uploading one
(``S3Writer``).

A packer's main process and its pool workers then need neither fsspec's I/O thread nor
aiobotocore: the main process stays single-threaded, so its pool forks and the workers start
with botocore and the S3 model already loaded, and a shard goes out as one PUT of the bytes
already in memory, checked by the store against the SHA-256 the shard writer computed anyway.

Uploads send ``UNSIGNED-PAYLOAD`` with a checksum header (``x-amz-checksum-sha256`` from the
caller, else botocore's CRC32), which is what botocore does by default over HTTPS; the
checksum header is signed, and the store rejects a body that does not match it. Over plain
HTTP botocore would otherwise hash every byte once more to sign it.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable

from wdstream.errors import InputError, StreamError
from wdstream.sources import urls
from wdstream.sources.clients import s3_client
from wdstream.sources.failures import is_missing, stream_error
from wdstream.sources.range_fetchers import parse_content_range
from wdstream.sources.writers import Writer

log = logging.getLogger(__name__)

PART_SIZE = 64 << 20  # bytes buffered before a multipart upload sends a part (S3: >= 5 MiB)
TIMEOUT = 60.0
LIST_PAGE_SIZE = 1000  # objects a listing's page holds (S3's most)


def head(url: str, timeout: float = TIMEOUT) -> dict:
    """``{"size": bytes, "ETag": ..., "VersionId": ...}`` of the S3 object at ``url`` (the
    keys s3fs's ``info`` gives; ``VersionId`` only on a versioned bucket), by one HEAD with
    the reader's own client. Raises botocore's errors (a missing object: ``ClientError``)."""
    bucket, key = urls.bucket_key(url)
    response = s3_client(timeout).head_object(Bucket=bucket, Key=key)
    return _described(response, response.get("ContentLength"))


def _described(response: dict, size: int | None) -> dict:
    """``{"size": size, "ETag": ..., "VersionId": ...}`` from a HEAD's or GET's answer."""
    described = {"size": size}
    for name in ("ETag", "VersionId"):
        if response.get(name):
            described[name] = response[name]
    return described


def head_and_start(url: str, nbytes: int, timeout: float = TIMEOUT) -> tuple[dict, bytes]:
    """What ``head`` tells of the S3 object at ``url``, and its first ``nbytes`` bytes (fewer
    when the object is shorter), by one ranged GET instead of a HEAD and then a GET: a round
    trip less for an object that is often read whole right after. ``size`` is None when the
    answer does not tell the whole object's length. Raises botocore's errors (a missing
    object, or an empty one, which has no byte 0: ``ClientError``)."""
    bucket, key = urls.bucket_key(url)
    response = s3_client(timeout).get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{nbytes - 1}")
    body = response["Body"]
    try:
        start = body.read(nbytes)  # a server that ignored the range: the rest is not read
    finally:
        body.close()
    size = None
    parsed = parse_content_range(response.get("ContentRange"))
    if parsed is not None:
        size = parsed[1]
    elif response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 200:
        size = response.get("ContentLength")  # the whole object was the answer
    return _described(response, size), start


def list_folder(url: str, recursive: bool = False, timeout: float = TIMEOUT,
                on_page: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """What lies in the folder ``url`` (``s3://bucket/prefix/``), as fsspec lists it: an
    entry per object (``name`` "bucket/key", ``type`` "file", ``size``, ``ETag``,
    ``LastModified``) and, unless ``recursive``, per subfolder (``type`` "directory"); an
    object named like the folder itself (a "folder marker") is left out. Empty when no
    object is there; a missing bucket raises StreamError, as do refused credentials.
    ``on_page`` is called with each page's entries (``LIST_PAGE_SIZE`` objects) as it comes,
    while the next is asked for."""
    bucket, key = urls.bucket_key(url)
    prefix = key if not key or key.endswith("/") else key + "/"
    pages = iter(s3_client(timeout).get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": LIST_PAGE_SIZE},
        **({} if recursive else {"Delimiter": "/"})))
    entries: list[dict] = []
    while (page := _next_page(url, bucket, pages)) is not None:
        found = [{"name": f"{bucket}/{listed['Key']}", "type": "file",
                  "size": listed.get("Size"), "ETag": listed.get("ETag"),
                  "LastModified": listed.get("LastModified")}
                 for listed in page.get("Contents", ()) if listed["Key"] != prefix]
        found += [{"name": f"{bucket}/{common['Prefix'].rstrip('/')}", "type": "directory",
                   "size": 0} for common in page.get("CommonPrefixes", ())]
        entries += found
        if on_page is not None:
            on_page(found)
    return entries


def _next_page(url: str, bucket: str, pages) -> dict | None:
    """The listing's next page (None after the last), its failures as StreamErrors."""
    try:
        return next(pages, None)
    except Exception as exc:
        if is_missing(exc):
            raise StreamError(url, f"bucket {bucket!r} not found (or not accessible)") from exc
        raise stream_error(url, exc) from exc


def head_size(url: str) -> int | None:
    """The size of the object at ``url``, None if there is none (nor its bucket); other
    failures (refused credentials, unreachable endpoint) raise StreamError naming ``url``."""
    try:
        return int(head(url)["size"])
    except Exception as exc:
        if is_missing(exc):
            return None
        raise stream_error(url, exc) from exc


def delete_object(url: str) -> None:
    """Delete the object at ``url``; a missing one is fine."""
    named = urls.object_key(url)
    if named is None:
        raise InputError(f"{url}: not an object (a bucket or a folder)")
    bucket, key = named
    try:
        s3_client(TIMEOUT).delete_object(Bucket=bucket, Key=key)
    except Exception as exc:
        if not is_missing(exc):
            raise stream_error(url, exc) from exc


class S3Writer(Writer):
    """An upload with botocore: the bytes are kept as written (no copy) and sent by one PUT on
    commit, or, once more than ``PART_SIZE`` is buffered, as the parts of a multipart upload
    completed on commit. The object appears only when the PUT or the completion succeeds;
    abort sends nothing, or aborts the multipart upload."""

    def __init__(self, url: str, part_size: int = PART_SIZE):
        bucket_key = urls.object_key(url)
        if bucket_key is None:
            raise InputError(f"{url}: not an object URL (it names a bucket or ends with /)")
        self._bucket, self._key = bucket_key
        self._part_size = part_size
        self.chunk_size = part_size  # what the shard writer hands over at a time
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._upload_id: str | None = None
        self._parts: list[dict] = []
        try:
            self._client = s3_client(TIMEOUT)
        except Exception as exc:
            raise stream_error(url, exc) from exc
        super().__init__(url)

    def _write(self, data) -> None:
        if not data:
            return
        self._chunks.append(data if type(data) is bytes else bytes(data))
        self._buffered += len(data)
        if self._buffered >= self._part_size:
            self._send_part()

    def _take(self) -> bytes:
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks, self._buffered = [], 0
        return body

    def _send_part(self) -> None:
        target = {"Bucket": self._bucket, "Key": self._key}
        if self._upload_id is None:
            self._upload_id = self._client.create_multipart_upload(**target)["UploadId"]
        number = len(self._parts) + 1
        answer = self._client.upload_part(**target, UploadId=self._upload_id,
                                          PartNumber=number, Body=self._take())
        self._parts.append({"ETag": answer["ETag"], "PartNumber": number})

    def _commit(self) -> None:
        target = {"Bucket": self._bucket, "Key": self._key}
        if self._upload_id is None:
            checksum = ({"ChecksumAlgorithm": "SHA256",  # also stored with the object
                         "ChecksumSHA256": base64.b64encode(self.sha256).decode()}
                        if self.sha256 is not None else {})
            self._client.put_object(**target, Body=self._take(), **checksum)
            return
        if self._buffered:
            self._send_part()
        self._client.complete_multipart_upload(**target, UploadId=self._upload_id,
                                               MultipartUpload={"Parts": self._parts})

    def _abort(self) -> None:
        self._chunks, self._buffered = [], 0
        if self._upload_id is None:
            return
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._key,
                                                UploadId=self._upload_id)
        except Exception as exc:  # an unfinished upload left behind is harmless
            log.warning("could not cancel the upload: %s", stream_error(self.url, exc))
