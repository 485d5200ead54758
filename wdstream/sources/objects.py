"""Writing, listing and small whole-object operations on local paths, s3://, gs:// and other
fsspec URLs.

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

import logging
import os
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable

from wdstream.errors import InputError, StreamError, WdstreamError
from wdstream.limits import size_limit, size_variable
from wdstream.printable import printable
from wdstream.sources import gcs_objects, s3_objects, urls
from wdstream.sources.clients import filesystem
from wdstream.sources.failures import command_failed, stream_error
from wdstream.sources.openers import open_read
from wdstream.sources.processes import ChildProcess, cli_url
from wdstream.sources.writers import Writer

log = logging.getLogger(__name__)

VIA = ("auto", "cli", "fsspec")


def _gcs_write_command(url: str) -> list[str]:
    if shutil.which("gcloud") or not shutil.which("gsutil"):
        return ["gcloud", "storage", "cp", "-", cli_url(url)]
    return ["gsutil", "cp", "-", cli_url(url)]


# scheme -> function(url) building the argument list that uploads stdin to the URL
CLI_WRITE_COMMANDS: dict[str, Callable[[str], list[str]]] = {
    "s3": lambda url: ["aws", "s3", "cp", "--only-show-errors", "-", cli_url(url)],
    "gs": _gcs_write_command,
}


def open_write(url: str, *, via: str = "auto") -> Writer:
    """A writer for ``url``; ``via`` is "auto", "cli" or "fsspec" (ignored for local paths).

    Use it as a context manager: leaving the block normally commits, by an exception aborts.
    """
    if via not in VIA:
        raise InputError(f"via {via!r}: expected one of {', '.join(VIA)}")
    kind = urls.scheme(url)
    if kind == "pipe":
        raise InputError(f"{url}: cannot write to a pipe: source")
    if kind == "file":
        return _LocalWriter(url, urls.to_local_path(url))
    if via == "cli":
        if kind not in CLI_WRITE_COMMANDS:
            raise InputError(f"{url}: no command-line uploader for {kind}:// (cli writes s3:// "
                             "and gs://)")
        return _CliWriter(url, CLI_WRITE_COMMANDS[kind](url))
    if kind == "s3" and via == "auto":
        if s3_objects.is_object_url(url):
            return s3_objects.S3Writer(url)
    if kind in ("s3", "gs"):
        return _CloudWriter(url)
    return _SpooledWriter(url)


class _LocalWriter(Writer):
    def __init__(self, url: str, path: str):
        self.path = os.path.abspath(path)
        folder, name = os.path.split(self.path)
        # Our own name rather than mkstemp: mkstemp's mode 0600 would stick to the shard.
        self._temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise stream_error(url, exc) from exc
        self._file = os.fdopen(fd, "wb")
        super().__init__(url)

    def _write(self, data):
        self._file.write(data)

    def _commit(self):
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._temp, self.path)
        _fsync_folder(os.path.dirname(self.path))

    def _abort(self):
        try:
            self._file.close()
        except OSError:
            pass  # a full disk failing the last flush: the file is deleted anyway
        try:
            os.unlink(self._temp)
        except FileNotFoundError:
            pass


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable; not every filesystem allows it, which is fine."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _CloudWriter(Writer):
    """s3fs / gcsfs streaming upload: parts go out as the buffer fills; the object appears when
    the file is closed. ``discard`` aborts the multipart (s3fs) or resumable (gcsfs) upload."""

    def __init__(self, url: str):
        fs, path = filesystem(url)
        try:
            self._file = fs.open(path, "wb")
        except Exception as exc:
            raise stream_error(url, exc) from exc
        super().__init__(url)

    def _write(self, data):
        self._file.write(data)

    def _commit(self):
        self._file.close()

    def _abort(self):
        try:
            self._file.discard()
        except Exception as exc:  # an unfinished upload left behind is harmless
            log.warning("could not cancel the upload: %s", stream_error(self.url, exc))
        # Marked closed so that close(), also the one from __del__, never uploads the buffer.
        self._file.closed = True


class _SpooledWriter(Writer):
    """Other fsspec back-ends: spool locally (in memory up to 64 MiB), upload on commit."""

    def __init__(self, url: str):
        self._fs, self._path = filesystem(url)
        self._spool = tempfile.SpooledTemporaryFile(max_size=64 << 20)
        super().__init__(url)

    def _write(self, data):
        self._spool.write(data)

    def _commit(self):
        self._spool.seek(0)
        with self._fs.open(self._path, "wb") as out:
            shutil.copyfileobj(self._spool, out, 1 << 20)
        self._spool.close()

    def _abort(self):
        self._spool.close()


class _CliWriter(Writer):
    def __init__(self, url: str, argv: list[str]):
        self._process = ChildProcess(url, argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        super().__init__(url)

    def _write(self, data):
        view = memoryview(data)
        try:
            while view:  # a raw pipe write may be partial
                view = view[self._process.popen.stdin.write(view):]
        except BrokenPipeError:
            self._fail(self._process.wait(None))

    def _commit(self):
        self._process.popen.stdin.close()  # end of input: the command completes the upload
        status = self._process.wait(None)
        if status != 0:
            self._fail(status)
        self._process.release()

    def _fail(self, status: int) -> None:
        raise command_failed(self.url, f"upload command exited with status {status}",
                             self._process.stderr_tail())

    def _abort(self):
        self._process.kill()  # before closing stdin: the command must not see end of input
        self._process.release()


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
    with open_read(url) as stream:
        while chunk := stream.read(min(_READ_CHUNK, most + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > most:
                how = (f", the most a {limit} may have (set {size_variable(limit)} to change "
                       "it)") if isinstance(limit, str) else ""
                raise error(f"{url}: more than {most:,} bytes{how}")
    return b"".join(chunks)


def _check_special_file(url: str, error: type[WdstreamError]) -> None:
    """``error`` for a local path to a device, FIFO or socket (after symbolic links)."""
    if urls.scheme(url) != "file":
        return
    try:
        mode = os.stat(urls.to_local_path(url)).st_mode
    except OSError:
        return  # missing or unreadable: the opener says so
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise error(f"{url}: not a regular file (a device, FIFO or socket is never read whole)")


def exists(url: str) -> bool:
    """Whether an object (or a local file or folder) exists at ``url``."""
    if s3_objects.is_object_url(url):  # botocore: no fsspec I/O thread in a packer
        return s3_objects.head_size(url) is not None
    if urls.scheme(url) == "gs" and urls.object_key(url) is not None:  # the reader's client
        return gcs_objects.exists(url)
    fs, path = _target(url)
    if fs is None:
        return os.path.exists(path)
    try:
        fs.info(path)
    except FileNotFoundError:
        return False
    except Exception as exc:
        raise stream_error(url, exc) from exc
    return True


def delete(url: str) -> None:
    """Delete the object at ``url``; a missing one is fine."""
    if s3_objects.is_object_url(url):
        s3_objects.delete_object(url)
        return
    fs, path = _target(url)
    try:
        if fs is None:
            os.unlink(path)
        else:
            fs.rm_file(path)
    except FileNotFoundError:
        pass
    except Exception as exc:
        raise stream_error(url, exc) from exc


def size(url: str) -> int | None:
    """The object's size in bytes, None when the store does not tell (an HTTP server that
    sends no Content-Length); StreamError (not transient) if it does not exist."""
    fs, path = _target(url)
    try:
        if fs is None:
            return os.stat(path).st_size
        found = fs.info(path).get("size")
    except Exception as exc:
        raise stream_error(url, exc) from exc
    if isinstance(found, bool) or not isinstance(found, int | float) or found < 0:
        return None
    return int(found)


def list_files(prefix: str, suffix: str = ".tar",
               entries: list[dict] | None = None) -> list[tuple[str, int]]:
    """``(url, size)`` of the files directly in the folder ``prefix`` whose names end with
    ``suffix``, sorted by URL. URLs are spelled like ``prefix`` (``urls.child(prefix, name)``):
    a listed name is only ever a name under ``prefix``, never a URL, a path or a ``pipe:``
    command of its own. ``entries``: a remote folder's listing (``folder_entries``) when
    the caller has it.

    A missing local folder or bucket raises StreamError; on s3/gs a prefix without objects is
    simply empty.
    """
    path = urls.to_local_path(prefix)
    if path is not None:
        try:
            with os.scandir(path or ".") as listing:
                found = [(urls.child(prefix, entry.name), entry.stat().st_size)
                         for entry in listing
                         if entry.name.endswith(suffix) and entry.is_file()]
        except OSError as exc:
            raise stream_error(prefix, exc) from exc
        return sorted(found)

    folder = folder_path(prefix)
    found = []
    for entry in folder_entries(prefix) if entries is None else entries:
        parent, _, name = entry["name"].rstrip("/").rpartition("/")
        if entry.get("type") == "file" and parent == folder and name.endswith(suffix):
            if "::" in name and urls.scheme(prefix) not in ("s3", "gs"):
                # generic fsspec URLs chain at "::": the name would become another URL
                raise InputError(f"{prefix}: object {printable(repr(name))} cannot be read "
                                 "by name through fsspec ('::' chains URLs); rename it")
            found.append((urls.child(prefix, name), _listed_size(entry)))
    return sorted(found)


def folder_path(prefix: str) -> str:
    """The remote folder ``prefix``'s path as its listing names what lies in it: "bucket/key"
    on S3 and GCS (no s3fs nor gcsfs needed), else as its fsspec filesystem has it."""
    if urls.scheme(prefix) in ("s3", "gs"):
        return prefix.split("://", 1)[1].rstrip("/")
    return _target(prefix)[1].rstrip("/")


def folder_entries(prefix: str, on_page: Callable[[list[dict]], None] | None = None
                   ) -> list[dict]:
    """fsspec's entries (``name``, ``type``, ``size`` and the store's fields) of what lies
    directly in the remote folder ``prefix`` (S3's through botocore, ``s3_objects``; GCS's
    through its JSON API, ``gcs_objects``); empty under an s3/gs prefix without objects (a
    missing bucket raises StreamError). ``on_page``: called with S3's and GCS's pages of
    entries as they come, other stores' whole listing once."""
    if urls.scheme(prefix) == "s3":
        return s3_objects.list_folder(prefix, on_page=on_page)
    if urls.scheme(prefix) == "gs":
        return gcs_objects.list_folder(prefix, on_page=on_page)
    fs, path = filesystem(prefix)
    try:
        entries = fs.ls(path.rstrip("/"), detail=True)
    except FileNotFoundError as exc:
        if urls.scheme(prefix) not in ("s3", "gs"):
            raise stream_error(prefix, exc) from exc
        check_bucket(prefix, fs)
        entries = []  # object stores have no folders: no objects under the prefix
    except Exception as exc:
        raise stream_error(prefix, exc) from exc
    if on_page is not None:
        on_page(entries)
    return entries


def _listed_size(entry: dict) -> int | None:
    found = entry.get("size")
    if isinstance(found, bool) or not isinstance(found, int | float) or found < 0:
        return None
    return int(found)


def check_bucket(url: str, fs) -> None:
    """For an s3:// or gs:// URL under which nothing was found: a StreamError (AccessError for
    refused credentials) when the bucket itself is missing or cannot be reached, which says
    more than "not found"; nothing for other URLs or an existing bucket."""
    if urls.scheme(url) not in ("s3", "gs"):
        return
    bucket, _ = urls.bucket_key(url)
    try:
        found = fs.exists(bucket)
    except Exception as exc:
        raise stream_error(url, exc) from exc
    if not found:
        raise StreamError(url, f"bucket {bucket!r} not found (or not accessible)")


def _target(url: str):
    """``(None, local path)`` or ``(fsspec filesystem, path)`` for a stored object's URL."""
    if urls.scheme(url) == "pipe":
        raise InputError(f"{url}: a pipe: source is not a stored object")
    path = urls.to_local_path(url)
    return (None, path) if path is not None else filesystem(url)
