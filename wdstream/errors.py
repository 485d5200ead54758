"""Exceptions. Every error a user can cause or meet derives from WdstreamError.

The CLI prints a WdstreamError's message (no traceback) and exits with its ``exit_code``.
Messages always name the file, line, record or URL concerned, and never a signed request's
secret: every message passes through ``printable.redact`` when the error is made.
"""

from __future__ import annotations

from wdstream.printable import printable, redact


class WdstreamError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with. Text arguments are redacted
    (``printable.redact``): a message quoting a signed URL or a server's reply shows no
    signature, credential or token."""

    exit_code = 2

    def __init__(self, *args):
        super().__init__(*(redact(arg) if isinstance(arg, str) else arg for arg in args))


class InputError(WdstreamError):
    """Bad user input: a malformed record, a missing field, an unknown file type, a bad option."""


class OptionError(InputError, ValueError):
    """An argument or option with a value that is not accepted; the message lists those that
    are. Also a ``ValueError``, for callers that catch that."""


class OptionTypeError(OptionError, TypeError):
    """An argument of the wrong type (also a ``TypeError``)."""


class UnsizedError(InputError, TypeError):
    """``len()`` of a dataset or stage whose length is unknown (a ``TypeError``, as ``len()``
    of an unsized object raises)."""


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
        self.url = redact(url)
        self.stderr = redact(stderr.strip())
        self.transient = transient
        text = f"{printable(self.url)}: {message}"  # a name from storage may hold control chars
        if self.stderr:
            text += f"\n{self.stderr}"
        super().__init__(text)

    def __reduce__(self):  # keep the class and fields across DataLoader worker pickling
        return (_rebuild_stream_error,
                (self.url, self.args[0], self.stderr, self.transient, type(self)))


class AccessError(StreamError):
    """Missing or refused credentials, or a permission problem: never transient, and never
    skipped by ``on_error="skip"`` (it is not a problem of the data)."""


def _rebuild_stream_error(url, text, stderr, transient, kind=StreamError):
    error = kind.__new__(kind)
    Exception.__init__(error, text)
    error.url, error.stderr, error.transient = url, stderr, transient
    return error


class ShardError(WdstreamError):
    """A shard's content is wrong: corrupt tar, fewer or more samples than the manifest says,
    a digest or size mismatch, an undecodable member. Exit code 1 in ``wdstream verify``."""

    exit_code = 1
    # declared, not set: an error that says whether a retry may succeed sets it (without
    # it, stream.read retries a ShardError)
    transient: bool


class LimitError(ShardError):
    """Data that would expand past one of the reader's ``wdstream.Limits`` (a compressed shard,
    a sample, a decompressor's memory, an image): the message names the shard, the member and
    the limit. Never retried: the same bytes expand the same way again."""

    transient = False
    in_stream = False  # raised by a decompressed stream: the tar reader adds the member


class ShardMismatchError(ShardError):
    """A shard that is not the one the manifest describes: another object at its URL, a shard
    re-packed in place, a stream that goes on past the recorded length. Never retried: a retry
    that skips the samples already delivered would deliver some twice and others never."""

    transient = False
