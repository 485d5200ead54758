"""Exceptions. Every error a user can cause or meet derives from WdstreamError.

The CLI prints a WdstreamError's message (no traceback) and exits with its ``exit_code``.
Messages always name the file, line, record or URL concerned.
"""

from __future__ import annotations

from .printable import printable


class WdstreamError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 2


class InputError(WdstreamError):
    """Bad user input: a malformed record, a missing field, an unknown file type, a bad option."""


class ManifestError(WdstreamError):
    """A manifest that is missing, unreadable or inconsistent."""


class StateError(WdstreamError):
    """A resume state that does not match this dataset, seed or layout, or is corrupt."""


class StreamError(WdstreamError):
    """Reading or writing bytes failed: a missing object, a non-zero exit, a stall, a reset.

    ``transient`` says whether a retry may succeed (connection reset, 5xx, stall, a pipe's
    non-zero exit); a missing object or a permission error is not transient.
    """

    def __init__(self, url: str, message: str | None = None, *, stderr: str = "",
                 transient: bool = False):
        if message is None:  # one finished message, as torch rebuilds a worker's error
            self.url, self.stderr, self.transient = "", "", False
            super().__init__(url)
            return
        self.url = url
        self.stderr = stderr.strip()
        self.transient = transient
        text = f"{printable(url)}: {message}"  # a name from storage may hold control chars
        if self.stderr:
            text += f"\n{self.stderr}"
        super().__init__(text)

    def __reduce__(self):  # keep the fields across DataLoader worker pickling
        return (_rebuild_stream_error, (self.url, self.args[0], self.stderr, self.transient))


def _rebuild_stream_error(url, text, stderr, transient):
    error = StreamError.__new__(StreamError)
    Exception.__init__(error, text)
    error.url, error.stderr, error.transient = url, stderr, transient
    return error


class ShardError(WdstreamError):
    """A shard's content is wrong: corrupt tar, fewer or more samples than the manifest says,
    a digest or size mismatch, an undecodable member. Exit code 1 in ``wdstream verify``."""

    exit_code = 1
