"""The bytes of an input as a buffered body: local, stdin or remote (streamed, never copied
to a file), decompressed by its suffix (``.gz``, ``.zst``), counted for progress."""

from __future__ import annotations

import io
import sys
import zlib
from typing import TYPE_CHECKING, BinaryIO

from wdstream.errors import InputError, WdstreamError
from wdstream.write.local_inputs import open_regular
from wdstream.write.record_batches import STDIN, ReadCounter
from wdstream.write.remote import is_remote, open_body

if TYPE_CHECKING:
    from gzip import GzipFile


class _Counted(io.RawIOBase):
    """A raw body that adds the bytes read through it to a ReadCounter."""

    def __init__(self, body, counter: ReadCounter):
        self._body, self._counter = body, counter

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._body.fileno()

    def readinto(self, buffer) -> int:
        n = self._body.readinto(buffer)
        self._counter.read += n or 0
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._body.close()
            finally:
                super().close()


def open_binary(path: str, counter: ReadCounter) -> BinaryIO | GzipFile:
    """A buffered binary body of the input's bytes, decompressed by its suffix; remote
    inputs are streamed, never copied to a file; a local one must be a regular file."""
    if path == STDIN:
        return sys.stdin.buffer
    name = path.split("?", 1)[0].lower() if is_remote(path) else path.lower()
    if is_remote(path):
        try:
            body = open_body(path)
        except WdstreamError as error:
            raise InputError(str(error)) from None
    else:
        body = open_regular(path)  # returned to the caller
    raw = io.BufferedReader(_Counted(body, counter), 1 << 20)
    if name.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")  # closing it leaves raw open: see close_binary
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise InputError(
                f"{path}: reading .zst needs the zstandard package (pip install 'wdstream[zstd]')"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader, 1 << 20)
    return raw


def close_binary(body) -> None:
    """Close a body of ``open_binary`` and what it wraps (GzipFile leaves its fileobj)."""
    inner = getattr(body, "fileobj", None)
    try:
        body.close()
    finally:
        if inner is not None:
            inner.close()


def read_errors():
    """Exceptions that mean a compressed or binary file is damaged, not a bug here."""
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    if "zstandard" in sys.modules:
        errors.append(sys.modules["zstandard"].ZstdError)
    return tuple(errors)

