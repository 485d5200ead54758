"""Writing, listing and small whole-object operations on local paths, s3://, gs:// and other
fsspec URLs: each asks the URL's store (``stores.store_for``), which does it.

``open_write(url)`` gives a writer that either commits (the object appears, complete) or aborts
(nothing appears; an object already at that URL is left as it was):

- local paths: a temporary file ``.NAME.RANDOM.tmp`` in the same folder, fsync'ed and renamed
  over ``NAME`` on commit, deleted on abort. Missing folders are created.
- ``s3://`` with ``via="auto"``: botocore's client (``s3_objects.S3Writer``): one PUT of the
  buffered bytes, or a multipart upload past 64 MiB; abort sends nothing or aborts the
  multipart upload. No fsspec I/O thread and no aiobotocore, so a packer's pool can fork.
- ``s3://`` with ``via="fsspec"`` and ``gs://`` with "auto" or "fsspec": s3fs / gcsfs upload
  in-process. Chosen over the CLIs because a packer writes many shards: no process start
  per shard (docs/cloud.md), failures arrive as exceptions rather than stderr to parse, and no CLI has to
  be installed. The object appears only when the upload completes (a single PUT, or the
  completion of a multipart / resumable upload); abort cancels the upload.
- ``via="cli"``: the data is piped into ``aws s3 cp - URL``, ``gcloud storage cp - URL`` or
  ``gsutil cp - URL`` (the first of gcloud/gsutil found on PATH). Commit closes the pipe and
  checks the exit status. Abort kills the command before it sees the end of its input: these
  commands create the object only after reading all of it, so nothing can appear.
- other fsspec URLs: the data is spooled to a temporary file and uploaded on commit, since a
  generic back-end has no way to cancel a half-written object.

Every failure (missing bucket or credentials, unreachable endpoint, failed command) is raised as
``StreamError`` naming the URL.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from wdstream.errors import InputError, StreamError, WdstreamError
from wdstream.limits import size_limit, size_variable
from wdstream.printable import printable
from wdstream.sources import urls
from wdstream.sources.failures import stream_error
from wdstream.sources.openers import open_read
from wdstream.sources.stores import store_for
from wdstream.sources.stores.store import listed_size
from wdstream.sources.writers import Writer

VIA = ("auto", "cli", "fsspec")


def open_write(url: str, *, via: str = "auto") -> Writer:
    """A writer for ``url``; ``via`` is "auto", "cli" or "fsspec" (ignored for local paths).

    Use it as a context manager: leaving the block normally commits, by an exception aborts.
    """
    if via not in VIA:
        raise InputError(f"via {via!r}: expected one of {', '.join(VIA)}")
    return store_for(url).open_write(url, via)


# --------------------------------------------------------------------------- whole objects


def settle_uploads(timeout: float = 30.0) -> None:
    """Wait, up to ``timeout`` seconds, for the requests still running in fsspec's I/O loop.

    An upload interrupted in the caller's thread (Ctrl-C) goes on in that loop and may land
    later; a clean-up that deletes what a run wrote calls this first, so that its delete comes
    after every upload of the run. Does nothing when fsspec's loop never started."""
    import sys

    asyn = sys.modules.get("fsspec.asyn")
    loop = asyn.loop[0] if asyn is not None else None
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    import asyncio

    async def others() -> None:
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    try:
        asyncio.run_coroutine_threadsafe(others(), loop).result(timeout + 1)
    except Exception:  # best effort: the delete follows either way
        pass


def write_bytes(url: str, data: bytes, *, via: str = "auto") -> None:
    """Write ``data`` as the whole object at ``url`` (atomically, as ``open_write``)."""
    with open_write(url, via=via) as out:
        out.write(data)


_READ_CHUNK = 1 << 20


