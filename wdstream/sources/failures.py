"""Failures of reads and writes as wdstream's errors: ``transient`` is False for a missing
object, a permission problem or missing credentials (a retry will not help), True for resets,
timeouts, 5xx, stalls and failed commands. Errors name the URL, never a signed URL's secrets
(``printable.redact``, applied by the errors themselves and to the exception they wrap)."""

from __future__ import annotations

import sys

from wdstream.errors import AccessError, StreamError, WdstreamError
from wdstream.printable import redact

_MISSING_MARKERS = ("404", "not found", "does not exist", "nosuchkey", "nosuchbucket",
                    "matched no objects", "no urls matched", "no such file")
_DENIED_MARKERS = ("403", "accessdenied", "access denied", "forbidden",
                   "unable to locate credentials")


def command_failed(url: str, message: str, stderr: str) -> StreamError:
    """The error for a command that exited non-zero: permanent when its stderr says why
    (not found, access denied...), else transient."""
    what = permanent_failure(stderr)
    kind = AccessError if what in _ACCESS_PROBLEMS else StreamError
    return kind(url, f"{what} ({message})" if what else message, stderr=stderr,
                transient=what is None)


def permanent_failure(stderr: str) -> str | None:
    """"not found" or "access denied" when a command's stderr says so (a retry will not help),
    else None. Shared with the CLI upload in ``objects``."""
    text = stderr.lower()
    if any(marker in text for marker in _MISSING_MARKERS):
        return "not found"
    if any(marker in text for marker in _DENIED_MARKERS):
        return "access denied"
    return None



def stream_error(url: str, exc: BaseException) -> WdstreamError:
    """``exc`` as a StreamError naming ``url``, with ``transient`` set from its kind.

    wdstream's own errors are returned unchanged. Used by the readers and by ``writers``.
    """
    if isinstance(exc, WdstreamError):
        return exc
    transient, what = _classify(exc)
    detail = str(exc) or type(exc).__name__
    kind = AccessError if what in _ACCESS_PROBLEMS else StreamError
    error = kind(url, f"{what} ({detail})" if what else detail, transient=transient)
    error.__cause__ = redacted_cause(exc)
    return error


def redacted_cause(exc: BaseException) -> BaseException:
    """``exc`` with its text arguments redacted, in place: a traceback prints the cause of a
    wdstream error too, and urllib3's and botocore's messages quote the URL they asked for,
    a presigned one with its signature."""
    try:
        exc.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in exc.args)
    except (AttributeError, TypeError):  # an exception type whose args cannot be set
        pass
    return exc


def is_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the object (or its bucket) does not exist."""
    return _classify(exc)[1] == "not found"


_ACCESS_PROBLEMS = ("access denied", "no usable AWS credentials",
                    "no usable Google credentials")
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException",
                    "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed"}


def _classify(exc: BaseException) -> tuple[bool, str]:
    """(transient, what happened) for an exception from the OS, botocore, s3fs, gcsfs,
    google-auth or urllib3: the first of ``_CLASSIFIERS`` that knows it."""
    for classify in _CLASSIFIERS:
        verdict = classify(exc)
        if verdict is not None:
            return verdict
    return False, type(exc).__name__


def _botocore_error(exc: BaseException) -> tuple[bool, str] | None:
    errors = sys.modules.get("botocore.exceptions")
    if errors is None:
        return None
    if isinstance(exc, errors.ClientError):
        return _client_error(exc)
    if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
        return False, "no usable AWS credentials"
    if isinstance(exc, errors.HTTPClientError | errors.ConnectionError
                  | errors.IncompleteReadError):
        return True, "connection failed"
    return None


def _client_error(exc) -> tuple[bool, str]:
    """A botocore ``ClientError`` by its error code and HTTP status."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
        return False, "not found"
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch") \
            or status in (401, 403):
        return False, "access denied"
    if code in _TRANSIENT_CODES or status >= 500 or status == 429:
        return True, "server error"
    return False, "request failed"


def _http_status(exc: BaseException) -> tuple[bool, str] | None:
    """gcsfs.retry.HttpError, aiohttp response errors, range_fetchers.HttpStatusError."""
    status = getattr(exc, "code", None)
    if not isinstance(status, int) or isinstance(exc, OSError):
        return None
    if status == 404:
        return False, "not found"
    if status in (401, 403):
        return False, "access denied"
    return status >= 500 or status in (408, 429), f"HTTP status {status}"


def _google_auth_error(exc: BaseException) -> tuple[bool, str] | None:
    errors = sys.modules.get("google.auth.exceptions")
    if errors is None:
        return None
    if isinstance(exc, errors.TransportError):
        return True, "connection failed"
    if isinstance(exc, errors.GoogleAuthError):
        return bool(getattr(exc, "retryable", False)), "no usable Google credentials"
    return None


def _connection_error(exc: BaseException) -> tuple[bool, str] | None:
    """urllib3's errors (resets, timeouts, short bodies: gcs_ranges) and http.client's (a
    broken body read: body_reads)."""
    if _loaded_kind(exc, ("urllib3.exceptions", "HTTPError"), ("http.client", "HTTPException")):
        return True, "connection failed"
    return None


def _aiohttp_error(exc: BaseException) -> tuple[bool, str] | None:
    """aiohttp's errors that are no ``OSError`` (those are ``_os_error``'s)."""
    if _loaded_kind(exc, ("aiohttp", "ClientError")):
        return True, "connection failed"
    return None


def _loaded_kind(exc: BaseException, *kinds: tuple[str, str]) -> bool:
    """Whether ``exc`` is one of the (module, class) ``kinds`` of a module already imported."""
    for module, name in kinds:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


def _os_error(exc: BaseException) -> tuple[bool, str] | None:
    if isinstance(exc, FileNotFoundError):
        return False, "not found"
    if isinstance(exc, PermissionError):
        return False, "access denied"
    if isinstance(exc, IsADirectoryError | NotADirectoryError):
        return False, "not a file"
    if isinstance(exc, OSError):  # resets, timeouts, refused connections, s3fs's other errors
        return True, "I/O error"
    return None


_CLASSIFIERS = (_botocore_error, _http_status, _google_auth_error, _connection_error, _os_error,
                _aiohttp_error)
