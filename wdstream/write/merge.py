"""Joining manifests, and the part manifests of one ``pack(part=...)`` run back into the
``index.json`` a single run writes (``wdstream index --merge``)."""

from __future__ import annotations

from typing import Any

from wdstream.shards.index_shards import merge_manifests
from wdstream.shards.manifest import Manifest


def _is_part(value) -> bool:
    """``packed_by.part`` as ``pack(part=...)`` writes it: ``[index, count]``."""
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _shard_index(url: str) -> int | None:
    """The index a shard name ends in (``...-000012.tar`` -> 12), or None."""
    digits = url.rsplit("-", 1)[-1].split(".")[0]
    return int(digits) if digits.isdigit() and digits.isascii() else None


def merge_parts(manifests: list[Manifest], output: str) -> Manifest:
    """Join manifests into one for ``output`` (``wdstream index --merge``).

    When the manifests are all the parts of one ``pack(part=...)`` run, the shards are put back
    in their global order and the packing options kept, so the result equals the manifest of a
    single run. Other manifests are joined in the order given.
    """
    merged = merge_manifests(manifests, output)
    packed = [_packed_by(manifest) for manifest in manifests]
    if _parts_of_one_run(packed) and all(
            _shard_index(shard.url) is not None for shard in merged.shards):
        # Shard names end in -{index:06d}.tar, the shard's index in a single run.
        merged.shards.sort(key=lambda shard: _shard_index(shard.url) or 0)  # none is None
        merged.extra["packed_by"] = _without_part(packed[0])
        for key, value in manifests[0].extra.items():  # e.g. "tokenizer"
            if key != "packed_by" and all(m.extra.get(key) == value for m in manifests):
                merged.extra.setdefault(key, value)
    return merged


def _packed_by(manifest: Manifest) -> dict:
    """How the manifest's shards were packed; ``{}`` if it does not say (read from storage:
    any JSON)."""
    packed = manifest.extra.get("packed_by") or {}
    return packed if isinstance(packed, dict) else {}


def _without_part(packed: dict) -> dict:
    return {key: value for key, value in packed.items() if key != "part"}


def _parts_of_one_run(packed: list[dict]) -> bool:
    """Whether ``packed`` (each manifest's ``packed_by``) are the parts 0 to n - 1 of one
    ``pack(part=(i, n))`` run: the same options, each part once."""
    parts: list[Any] = [p.get("part") for p in packed]  # JSON values, checked by _is_part
    if not parts or not all(_is_part(part) for part in parts):
        return False
    count = parts[0][1]
    same_run = all(_without_part(p) == _without_part(packed[0]) for p in packed)
    in_order = count == len(parts) and sorted(i for i, _ in parts) == list(range(count))
    return same_run and in_order and all(n == count for _, n in parts)
