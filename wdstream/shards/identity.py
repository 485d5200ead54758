"""A shard's identity, checked at negligible cost on every read.

Two manifest keys per shard, written by ``wdstream pack`` and ``wdstream index`` (older
manifests without them still read, with only the counts checked):

- ``head``: the first 32 hex digits of the sha256 of the shard's first ``HEAD_BYTES`` bytes (all
  of it when shorter): its first header(s), so the first member's name, size and the start of
  its payload. Checked before the first sample is parsed, so another object at the shard's URL
  is caught before anything of it is delivered.
- ``last_key``: the key of the shard's last sample, checked at the shard's end with the sample
  and byte counts.

See docs/integrity.md for what these catch and what only ``verify_digest`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from wdstream.errors import ShardMismatchError
from wdstream.sources.hashing import HEAD_BYTES, HEAD_DIGITS, head_digest

HEAD_PATTERN = re.compile(f"[0-9a-f]{{{HEAD_DIGITS}}}")

__all__ = ["HEAD_BYTES", "HeadRecorder", "head_check", "head_digest"]


def head_check(url: str, expected: str) -> Callable[[bytes], None]:
    """An ``on_head`` for ``iter_members``: raises ShardMismatchError unless the shard's first
    bytes have the ``head`` the manifest records."""

    def check(first: bytes) -> None:
        found = head_digest(first)
        if found != expected:
            raise ShardMismatchError(
                f"{url}: not the shard the manifest describes: its first {len(first)} bytes "
                f"hash to {found}, the manifest's head is {expected} (another object, or a "
                f"shard re-packed in place)")

    return check


class HeadRecorder:
    """An ``on_head`` that keeps the digest, for writing it into a manifest."""

    def __init__(self):
        self.head: str | None = None

    def __call__(self, first: bytes) -> None:
        self.head = head_digest(first)
