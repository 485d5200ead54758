"""GCS objects through the ranged reader's JSON API client (``gcs_ranges.py``) rather than
gcsfs: what the store says of an object (its size and generation), alone or with its first
bytes. The S3 counterpart is ``s3_objects.py``."""

from __future__ import annotations

from wdstream.sources.gcs_ranges import GcsRanges

TIMEOUT = 60.0  # seconds, for these requests made outside a stream


def describe(url: str, timeout: float = TIMEOUT) -> dict:
    """``{"size": bytes, "generation": ...}`` of the GCS object at ``url``, from its metadata
    (one request with the reader's client, without loading gcsfs). Raises ``HttpStatusError``
    (a missing object: 404)."""
    fetcher = GcsRanges(url, timeout)
    fetcher.connect()
    metadata = fetcher.metadata()
    return {"size": int(metadata["size"]), "generation": metadata["generation"]}


def head_and_start(url: str, nbytes: int, timeout: float = TIMEOUT) -> tuple[dict, bytes]:
    """What ``describe`` tells of the GCS object at ``url``, and its first ``nbytes`` bytes
    (fewer when the object is shorter), by one ranged download: a round trip less for an
    object that is often read whole right after (an emulator, whose downloads do not say the
    generation, is asked its metadata first). Raises ``HttpStatusError`` (a missing object) or
    ``PastEnd`` (an empty one, which has no byte 0)."""
    fetcher = GcsRanges(url, timeout)
    fetcher.connect()
    response = fetcher.get(0, nbytes - 1, None)
    start = memoryview(bytearray(nbytes))
    filled = 0
    try:
        while filled < nbytes:  # a server that ignored the range: the rest is not read
            count = response.readinto(start[filled:])
            if not count:
                break
            filled += count
    finally:
        response.close()
    return {"size": response.size, "generation": response.version}, bytes(start[:filled])
