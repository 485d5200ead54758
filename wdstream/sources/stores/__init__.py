"""Stores: one class per kind of storage, picked once from a URL by ``store_for(url)``, the
one place (besides ``urls``' parsing) that tells schemes apart. What a store does is in
``store.Store``; ``local.py``, ``pipe.py``, ``s3.py``, ``gcs.py`` and ``generic.py`` (any other
fsspec protocol) implement it. A new kind of storage is one module here and its line in
``STORES``."""

from __future__ import annotations

from functools import lru_cache

from wdstream.sources import urls
from wdstream.sources.stores.gcs import GcsStore
from wdstream.sources.stores.generic import FsspecStore, HttpStore
from wdstream.sources.stores.local import LocalStore
from wdstream.sources.stores.pipe import PipeStore
from wdstream.sources.stores.s3 import S3Store
from wdstream.sources.stores.store import Store, strong_version

__all__ = ["STORES", "Store", "store_for", "strong_version"]

# scheme (as ``urls.scheme`` names it) -> its store; any other scheme: ``FsspecStore``
STORES: dict[str, type[Store]] = {
    "file": LocalStore, "pipe": PipeStore, "s3": S3Store, "gs": GcsStore,
    "http": HttpStore, "https": HttpStore,
}


def store_for(url: str) -> Store:
    """The store that holds ``url``: a local path, ``pipe:``, ``s3://``, ``gs://`` or another
    fsspec URL."""
    return _store(urls.scheme(url))


@lru_cache(maxsize=64)
def _store(scheme: str) -> Store:
    return STORES.get(scheme, FsspecStore)(scheme)
