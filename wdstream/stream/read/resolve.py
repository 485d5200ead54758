"""A ``StreamingDataset``'s source resolved into what its plan counts and its reader reads:
a shard table (URLs, and with a manifest the sample counts, sizes and identities the reader
checks) and its manifest, or a unit table of raw files (Parquet, JSON Lines, Arrow) read
where they lie."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from wdstream.errors import ManifestError, OptionError
from wdstream.shards.compact import ShardArrays
from wdstream.shards.compression import not_shards_note
from wdstream.shards.locate import NoShardsError, find_shards
from wdstream.shards.manifest import Manifest, check_shard_names
from wdstream.stream.read.shard_reader import ShardTable, SpanReader
from wdstream.stream.read.unit_reader import UnitReader
from wdstream.tables.files import NoFilesError, find_files, names_raw_files
from wdstream.tables.jsonl import json_rows_file
from wdstream.tables.node_units import NodeUnits
from wdstream.tables.reads import Access
from wdstream.tables.units import RawOptions, UnitsAhead, UnitTable, cut_units

log = logging.getLogger("wdstream.dataset")  # the logger name users configure


@dataclass(frozen=True)
class ResolvedSource:
    """``table``: what the plan counts (``samples``) and ``reader`` reads (``SpanReader``
    over shards, ``UnitReader`` over raw files' units); ``totals``: the source's samples
    and bytes when known (a manifest, a unit table)."""

    table: ShardTable | UnitTable
    manifest: Manifest | None
    reader: type = SpanReader

    @property
    def totals(self):
        if self.manifest is not None:
            return self.manifest
        return self.table.totals if isinstance(self.table, UnitTable) else None


def resolve_source(source, allow_external_shards: bool = False,
                   share_manifest=False, raw: RawOptions | None = None,
                   access: Access | None = None) -> ResolvedSource:
    """A manifest URL (one ``….json`` holding JSON Lines is a file of rows:
    ``json_rows_file``), a prefix (with ``index.json``, or else its shard files: ``*.tar`` and
    compressed tars, or else its Parquet, JSON Lines and Arrow files), a brace pattern, or a
    list of shard URLs; raw files, patterns of them or lists of those (read as ``raw`` says,
    through ``access``)."""
    raw, access = raw or RawOptions(), access or Access()
    if isinstance(source, Manifest):
        if source.url is not None:  # read from storage (load_manifest): its names are data
            check_shard_names(source, allow_external=allow_external_shards)
        return from_manifest(source)
    name = _name(source)
    with NodeUnits(name, raw.index, share_manifest) as node:
        if names_raw_files(source) or json_rows_file(source):
            return from_raw_files(source, raw, access, node=node)
        with UnitsAhead(name, access, node) as ahead:  # a folder's files, as it is listed
            try:
                found = find_shards(source, allow_external_shards=allow_external_shards,
                                    share_manifest=share_manifest, on_page=ahead.on_page)
            except NoShardsError as error:
                try:
                    return from_raw_files(source, raw, access, error.entries, ahead, node)
                except NoFilesError:
                    raise ManifestError(f"{error} and no Parquet, JSON Lines or Arrow files "
                                        "below it") from error
    if raw != RawOptions():
        given = [name for name, value in vars(raw).items() if value is not None]
        raise OptionError(f"{source}: {', '.join(given)} apply to raw files only (Parquet, "
                          "JSON Lines, Arrow), and these are shards" + (
                              ", streamed whole: pack a slice of a split as a dataset of its "
                              "own" if raw.rows is not None else ""))
    if found.manifest is not None:
        return from_manifest(found.manifest)
    if found.how == "listing":
        log.warning("%s: no index.json; streaming %d shards found there without sample counts "
                    "(run `wdstream index %s` for equal batches per rank and elastic resume)",
                    found.source, len(found.urls), found.source)
        if found.not_shards:
            log.warning("%s: %s", found.source, not_shards_note(found.not_shards))
    sizes = cast("list[int]", found.sizes) if found.how == "listing" and all(found.sizes) \
        else None  # all known (no None) when all() holds
    return ResolvedSource(ShardTable(found.urls, bytes=sizes), None)  # sizes bound the reads


def from_raw_files(source, raw: RawOptions, access: Access, entries: list[dict] | None = None,
                   ahead: UnitsAhead | None = None, node: NodeUnits | None = None
                   ) -> ResolvedSource:
    """Raw files streamed where they lie: their units found from their metadata.
    ``entries``: the listing of the folder ``source``, everything under it, when made;
    ``ahead``: the folder's files cut into units as they are listed; ``node``: the units
    the node's ranks share. A source of several splits or formats is refused
    (``find_files``'s ``one_dataset``)."""
    files = find_files(source, entries, None if ahead is None else ahead.on_page,
                       one_dataset=True)
    return ResolvedSource(cut_units(_name(source), files, raw, access, ahead, node), None,
                          UnitReader)


def _name(source) -> str:
    """A source as messages and the node's shared units name it: a list's items joined."""
    return ", ".join(map(str, source)) if isinstance(source, list | tuple) else str(source)


def from_manifest(manifest: Manifest) -> ResolvedSource:
    shards = manifest.shards
    if isinstance(shards, ShardArrays):  # a large manifest: arrays, URLs made when opened
        return ResolvedSource(ShardTable(urls=shards.urls(manifest.base or ""),
                                  samples=cast(Sequence[int], shards.samples),  # an int array
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
