"""Finding a dataset's shards: from its manifest, a listing of its prefix, a brace pattern or
a list of URLs. ``StreamingDataset`` and the inspection commands resolve sources here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError, ManifestError
from ..sources import urls as urlmod
from .manifest import Manifest, ManifestNotFoundError, load_manifest


@dataclass
class Shards:
    """The shards a source names, in order, and the manifest if there is one.

    ``names`` are the URLs as a person reads them: as stored in the manifest (relative to its
    prefix) or relative to the listed prefix. ``sizes`` are known from a listing or the manifest,
    else None. ``how`` says where the list came from: "manifest", "listing" or "pattern".
    """

    source: str
    urls: list[str]
    names: list[str]
    sizes: list[int | None]
    manifest: Manifest | None = None
    how: str = "manifest"


def find_shards(source: str | Sequence[str] | Shards) -> Shards:
    """Resolve ``source`` the way ``StreamingDataset`` does (a ``Shards`` is returned as is,
    so callers can resolve once and pass the result on).

    Raises ManifestError for a missing or invalid manifest URL (``….json``), and for a prefix
    with neither ``index.json`` nor ``*.tar`` files; StreamError when storage is unreachable.
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
    if "{" in source or source.endswith(".tar") or urlmod.scheme(source) == "pipe":
        found = urlmod.expand(source)
        return Shards(source, found, _short_names(found), [None] * len(found), how="pattern")
    try:
        manifest = load_manifest(source)
    except ManifestNotFoundError as error:
        if source.endswith(".json"):
            raise
        from ..sources.writers import list_files

        listed = list_files(source, suffix=".tar")
        if not listed:
            raise ManifestError(f"{source}: no index.json and no .tar shards there") from error
        return Shards(
            source,
            [url for url, _ in listed],
            [urlmod.relative_to(url, source) for url, _ in listed],
            [size for _, size in listed],
            how="listing",
        )
    count = len(manifest.shards)
    if hasattr(manifest.shards, "urls"):  # compact.ShardArrays: views, nothing made per shard
        return Shards(source, manifest.shards.urls(manifest.base or ""), manifest.shards.names(),
                      manifest.shards.sizes(), manifest=manifest)
    return Shards(
        source,
        [manifest.shard_url(i) for i in range(count)],
        [s.url for s in manifest.shards],
        [s.bytes for s in manifest.shards],
        manifest=manifest,
    )


def _short_names(found: list[str]) -> list[str]:
    """File names when all URLs share one folder, else the URLs as they are."""
    if any(urlmod.scheme(url) == "pipe" for url in found):
        return list(found)
    parents = {urlmod.parent(url) for url in found}
    if len(parents) != 1:
        return list(found)
    parent = parents.pop()
    return [url[len(parent):] for url in found]
