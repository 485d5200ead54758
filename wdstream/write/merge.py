"""Joining manifests, and the part manifests of one ``pack(part=...)`` run back into the
``index.json`` a single run writes (``wdstream index --merge``)."""

from __future__ import annotations

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
    from wdstream.shards.index import merge_manifests

    merged = merge_manifests(manifests, output)
    packed = [m.extra.get("packed_by") or {} for m in manifests]
    packed = [p if isinstance(p, dict) else {} for p in packed]  # read from storage: any JSON
    parts = [p.get("part") for p in packed]
    if parts and all(_is_part(p) for p in parts) and all(
            _shard_index(shard.url) is not None for shard in merged.shards):
        count = parts[0][1]
        same_run = all(
            {k: v for k, v in p.items() if k != "part"}
            == {k: v for k, v in packed[0].items() if k != "part"}
            for p in packed
        )
        in_order = count == len(parts) and sorted(i for i, _ in parts) == list(range(count))
        if same_run and in_order and all(n == count for _, n in parts):
            # Shard names end in -{index:06d}.tar, the shard's index in a single run.
            merged.shards.sort(key=lambda shard: _shard_index(shard.url))
            merged.extra["packed_by"] = {k: v for k, v in packed[0].items() if k != "part"}
            for key, value in manifests[0].extra.items():  # e.g. "tokenizer"
                if key != "packed_by" and all(m.extra.get(key) == value for m in manifests):
                    merged.extra.setdefault(key, value)
    return merged
