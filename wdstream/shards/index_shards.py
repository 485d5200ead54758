"""Manifests for shards that already exist (written by wdstream, webdataset, GNU tar...), and
merging manifests."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from wdstream.errors import InputError, ManifestError, ShardError
from wdstream.limits import Limits
from wdstream.printable import printable
from wdstream.shards.compression import (
    DecompressingBody,
    compression_of_name,
    open_tar,
    stored_bytes,
)
from wdstream.shards.identity import HeadRecorder
from wdstream.shards.manifest import Manifest, ShardInfo, count_problem
from wdstream.shards.names import outside_prefix
from wdstream.shards.samples import StrayCount, iter_samples
from wdstream.shards.tar_reader import iter_members
from wdstream.sources import urls as urlmod
from wdstream.sources.hashing import HashingReader
from wdstream.sources.openers import open_read


def index_shard(
    url: str, *, unique_keys: bool = False, progress: Callable[[int], object] | None = None,
    strays: StrayCount | None = None, limits: Limits | None = None,
) -> tuple[ShardInfo, set[str]]:
    """Read one shard: (ShardInfo with ``url`` as given, set of extensions). A compressed
    shard's ``bytes`` and ``sha256`` are those of the stored (compressed) file. Members that
    belong to no sample are counted in ``strays``. ``limits``: what the shard may expand to
    (default ``Limits()``; past one: ``LimitError``).

    A corrupt or truncated tar (including one that lacks the end-of-archive marker, and a cut
    compressed stream) raises ShardError naming ``url``."""
    samples = 0
    extensions: set[str] = set()
    seen: set[str] = set()
    head, key = HeadRecorder(), None
    limits = Limits() if limits is None else limits
    with open_read(url) as stream:
        reader = HashingReader(stream, progress)
        tar = open_tar(stream, url, source=reader, limits=limits)
        members = iter_members(tar, url, on_head=head, member_limit=limits.sample_bytes)
        for sample in iter_samples(members, url, strays, limits.sample_bytes):
            samples += 1
            key = sample["__key__"]
            extensions.update(sample)
            if unique_keys:
                key = sample["__key__"]
                if key in seen:
                    raise ShardError(f"{url}: key {key!r} appears in two samples")
                seen.add(key)
    if not members.complete:
        # A tar cut at a member boundary parses cleanly; indexing it would bless the truncation.
        raise ShardError(
            f"{url}: no end-of-archive marker after byte {members.offset} (truncated?)"
        )
    extensions -= {"__key__", "__url__"}
    nbytes = stored_bytes(tar, members)
    compressed = isinstance(tar, DecompressingBody)
    if compressed and compression_of_name(url) is None:
        raise ShardError(f"{printable(url)}: {tar.kind}-compressed data under a plain .tar name: "
                         "rename it (.tar.gz, .tar.zst...) for a manifest to list it")
    problem = count_problem(samples, nbytes, compressed)
    if problem is not None:
        raise ShardError(f"{printable(url)}: {samples:,} samples in {nbytes:,} bytes: a "
                         f"manifest could not list it (bytes {problem})")
    info = ShardInfo(url, samples, nbytes, reader.hexdigest(), head.head, key)
    return info, extensions


def index_shards(
    urls: list[str],
    *,
    base: str,
    workers: int = 4,
    unique_keys: bool = False,
    progress: Callable[[int], object] | None = None,
    strays: StrayCount | None = None,
    limits: Limits | None = None,
) -> Manifest:
    """Build a manifest for existing shards, reading each once (in ``workers`` threads);
    ``strays`` counts the members that belong to no sample (skipped).

    Shard URLs are stored relative to ``base`` when under it. ``unique_keys`` makes a key that
    appears in two samples of a shard a ShardError (WebDataset readers would yield both).
    ``progress(nbytes)`` is called as bytes are read, from the worker threads. ``limits``:
    what each shard may expand to (``index_shard``).
    """
    for url in urls:  # before reading anything
        try:  # a manifest is UTF-8 JSON: it cannot name a file whose name is not
            url.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{url!r}: the file name is not valid UTF-8, so no manifest can "
                             "list it; rename the shard") from None
        _check_listable(url, urlmod.relative_to(url, base))
    counts = [StrayCount() for _ in urls]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [
            pool.submit(index_shard, url, unique_keys=unique_keys, progress=progress,
                        strays=count, limits=limits)
            for url, count in zip(urls, counts, strict=True)
        ]
        try:
            results = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    if strays is not None:
        for count in counts:
            strays.merge(count)
    shards, extensions = [], set()
    for info, exts in results:
        shards.append(dataclasses.replace(info, url=urlmod.relative_to(info.url, base)))
        extensions |= exts
    return Manifest(shards=shards, extensions=sorted(extensions), base=base)


def _check_listable(url: str, name: str) -> None:
    """InputError if a manifest could not name the shard ``url`` as ``name``: a listed file
    named like a URL or a command, or with control characters, would be refused when read."""
    under_base = name != url and not os.path.isabs(name) and "://" not in name
    if not name.isprintable() or under_base and outside_prefix(name) is not None:
        raise InputError(f"{printable(url)}: a shard named {printable(repr(name))} cannot be "
                         "listed in a manifest (it reads as a URL or a command, or holds "
                         "control characters); rename it")


def merge_manifests(manifests: list[Manifest], output_prefix: str) -> Manifest:
    """One manifest listing the shards of ``manifests`` in order, for ``output_prefix``.

    Shard URLs are rewritten relative to ``output_prefix`` when under it, else absolute. The
    same shard listed twice is a ManifestError; extensions are unioned.
    """
    shards: list[ShardInfo] = []
    sources: list[str | None] = []
    seen: dict[str, str] = {}
    extensions: set[str] = set()
    for m in manifests:
        where = m.url or m.base or "a manifest"
        for i, shard in enumerate(m.shards):
            if m.base is None and not urlmod.is_absolute(shard.url):
                raise ManifestError(f"{where}: shard {shard.url!r} is relative and has no base")
            url = urlmod.relative_to(m.shard_url(i), output_prefix)
            if url in seen:
                raise ManifestError(f"{where}: shard {shard.url!r} is also listed in {seen[url]}")
            seen[url] = where
            shards.append(dataclasses.replace(shard, url=url))
        extensions.update(m.extensions)
        sources.append(m.url or m.base)
    return Manifest(
        shards=shards,
        extensions=sorted(extensions),
        extra={"merged_from": sources},
        base=output_prefix,
    )