def read_bytes(url: str, *, limit: str | int = "object",
               error: type[WdstreamError] = InputError) -> bytes:
    """The whole object at ``url``, read with the default opener, if it has at most ``limit``
    bytes: a kind of ``limits.SIZE_LIMITS`` ("manifest", "config", "tokenizer", "object"),
    whose limit its environment variable may change, or a number of bytes.

    The limit is checked while reading: past it, ``error`` names the URL and the limit,
    having read one byte more than the limit, whatever the object's size (an endless HTTP
    body, ``/dev/zero``). A local path that is not a regular file or a folder (a FIFO, a
    device, a socket) is refused (``error``) before it is opened, so that it cannot block
    the reader."""
    most = size_limit(limit) if isinstance(limit, str) else limit
    _check_special_file(url, error)
    chunks, total = [], 0
    with open_read(url) as body:
        while chunk := body.read(min(_READ_CHUNK, most + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > most:
                how = (f", the most a {limit} may have (set {size_variable(limit)} to change "
                       "it)") if isinstance(limit, str) else ""
                raise error(f"{url}: more than {most:,} bytes{how}")
    return b"".join(chunks)


def _check_special_file(url: str, error: type[WdstreamError]) -> None:
    """``error`` for a local path to a device, FIFO or socket (after symbolic links)."""
    if not store_for(url).local:
        return
    try:
        mode = os.stat(urls.local_path(url)).st_mode
    except OSError:
        return  # missing or unreadable: the opener says so
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise error(f"{url}: not a regular file (a device, FIFO or socket is never read whole)")


def exists(url: str) -> bool:
    """Whether an object (or a local file or folder) exists at ``url``."""
    return store_for(url).exists(url)


def delete(url: str) -> None:
    """Delete the object at ``url``; a missing one is fine."""
    store_for(url).delete(url)


def size(url: str) -> int | None:
    """The object's size in bytes, None when the store does not tell (an HTTP server that
    sends no Content-Length); StreamError (not transient) if it does not exist."""
    return store_for(url).size(url)


def list_files(prefix: str, suffix: str | tuple[str, ...] = ".tar",
               entries: list[dict] | None = None) -> list[tuple[str, int | None]]:
    """``(url, size)`` (None where a remote listing gives none) of
 the files directly in the folder ``prefix`` whose names end with
    ``suffix``, sorted by URL. URLs are spelled like ``prefix`` (``urls.child(prefix, name)``):
    a listed name is only ever a name under ``prefix``, never a URL, a path or a ``pipe:``
    command of its own. ``entries``: a remote folder's listing (``folder_entries``) when
    the caller has it.

    A missing local folder or bucket raises StreamError; on s3/gs a prefix without objects is
    simply empty.
    """
    store = store_for(prefix)
    folder = store.folder_path(prefix)
    found = []
    for entry in store.list(prefix) if entries is None else entries:
        parent, _, name = entry["name"].rstrip("/").rpartition("/")
        if entry.get("type") == "file" and parent == folder and name.endswith(suffix):
            if "::" in name and store.chains_names:
                # generic fsspec URLs chain at "::": the name would become another URL
                raise InputError(f"{prefix}: object {printable(repr(name))} cannot be read "
                                 "by name through fsspec ('::' chains URLs); rename it")
            found.append((urls.child(prefix, name), listed_size(entry.get("size"))))
    return sorted(found)


def folder_path(prefix: str) -> str:
    """The folder ``prefix``'s path as its listing names what lies in it: "bucket/key" on S3
    and GCS (no s3fs nor gcsfs needed), else as its store (its fsspec filesystem) has it."""
    return store_for(prefix).folder_path(prefix)


def folder_entries(prefix: str, on_page: Callable[[list[dict]], None] | None = None
                   ) -> list[dict]:
    """fsspec's entries (``name``, ``type``, ``size`` and the store's fields) of what lies
    directly in the folder ``prefix`` (S3's through botocore, ``s3_objects``; GCS's
    through its JSON API, ``gcs_objects``); empty under an s3/gs prefix without objects (a
    missing bucket raises StreamError). ``on_page``: called with S3's and GCS's pages of
    entries as they come, other stores' whole listing once."""
    return store_for(prefix).list(prefix, on_page=on_page)


def check_bucket(url: str, fs) -> None:
    """For an s3:// or gs:// URL under which nothing was found: a StreamError (AccessError for
    refused credentials) when the bucket itself is missing or cannot be reached, which says
    more than "not found"; nothing for other URLs or an existing bucket."""
    if not store_for(url).buckets:
        return
    bucket, _ = urls.bucket_key(url)
    try:
        found = fs.exists(bucket)
    except Exception as exc:
        raise stream_error(url, exc) from exc
    if not found:
        raise StreamError(url, f"bucket {bucket!r} not found (or not accessible)")
