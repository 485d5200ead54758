"""A body that hashes, counts and reports every byte read through it, so that one pass
over a shard gives its size and sha256 while it is parsed; and a shard's ``head`` digest, the
hash of its first bytes that a manifest records (``wdstream.shards.identity`` checks it, the
shard cache checks its entries by it)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

HEAD_BYTES = 4096  # what a head covers: the shard's first header(s) and payload bytes
HEAD_DIGITS = 32


def head_digest(first: bytes) -> str:
    """The ``head`` of a shard whose first bytes are ``first`` (only ``HEAD_BYTES`` count)."""
    return hashlib.sha256(first[:HEAD_BYTES]).hexdigest()[:HEAD_DIGITS]


class HashingReader:
    """Wraps ``body``: ``sha256`` (a ``hashlib`` object) and ``count`` take in every byte that
    ``read`` hands out, and ``progress(nbytes)`` is called for each non-empty read.

    ``read1``: answer each read with what the body has at hand (its ``read1``, where it has
    one) rather than wait for ``n`` bytes, so that progress (and an interruption raised from
    the progress callback) come chunk by chunk.
    """

    def __init__(self, body, progress: Callable[[int], object] | None = None, *,
                 read1: bool = False):
        self._read = getattr(body, "read1", body.read) if read1 else body.read
        self._progress = progress
        self.sha256 = hashlib.sha256()
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self._read(n)
        if data:
            self.sha256.update(data)
            self.count += len(data)
            if self._progress is not None:
                self._progress(len(data))
        return data

    def drain(self, chunk: int = 1 << 20) -> None:
        """Read the rest of the body."""
        while self.read(chunk):
            pass

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()
