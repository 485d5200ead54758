"""Packing records into WebDataset shards: ``inputs`` reads JSON Lines, Parquet, CSV/TSV, folders
and stdin, ``remote`` lists and opens cloud URLs and glob patterns for it; ``packer`` writes
the shards and the manifest; ``cluster`` packs on Ray.

``wdstream.pack(...)`` is ``wdstream.pack.packer.pack``. This package is made callable because
it shares the name: once any of its modules is imported, ``wdstream.pack`` names the package.
"""

from __future__ import annotations

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .packer import pack

        return pack(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
