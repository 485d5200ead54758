"""What every writer of ``objects.open_write`` is: ``Writer``, written to, then committed
(the object appears, whole) or aborted (nothing appears), and the writers the stores
(``stores/``) hand out: ``LocalWriter`` (a temporary file renamed over the name),
``CloudWriter`` (s3fs / gcsfs uploads), ``SpooledWriter`` (other fsspec back-ends) and
``CliWriter`` (piped into ``aws`` / ``gcloud``). S3's own, through botocore, is
``s3_objects.S3Writer``."""

from __future__ import annotations

import abc
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from typing import IO, cast

from wdstream.errors import WdstreamError
from wdstream.sources.clients import filesystem
from wdstream.sources.failures import command_failed, stream_error
from wdstream.sources.processes import ChildProcess

log = logging.getLogger(__name__)


class Writer(abc.ABC):
    """Base of the writers: ``write``, then exactly one of ``commit`` or ``abort``.

    Subclasses call ``__init__`` last, once their resources exist: a writer whose set-up failed
    has nothing to abort.
    """

    def __init__(self, url: str):
        self.url = url
        self.sha256: bytes | None = None  # the digest of all bytes written, if given to commit
        self._finished = False
        self._pid = os.getpid()

    def write(self, data: bytes) -> None:
        if self._finished:
            raise ValueError(f"{self.url}: write after commit or abort")
        self._or_abort(self._write, data)

    def commit(self, sha256: bytes | None = None) -> None:
        """Make the object appear, complete. On failure the writer aborts and raises.

        ``sha256``: the SHA-256 digest of everything written, when the caller computed it: a
        store that checks uploads (S3) is sent it rather than hashing the bytes again."""
        if self._finished:
            return
        self.sha256 = sha256
        self._or_abort(self._commit)
        self._finished = True

    def _or_abort(self, step, *args) -> None:
        """Run one step; on any failure abort, and raise it as a WdstreamError naming the URL."""
        try:
            step(*args)
        except WdstreamError:
            self.abort()
            raise
        except Exception as exc:
            self.abort()
            raise stream_error(self.url, exc) from exc

    def abort(self) -> None:
        """Drop what was written; nothing appears at the URL. Never raises for cleanup."""
        if self._finished:
            return
        self._finished = True
        self._abort()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def __del__(self):
        # A writer dropped without commit is aborted: it must not upload from a finalizer. Not
        # in a forked copy, which must leave the parent's temporary file or upload alone. No
        # _pid: a Ctrl-C (pack's workers get one when another fails) ended __init__ here.
        if not getattr(self, "_finished", True) and os.getpid() == getattr(
                self, "_pid", os.getpid()):
            self.abort()

    @abc.abstractmethod
    def _write(self, data: bytes) -> None:
        """Append data to the destination."""

    @abc.abstractmethod
    def _commit(self) -> None:
        """Make the written data appear at the URL, whole."""

    @abc.abstractmethod
    def _abort(self) -> None:
        """Leave nothing behind (and any older object at the URL untouched)."""


class LocalWriter(Writer):
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


class CloudWriter(Writer):
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


class SpooledWriter(Writer):
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


class CliWriter(Writer):
    def __init__(self, url: str, argv: list[str]):
        self._process = ChildProcess(url, argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        self._stdin = cast(IO[bytes], self._process.popen.stdin)  # stdin=PIPE: never None
        super().__init__(url)

    def _write(self, data):
        view = memoryview(data)
        try:
            while view:  # a raw pipe write may be partial
                view = view[self._stdin.write(view):]
        except BrokenPipeError:
            self._fail(self._process.wait(None))

    def _commit(self):
        self._stdin.close()  # end of input: the command completes the upload
        status = self._process.wait(None)
        if status != 0:
            self._fail(status)
        self._process.release()

    def _fail(self, status: int | None) -> None:
        raise command_failed(self.url, f"upload command exited with status {status}",
                             self._process.stderr_tail())

    def _abort(self):
        self._process.kill()  # before closing stdin: the command must not see end of input
        self._process.release()
