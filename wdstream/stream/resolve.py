"""A ``StreamingDataset``'s source resolved into its shard table (URLs, and with a manifest
the sample counts, sizes and identities the reader checks) and its manifest."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from wdstream.shards.compact import ShardArrays
from wdstream.shards.locate import find_shards
from wdstream.shards.manifest import Manifest, check_shard_names
from wdstream.stream.read import ShardTable

log = logging.getLogger("wdstream.dataset")  # the logger name users configure


@dataclass(frozen=True)
class ResolvedSource:
    table: ShardTable
    manifest: Manifest | None


def resolve_source(source, allow_external_shards: bool = False,
                   share_manifest=False) -> ResolvedSource:
    """A manifest URL, a prefix (with ``index.json``, or else its shard files: ``*.tar`` and
    compressed tars), a brace pattern, or a list of shard URLs."""
    if isinstance(source, Manifest):
        if source.url is not None:  # read from storage (load_manifest): its names are data
            check_shard_names(source, allow_external=allow_external_shards)
        return from_manifest(source)
    found = find_shards(source, allow_external_shards=allow_external_shards,
                        share_manifest=share_manifest)
    if found.manifest is not None:
        return from_manifest(found.manifest)
    if found.how == "listing":
        log.warning("%s: no index.json; streaming %d shards found there without sample counts "
                    "(run `wdstream index %s` for equal batches per rank and exact resume)",
                    found.source, len(found.urls), found.source)
        if found.not_shards:
            from wdstream.shards.compression import not_shards_note

            log.warning("%s: %s", found.source, not_shards_note(found.not_shards))
    sizes = found.sizes if found.how == "listing" and all(found.sizes) else None
    return ResolvedSource(ShardTable(found.urls, bytes=sizes), None)  # sizes bound the reads


def from_manifest(manifest: Manifest) -> ResolvedSource:
    shards = manifest.shards
    if isinstance(shards, ShardArrays):  # a large manifest: arrays, URLs made when opened
        return ResolvedSource(ShardTable(urls=shards.urls(manifest.base or ""), samples=shards.samples,
                                  bytes=shards.sizes(), sha256=shards.digests(),
                                  heads=shards.heads(), last_keys=shards.last_keys()), manifest)
    table = ShardTable(
        urls=[manifest.shard_url(i) for i in range(len(shards))],
        samples=[s.samples for s in shards],
        bytes=[s.bytes for s in shards],
        sha256=[s.sha256 for s in shards],
        heads=[s.head for s in shards],
        last_keys=[s.last_key for s in shards],
    )
    return ResolvedSource(table, manifest)
