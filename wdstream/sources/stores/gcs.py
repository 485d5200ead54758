"""``gs://`` (and ``gcs://``): an object's metadata, existence, first bytes and a folder's
listing through the ranged reader's JSON API client (``gcs_objects``), without loading
gcsfs; gcsfs for what is not an object URL, deletes and uploads; ``gcloud storage cp`` (or
``gsutil cp``) for ``via="cli"``. Ranged GETs carry the listed generation
(``ifGenerationMatch``)."""

from __future__ import annotations

import shutil

from wdstream.sources import gcs_objects
from wdstream.sources.gcs_ranges import GcsRanges
from wdstream.sources.processes import cli_url, gcs_read_command
from wdstream.sources.ranged import RangedGcsSource
from wdstream.sources.stores.generic import BucketStore
from wdstream.sources.stores.store import is_object
from wdstream.sources.writers import CliWriter, CloudWriter


class GcsStore(BucketStore):
    version_fields = ("generation",)
    ranged_source = RangedGcsSource
    range_fetcher = GcsRanges
    cli_reader = staticmethod(gcs_read_command)
    client_name = "gcsfs"

    def new_filesystem(self, fsspec, timeout):
        return fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)

    def describe(self, url):
        return gcs_objects.describe(url) if is_object(url) else super().describe(url)

    def head_and_start(self, url, nbytes):
        return gcs_objects.head_and_start(url, nbytes) if is_object(url) else None

    def list(self, prefix, recursive=False, on_page=None):
        return gcs_objects.list_folder(prefix, recursive=recursive, on_page=on_page)

    def open_write(self, url, via):
        if via == "cli":
            return CliWriter(url, _upload_command(url))
        return CloudWriter(url)

    def exists(self, url):
        return gcs_objects.exists(url) if is_object(url) else super().exists(url)


def _upload_command(url: str) -> list[str]:
    """``gcloud storage cp - URL``, or ``gsutil cp - URL`` when only gsutil is installed."""
    if shutil.which("gcloud") or not shutil.which("gsutil"):
        return ["gcloud", "storage", "cp", "-", cli_url(url)]
    return ["gsutil", "cp", "-", cli_url(url)]
