"""Any other fsspec URL (``memory://``, ``https://``, ``hf://``, ...): its fsspec filesystem
(``clients.filesystem``) lists, describes, deletes, and writes by spooling to a temporary
file uploaded on commit (``writers.SpooledWriter``: a generic back-end cannot cancel a
half-written object). The base of the S3 and GCS stores, which use it for what their own
clients do not do."""

from __future__ import annotations

from wdstream.errors import InputError
from wdstream.sources.clients import filesystem
from wdstream.sources.failures import stream_error
from wdstream.sources.stores.base import Store, listed_size
from wdstream.sources.writers import SpooledWriter


class FsspecStore(Store):
    chains_names = True

    def describe(self, url):
        fs, path = filesystem(url)
        return fs.info(path)

    def list(self, prefix, recursive=False, on_page=None):
        fs, path = filesystem(prefix)
        try:
            if recursive:
                entries = list(fs.find(self.folder_path(prefix), detail=True).values())
            else:
                entries = fs.ls(path.rstrip("/"), detail=True)
        except Exception as exc:
            raise stream_error(prefix, exc) from exc
        if on_page is not None:
            on_page(entries)
        return entries

    def folder_path(self, prefix):
        return filesystem(prefix)[1].rstrip("/")

    def open_write(self, url, via):
        if via == "cli":
            raise InputError(f"{url}: no command-line uploader for {self.scheme}:// (cli "
                             "writes s3:// and gs://)")
        return SpooledWriter(url)

    def exists(self, url):
        fs, path = filesystem(url)
        try:
            fs.info(path)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise stream_error(url, exc) from exc
        return True

    def delete(self, url):
        fs, path = filesystem(url)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise stream_error(url, exc) from exc

    def size(self, url):
        fs, path = filesystem(url)
        try:
            found = fs.info(path).get("size")
        except Exception as exc:
            raise stream_error(url, exc) from exc
        return listed_size(found)


class HttpStore(FsspecStore):
    """``http://`` and ``https://``: fsspec's paths are the URLs themselves."""

    paths_are_urls = True
