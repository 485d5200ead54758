"""``pipe:COMMAND``: a shell command whose output is the data. It is read (``Store.open_read``)
and nothing else: it has no size, version, listing or writer."""

from __future__ import annotations

from wdstream.errors import InputError
from wdstream.sources.stores.store import Store, not_stored


class PipeStore(Store):
    runs_command = True
    remote = False
    fixed_reader = "pipe"

    def describe(self, url):
        raise not_stored(url)

    def version(self, url):
        return None

    def list(self, prefix, recursive=False, on_page=None):
        raise not_stored(prefix)

    def folder_path(self, prefix):
        raise not_stored(prefix)

    def open_write(self, url, via):
        raise InputError(f"{url}: cannot write to a pipe: source")

    def exists(self, url):
        raise not_stored(url)

    def delete(self, url):
        raise not_stored(url)

    def size(self, url):
        raise not_stored(url)
