"""What every writer of ``objects.open_write`` is: ``Writer``, written to, then committed
(the object appears, whole) or aborted (nothing appears). The writers themselves are in
``objects.py`` and, for S3 through botocore, ``s3_objects.py``."""

from __future__ import annotations

import abc
import os

from wdstream.errors import WdstreamError
from wdstream.sources.failures import stream_error


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
