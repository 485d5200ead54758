"""wdstream: stream WebDataset shards from cloud storage into PyTorch, and resume exactly.

Importing this package is cheap: torch, cloud SDKs and fsspec back-ends are imported by the
modules that use them, the first time they are used.
"""

from __future__ import annotations

import importlib

from wdstream.errors import (
    InputError,
    LimitError,
    ManifestError,
    ShardError,
    StateError,
    StreamError,
    WdstreamError,
)
from wdstream.sizes import format_size, parse_size

__version__ = "0.1.0"

# Public names that pull in torch are resolved on first access (PEP 562).
_LAZY = {
    "StreamingDataset": "wdstream.stream.load.dataset",
    "DataLoader": "wdstream.stream.load.loader",
    "collate": "wdstream.stream.transfer.batching",
    "Manifest": "wdstream.shards.manifest",
    "Limits": "wdstream.limits",
    "pack": "wdstream.write.packer",
    "Mix": "wdstream.stages.mix",
    "PackedSequences": "wdstream.stages.sequences",
    "from_config": "wdstream.stages.config.build",
}

__all__ = [
    "DataLoader",
    "InputError",
    "LimitError",
    "Limits",
    "Manifest",
    "ManifestError",
    "Mix",
    "PackedSequences",
    "ShardError",
    "StateError",
    "StreamError",
    "StreamingDataset",
    "WdstreamError",
    "collate",
    "format_size",
    "from_config",
    "pack",
    "parse_size",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wdstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
