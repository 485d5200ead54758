"""What a store says of one object without reading it, asked with the reader's own client.

For ``s3://`` the botocore client the ``sdk`` reader uses (one per process, made from a
session that DataLoader workers inherit), so that asking costs one HEAD request, not the
import and the client of a second SDK (s3fs and aiobotocore: ~0.3 s of CPU before the first
request, measured on the shaped-link benchmark's machine).
"""

from __future__ import annotations

from wdstream.sources import urls
from wdstream.sources.clients import s3_client


def s3_head(url: str, timeout: float = 60.0) -> dict:
    """``{"size": bytes, "ETag": ..., "VersionId": ...}`` of the S3 object at ``url`` (the
    keys s3fs's ``info`` gives; ``VersionId`` only on a versioned bucket). Raises botocore's
    errors (a missing object: ``ClientError``)."""
    bucket, key = urls.bucket_key(url)
    response = s3_client(timeout).head_object(Bucket=bucket, Key=key)
    described = {"size": response.get("ContentLength")}
    for name in ("ETag", "VersionId"):
        if response.get(name):
            described[name] = response[name]
    return described
