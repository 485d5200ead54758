"""Finding a dataset's shards: from its manifest, a listing of its prefix, a brace pattern or
a list of URLs. ``StreamingDataset`` and the inspection commands resolve sources here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from wdstream.errors import InputError, ManifestError
from wdstream.shards.compact import ShardArrays
from wdstream.shards.compression import is_shard_name, not_shard_kinds
from wdstream.shards.manifest import Manifest, ManifestNotFoundError, load_manifest
from wdstream.sources import urls as urlmod
from wdstream.sources.objects import folder_entries, list_files
from wdstream.sources.stores import store_for


class NoShardsError(ManifestError):
    """A prefix with neither a manifest nor shard files (it may hold raw files, which
    ``StreamingDataset`` streams where they lie). ``entries``: the listing of a remote
    prefix that holds no folders, everything under it (None: list it anew)."""

    def __init__(self, message: str, entries: list[dict] | None = None):
        super().__init__(message)
        self.entries = entries


@dataclass
class Shards:
    """The shards a source names, in order, and the manifest if there is one.

    ``names`` are the URLs as a person reads them: as stored in the manifest (relative to its
    prefix) or relative to the listed prefix. ``sizes`` are known from a listing or the manifest,
    else None. ``how`` says where the list came from: "manifest", "listing" or "pattern".
    ``not_shards``: files a listing found that are not shards wdstream reads, by kind
    (``{".tar.lz4": 2}``), so that nothing is left out without a word.
    """

    source: str
    urls: Sequence[str]  # lists, or compact.ShardArrays' views
    names: Sequence[str]
    sizes: Sequence[int | None]
    manifest: Manifest | None = None
    how: str = "manifest"
    not_shards: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:  # what messages about the source show
        return self.source


def find_shards(source: str | Sequence[str] | Shards, *, allow_external_shards: bool = False,
                share_manifest=False, on_page: Callable[[list[dict]], None] | None = None
                ) -> Shards:
    """Resolve ``source`` the way ``StreamingDataset`` does (a ``Shards`` is returned as is,
    so callers can resolve once and pass the result on).

    Raises ManifestError for a missing or invalid manifest URL (``….json``), for a manifest
    naming a shard outside its prefix (unless ``allow_external_shards``) or a ``pipe:``
    command, and for a prefix with neither ``index.json`` nor shard files (``*.tar``,
    ``*.tar.gz``...); StreamError when storage is unreachable. Listed objects are names under
    the prefix, whatever they are called. ``share_manifest``: see ``load_manifest``'s
    ``share``; ``on_page``: ``folder_entries``'s, when a remote prefix is listed.
    """
    if isinstance(source, Shards):
        return source
    if isinstance(source, (list, tuple)):
        found = urlmod.expand(list(source))
        return Shards(", ".join(map(str, source)), found, _short_names(found),
                      [None] * len(found), how="pattern")
    source = str(source)
    if not source:
        raise InputError("no source given")
    if "{" in source or is_shard_name(source) or store_for(source).runs_command:
        found = urlmod.expand(source)
        return Shards(source, found, _short_names(found), [None] * len(found), how="pattern")
    try:
        manifest = load_manifest(source, allow_external_shards=allow_external_shards,
                                 share=share_manifest)
    except ManifestNotFoundError as error:
        if source.endswith(".json"):
            raise
        try:
            return _listed(source, on_page)
        except NoShardsError as missing:
            raise missing from error
    count = len(manifest.shards)
    shards = manifest.shards
    if isinstance(shards, ShardArrays):  # views, nothing made per shard
        return Shards(source, shards.urls(manifest.base or ""), shards.names(),
                      shards.sizes(), manifest=manifest)
    return Shards(
        source,
        [manifest.shard_url(i) for i in range(count)],
        [s.url for s in manifest.shards],
        [s.bytes for s in manifest.shards],
        manifest=manifest,
    )


def _listed(source: str, on_page: Callable[[list[dict]], None] | None = None) -> Shards:
    """The shard files directly in the folder ``source`` (which has no manifest)."""
    remote = urlmod.to_local_path(source) is None
    entries = folder_entries(source, on_page) if remote else None
    everything = list_files(source, suffix="", entries=entries)
    listed = [(url, size) for url, size in everything if is_shard_name(url)]
    others = not_shard_kinds(url for url, _ in everything if not is_shard_name(url))
    if not listed:
        kinds = f" (found: {', '.join(sorted(others))})" if others else ""
        flat = entries is not None and all(e.get("type") == "file" for e in entries)
        raise NoShardsError(f"{source}: no index.json and no .tar shards (nor .tar.gz, "
                            f".tgz, .tar.zst, .tar.bz2, .tar.xz) there{kinds}",
                            entries if flat else None)
    return Shards(source, [url for url, _ in listed],
                  [urlmod.relative_to(url, source) for url, _ in listed],
                  [size for _, size in listed], how="listing", not_shards=others)


def _short_names(found: list[str]) -> list[str]:
    """File names when all URLs share one folder, else the URLs as they are."""
    if any(store_for(url).runs_command for url in found):
        return list(found)
    parents = {urlmod.parent(url) for url in found}
    if len(parents) != 1:
        return list(found)
    parent = parents.pop()
    return [url[len(parent):] for url in found]
