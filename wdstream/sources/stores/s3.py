"""``s3://`` (and ``s3a://``): objects through botocore's client (``s3_objects``: HEAD, a
folder's listing, delete, uploads by ``S3Writer``), which starts no fsspec I/O thread, so a
packer's pool can fork; s3fs for what is not an object URL and for ``via="fsspec"``
writes, ``aws s3 cp`` for ``via="cli"``. Ranged GETs carry the listed ETag (``If-Match``)."""

from __future__ import annotations

from wdstream.sources import s3_objects
from wdstream.sources.processes import aws_read_command, cli_url
from wdstream.sources.ranged import RangedS3Source
from wdstream.sources.s3_ranges import S3Ranges
from wdstream.sources.stores.generic import BucketStore
from wdstream.sources.stores.store import is_object
from wdstream.sources.writers import CliWriter, CloudWriter


class S3Store(BucketStore):
    version_fields = ("ETag", "etag")
    ranged_source = RangedS3Source
    range_fetcher = S3Ranges
    cli_reader = staticmethod(aws_read_command)
    client_name = "s3fs"

    def new_filesystem(self, fsspec, timeout):
        """s3fs with botocore timeouts of ``timeout``."""
        return fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False,
                                 config_kwargs={"connect_timeout": timeout,
                                                "read_timeout": timeout})

    def describe(self, url):
        return s3_objects.head(url) if is_object(url) else super().describe(url)

    def head_and_start(self, url, nbytes):
        return s3_objects.head_and_start(url, nbytes) if is_object(url) else None

    def quick_size(self, url):
        return s3_objects.head_size(url) if is_object(url) else None

    def list(self, prefix, recursive=False, on_page=None):
        return s3_objects.list_folder(prefix, recursive=recursive, on_page=on_page)

    def open_write(self, url, via):
        if via == "cli":
            return CliWriter(url, ["aws", "s3", "cp", "--only-show-errors", "-", cli_url(url)])
        if via == "auto" and is_object(url):
            return s3_objects.S3Writer(url)
        return CloudWriter(url)

    def exists(self, url):
        if is_object(url):  # botocore: no fsspec I/O thread in a packer
            return s3_objects.head_size(url) is not None
        return super().exists(url)

    def delete(self, url):
        if is_object(url):
            s3_objects.delete_object(url)
        else:
            super().delete(url)
