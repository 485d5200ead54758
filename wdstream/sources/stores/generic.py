"""Any other fsspec URL (``memory://``, ``https://``, ``hf://``, ...): its fsspec filesystem
(``FsspecStore.filesystem``) lists, describes, deletes, and writes by spooling to a temporary
file uploaded on commit (``writers.SpooledWriter``: a generic back-end cannot cancel a
half-written object). ``BucketStore`` is the base of the S3 and GCS stores, which use it
for what their own clients do not do."""

from __future__ import annotations

from wdstream.errors import InputError, StreamError
from wdstream.sources.clients import cached_client
from wdstream.sources.failures import stream_error
from wdstream.sources.stores.store import Store, listed_size, listing
from wdstream.sources.writers import SpooledWriter


class FsspecStore(Store):
    chains_names = True
    client_name: str | None = None  # s3fs, gcsfs: one per process and environment

    def filesystem(self, url, timeout=60.0):
        """fsspec's filesystem of the URL, its listing cache off (an object written meanwhile
        must show up); s3fs and gcsfs kept by ``clients.cached_client`` rather than by fsspec,
        so that a changed endpoint or identity in the environment gets a new one."""
        import fsspec

        try:
            if self.client_name is None:
                return fsspec.core.url_to_fs(url, use_listings_cache=False)
            fs = cached_client(self.client_name, self.scheme, timeout,
                               lambda: self.new_filesystem(fsspec, timeout))
        except ImportError as exc:
            raise StreamError(url, f"cannot open {self.scheme}:// URLs: {exc}") from exc
        return fs, fs._strip_protocol(url)

    def new_filesystem(self, fsspec, timeout: float):
        """A new fsspec filesystem of ``client_name``'s kind (``fsspec``: the module)."""
        raise NotImplementedError

    def describe(self, url):
        fs, path = self.filesystem(url)
        return fs.info(path)

    def list(self, prefix, recursive=False, on_page=None):
        fs, path = self.filesystem(prefix)
        if recursive:
            return listing(prefix, lambda: list(fs.find(self.folder_path(prefix),
                                                        detail=True).values()), on_page)
        return listing(prefix, lambda: fs.ls(path.rstrip("/"), detail=True), on_page)

    def folder_path(self, prefix):
        return self.filesystem(prefix)[1].rstrip("/")

    def open_write(self, url, via):
        if via == "cli":
            raise InputError(f"{url}: no command-line uploader for {self.scheme}:// (cli "
                             "writes s3:// and gs://)")
        return SpooledWriter(url)

    def exists(self, url):
        fs, path = self.filesystem(url)
        try:
            fs.info(path)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise stream_error(url, exc) from exc
        return True

    def delete(self, url):
        fs, path = self.filesystem(url)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise stream_error(url, exc) from exc

    def size(self, url):
        fs, path = self.filesystem(url)
        try:
            found = fs.info(path).get("size")
        except Exception as exc:
            raise stream_error(url, exc) from exc
        return listed_size(found)


class BucketStore(FsspecStore):
    """The base of the S3 and GCS stores: "bucket/key" URLs, whose folder path is the URL
    without its scheme (no filesystem needed to tell it)."""

    buckets = True
    chains_names = False

    def folder_path(self, prefix):
        return prefix.split("://", 1)[1].rstrip("/")


class HttpStore(FsspecStore):
    """``http://`` and ``https://``: fsspec's paths are the URLs themselves."""

    paths_are_urls = True
