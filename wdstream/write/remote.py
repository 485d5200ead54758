"""Inputs of ``wdstream pack`` that are not local paths: s3://, gs://, https:// and any fsspec URL,
and glob patterns over them or over local paths (``s3://raw/2026-*/part-*.parquet``, ``**``).

Everything here is checked before the packer writes anything: a pattern that matches nothing,
a missing object, a missing bucket, refused credentials or an unreachable endpoint is an
``InputError`` naming the URL. A listing gives every object's size, which the packer's progress
shows as bytes read of the total.

Objects are read as streams (``sources.openers.open_read``: a reader thread, 8 MiB read-ahead)
and never copied to a local file; Parquet is read over ranged reads of an fsspec file, one row
group at a time.
"""

from __future__ import annotations

import glob
from typing import NamedTuple

from wdstream.errors import InputError, WdstreamError
from wdstream.sources.clients import filesystem
from wdstream.sources.failures import stream_error
from wdstream.sources.objects import check_bucket
from wdstream.sources.openers import open_read
from wdstream.sources.stores import store_for
from wdstream.write.local_inputs import open_regular

_GLOB_CHARS = ("*", "?", "[")
_PARQUET_BLOCK = 8 << 20  # bytes per ranged read of a Parquet object


class Found(NamedTuple):
    """One input after expansion: its URL, whether it is a folder, and its size in bytes
    (a folder's: the sum of its files')."""

    url: str
    folder: bool
    size: int


def is_remote(url: str) -> bool:
    """Whether ``url`` is read from a store over the network (not stdin, a local path or a
    ``pipe:`` command): ``Store.remote``."""
    return url != "-" and store_for(url).remote


def has_glob(url: str) -> bool:
    """Whether ``url`` is a pattern; in an http(s) URL "?" starts the query, not a pattern."""
    if store_for(url).paths_are_urls:
        url = url.split("?", 1)[0]
        return "*" in url or "[" in url
    return any(char in url for char in _GLOB_CHARS)


def _failure(url: str, error: BaseException) -> InputError:
    """A listing or opening failure as an InputError naming ``url`` ("access denied", ...)."""
    reason = stream_error(url, error)
    text = str(reason)
    return InputError(text if text.startswith(url) else f"{url}: {text}")


def _filesystem(url: str):
    try:
        return filesystem(url)
    except WdstreamError as error:
        raise InputError(str(error)) from None


def _spell(url: str, fs, name: str) -> str:
    """The URL of the filesystem path ``name``, spelled with the scheme the user wrote."""
    protocol = url.split("://", 1)[0]
    if store_for(url).paths_are_urls:
        return name  # http paths are whole URLs
    return f"{protocol}://{fs._strip_protocol(name)}"


def expand_local(pattern: str) -> list[str]:
    """The local paths matching ``pattern`` (``**`` matches folders at any depth), sorted."""
    found = sorted(glob.glob(pattern, recursive=True))
    if not found:
        raise InputError(f"{pattern}: no files match")
    return found


def expand_remote(url: str) -> list[Found]:
    """The object(s) ``url`` names: itself, its folder, or every match of a glob, sorted."""
    if not has_glob(url):
        # S3: one HEAD with botocore, which starts no fsspec I/O thread: the packer's pool
        # can then fork (see pool.PoolWriter). Not an object: a folder, or an error, below.
        try:
            found = store_for(url).quick_size(url)
        except WdstreamError as error:
            raise InputError(str(error)) from None
        if found is not None:
            return [Found(url, False, found)]
    fs, path = _filesystem(url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        info = None
    except Exception as error:  # credentials, permissions, connection: the SDKs' own types
        if not has_glob(url):
            raise _failure(url, error) from None
        info = None
    if info is not None:
        if info.get("type") == "directory":
            return [Found(url, True, sum(size for _, _, size in list_folder(url)))]
        return [Found(url, False, int(info.get("size") or 0))]
    if not has_glob(url):
        check_bucket(url, fs)  # a StreamError if the bucket is missing or refused
        raise InputError(f"{url}: not found")
    try:
        matches = fs.glob(path, detail=True)
    except Exception as error:
        raise _failure(url, error) from None
    listed: list[Found] = []
    for name in sorted(matches):
        entry = matches[name]
        match = _spell(url, fs, name)
        if entry.get("type") == "directory":
            listed.append(Found(match, True, sum(size for _, _, size in list_folder(match))))
        else:
            listed.append(Found(match, False, int(entry.get("size") or 0)))
    if not listed:
        check_bucket(url, fs)  # a StreamError if the bucket is missing or refused
        raise InputError(f"{url}: no objects match")
    return listed


def list_folder(url: str) -> list[tuple[str, str, int]]:
    """``(relative path, URL, size)`` of every file under the remote folder ``url``, sorted."""
    fs, path = _filesystem(url)
    root = fs._strip_protocol(path).rstrip("/")
    try:
        entries = fs.find(root, detail=True)
    except Exception as error:
        raise _failure(url, error) from None
    files = []
    for name, entry in entries.items():
        if entry.get("type") != "file":
            continue
        relative = name[len(root):].lstrip("/") if name.startswith(root) else name
        if not relative or relative.endswith("/"):
            continue  # a "folder marker" object
        files.append((relative, _spell(url, fs, name), int(entry.get("size") or 0)))
    return sorted(files)


def open_body(url: str):
    """The object's body (a ReadAheadBody: read-ahead in a thread)."""
    return open_read(url)


def open_seekable(url: str):
    """A seekable file over ranged reads, for Parquet (footer first, then row groups)."""
    fs, path = _filesystem(url)
    try:
        return fs.open(path, "rb", block_size=_PARQUET_BLOCK, cache_type="readahead")
    except Exception as error:
        raise _failure(url, error) from None


def read_member(url: str, size: int, identity: tuple[int, int] | None = None) -> bytes:
    """The bytes of one file of a folder input (local or remote), checked against its listed
    size, which the shard's layout was computed from, and read no further than one byte past
    it. A local file must be the regular file listed (``identity``: its device and inode)."""
    body = open_body(url) if is_remote(url) else open_regular(url, identity, nofollow=True)
    with body:
        chunks = []
        left = size + 1
        while left > 0 and (chunk := body.read(left)):
            chunks.append(chunk)
            left -= len(chunk)
    content = b"".join(chunks)
    if len(content) != size:
        more = "more than " if left <= 0 else ""
        raise InputError(f"{url}: changed while packing ({size} -> {more}{len(content)} bytes)")
    return content
