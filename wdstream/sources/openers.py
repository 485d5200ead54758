"""Choosing a reader: ``open_read(url)`` gives a ``ReadAheadBody`` over a ``pipe:`` command, a
cloud CLI, fsspec or the S3 SDK, and a ``LocalBody`` for a local path.

The pieces live beside this module: the bodies themselves (``bodies``: how a body is read
and how it ends), commands as sources (``processes``), clients and fsspec (``clients``),
concurrent ranged S3 reads (``ranged``), and how failures become wdstream's errors
(``failures``).

Which opener reads what (``opener="auto"``, or the ``WDSTREAM_OPENER`` environment variable)
    - local paths and ``file://``: plain ``open`` (whatever the opener).
    - ``pipe:CMD``: ``/bin/bash -o pipefail -c CMD`` (whatever the opener): the user's own shell
      command; pipefail so that ``aws ... | zcat`` fails when ``aws`` fails.
    - ``s3://``: "sdk", a streaming ``get_object`` with botocore: several times faster than
      s3fs or ``aws s3 cp URL -``, and without a process start-up per shard (figures:
      docs/benchmarks.md). One client per process; it honours ``AWS_ENDPOINT_URL``,
      ``AWS_PROFILE`` and the usual credential chain.
      An object is read as concurrent ranged GETs handed over in order (``ranged.py``).
    - ``gs://``: "sdk" too: the same concurrent ranged reads over GCS's JSON API (urllib3,
      credentials from google-auth; ``gcs_ranges.py``); "fsspec" is gcsfs, one body of
      sequential block reads, and ``gcloud storage cat`` costs a process start-up per shard.
    - other fsspec URLs (``memory://``, ``https://``, ...): "fsspec".
    - "cli": ``aws s3 cp --only-show-errors URL -`` for s3, ``gcloud storage cat URL`` (or
      ``gsutil cat URL`` without gcloud) for gs. Commands are argument lists, never shell
      strings: a key with spaces, ``;`` or ``$(...)`` is just a key.

Errors name the URL; ``transient`` is False for a missing object, a permission problem or
missing credentials, True for resets, timeouts, 5xx, stalls and failed commands.
"""

from __future__ import annotations

import os

from wdstream.errors import InputError
from wdstream.sources import urls
from wdstream.sources.bodies import BodySource, LocalBody, ReadAheadBody
from wdstream.sources.clients import FsspecSource
from wdstream.sources.failures import stream_error
from wdstream.sources.processes import ProcessSource
from wdstream.sources.stores import store_for
from wdstream.sources.stores.store import no_reader

OPENERS = ("auto", "cli", "fsspec", "sdk")


# --------------------------------------------------------------------------- choosing a reader


def resolve_opener(opener: str | None, url: str) -> str:
    """The reader ``open_read`` uses for ``url``: "file", "pipe", "cli", "fsspec" or "sdk".

    ``None`` or "auto" means ``$WDSTREAM_OPENER`` if set (read now, not at import), else the
    default for the URL's store: "sdk" where it has ranged reads (``Store.ranged_source``),
    else "fsspec"; a local path and a command have their own reader (see the module
    docstring).
    """
    if opener in (None, "auto"):
        opener = os.environ.get("WDSTREAM_OPENER") or "auto"
        if opener not in OPENERS:
            raise InputError(f"WDSTREAM_OPENER={opener!r}: expected one of {', '.join(OPENERS)}")
    elif opener not in OPENERS:
        raise InputError(f"opener {opener!r}: expected one of {', '.join(OPENERS)}")
    store = store_for(url)
    if store.fixed_reader is not None:
        return store.fixed_reader
    if opener == "auto":
        return "fsspec" if store.ranged_source is None else "sdk"
    if (opener == "cli" and store.cli_reader is None) or \
            (opener == "sdk" and store.ranged_source is None):
        raise no_reader(url, store.scheme, opener)
    return opener



def open_read(
    url: str, *, opener: str | None = None, timeout: float = 60.0, start: int = 0,
    size: int | None = None, first_bytes: int | None = None, version: str | None = None,
) -> ReadAheadBody | LocalBody:
    """Open ``url`` for streaming, from byte ``start`` on. See the module docstring.

    ``timeout`` is the longest wait for data (and the connect/read timeout of the SDK client).
    For pipes and CLIs ``start`` bytes are read and dropped; other readers seek or ask for a range.
    ``size``: the object's size if known (a manifest's or a listing's), a plan only: the sdk
    reader then asks for several parts at once instead of waiting for a first response.
    ``first_bytes``: how many bytes the caller wants before anything else (a first batch's);
    the sdk reader spreads them over its first parts, so that they come together.
    ``version``: the object's expected ETag (S3) or generation (GCS), which the sdk reader
    sends with every GET (``ranged.RangedSource``); the other readers do not check it.
    """
    if timeout <= 0:
        raise InputError(f"{url}: timeout must be positive, got {timeout}")
    if start < 0:
        raise InputError(f"{url}: start must be >= 0, got {start}")
    reader = resolve_opener(opener, url)
    if reader == "file":
        path = urls.local_path(url)
        try:
            file = open(path, "rb", buffering=0)  # the body closes it
        except OSError as exc:
            raise stream_error(url, exc) from None
        try:
            file.seek(start)
        except OSError as exc:
            file.close()
            raise stream_error(url, exc) from None
        return LocalBody(url, file)  # positions count from ``start``
    source: BodySource
    if reader == "pipe":
        argv = ["/bin/bash", "-o", "pipefail", "-c", url[len("pipe:"):]]
        source = ProcessSource(url, argv, start)
    elif reader == "cli":
        source = ProcessSource(url, store_for(url).cli_command(url, timeout), start)
    elif reader == "sdk":
        source = store_for(url).sdk_source(url, start, timeout, size=size,
                                           first_bytes=first_bytes, version=version)
    else:
        source = FsspecSource(url, start, timeout)
    return ReadAheadBody(url, source, timeout)
