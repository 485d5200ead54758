"""``describe``: what a dataset holds (shards, sample counts, sizes, extensions, the
manifest's extra keys); what ``wdstream ls`` prints."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from wdstream.errors import ShardError, StreamError
from wdstream.inspection.parallel import Progress, parallel, problem_text, reporter
from wdstream.shards.index_shards import index_shard
from wdstream.shards.locate import Shards, find_shards
from wdstream.shards.samples import StrayCount


@dataclass
class ShardSummary:
    name: str  # as stored in the manifest, or relative to the listed prefix
    url: str  # the URL it is read from
    samples: int | None  # None: not counted (no manifest and no scan)
    bytes: int | None
    sha256: str | None = None
    problem: str | None = None  # set when a scan could not read the shard
    stray_members: int | None = None  # members of no sample, skipped (counted by a scan)


@dataclass
class DatasetSummary:
    """What ``describe`` found. ``how`` is "manifest", or "listing"/"pattern" when there is no
    manifest (then ``scanned`` says whether the shards were read to count samples)."""

    source: str
    manifest_url: str | None
    how: str
    scanned: bool
    shards: list[ShardSummary]
    extensions: list[str]
    extra: dict = field(default_factory=dict)
    not_shards: dict[str, int] = field(default_factory=dict)  # listed files not read, by kind

    @property
    def samples(self) -> int | None:
        counts = [s.samples for s in self.shards if s.samples is not None]
        return None if len(counts) < len(self.shards) else sum(counts)

    @property
    def bytes(self) -> int | None:
        sizes = [s.bytes for s in self.shards if s.bytes is not None]
        return None if len(sizes) < len(self.shards) else sum(sizes)

    @property
    def problems(self) -> list[ShardSummary]:
        return [s for s in self.shards if s.problem]

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (what ``wdstream ls --json`` prints)."""
        return {
            "source": self.source,
            "manifest": self.manifest_url,
            "how": self.how,
            "scanned": self.scanned,
            "shards": [asdict(s) for s in self.shards],
            "samples": self.samples,
            "bytes": self.bytes,
            "extensions": self.extensions,
            "extra": self.extra,
            "not_shards": self.not_shards,
        }


def describe(
    source: str | Sequence[str] | Shards,
    *,
    scan: bool = True,
    workers: int = 8,
    progress: Progress | None = None,
    allow_external_shards: bool = False,
) -> DatasetSummary:
    """Shards, sample counts, sizes, member extensions and the manifest's extra keys (how the
    dataset was packed).

    With a manifest nothing but the manifest is read. Without one the shards are listed and,
    if ``scan``, read (``workers`` at a time) to count samples and find extensions; a shard that
    cannot be read gets a ``problem`` instead of failing the whole call.
    ``progress(nbytes)`` is called as shard bytes are read.
    """
    found = find_shards(source, allow_external_shards=allow_external_shards)
    manifest = found.manifest
    if manifest is not None:
        shards = [
            ShardSummary(name, url, info.samples, info.bytes, info.sha256)
            for name, url, info in zip(found.names, found.urls, manifest.shards, strict=True)
        ]
        return DatasetSummary(found.source, manifest.url, "manifest", False, shards,
                              sorted(manifest.extensions), dict(manifest.extra))
    if not scan:
        shards = [ShardSummary(name, url, None, size)
                  for name, url, size in zip(found.names, found.urls, found.sizes, strict=True)]
        return DatasetSummary(found.source, None, found.how, False, shards, [],
                              not_shards=dict(found.not_shards))

    stop = threading.Event()
    report = reporter(progress, stop)

    def scan_one(item: tuple[str, str, int | None]) -> tuple[ShardSummary, set[str]]:
        name, url, size = item
        strays = StrayCount()
        try:
            info, extensions = index_shard(url, progress=report, strays=strays)
        except (ShardError, StreamError) as error:
            return ShardSummary(name, url, None, size, problem=problem_text(error, url)), set()
        return ShardSummary(name, url, info.samples, info.bytes, info.sha256,
                            stray_members=strays.count), extensions

    results = parallel(scan_one, list(zip(found.names, found.urls, found.sizes, strict=True)),
                        workers, stop)
    extensions = sorted(set().union(*(exts for _, exts in results)))
    return DatasetSummary(found.source, None, found.how, True, [s for s, _ in results],
                          extensions, not_shards=dict(found.not_shards))
