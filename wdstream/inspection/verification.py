"""``verify``: whether a dataset's shards are there and intact (size, sha256, with ``deep``
a complete tar with the manifest's sample count); what ``wdstream verify`` prints."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from wdstream.errors import InputError, ShardError, StreamError, WdstreamError
from wdstream.inspection.parallel import Progress, parallel, problem_text, reporter
from wdstream.limits import Limits
from wdstream.shards.compression import SHARD_SUFFIXES, not_shards_note, open_tar
from wdstream.shards.locate import Shards, find_shards
from wdstream.shards.manifest import Manifest
from wdstream.shards.samples import StrayCount, iter_samples
from wdstream.shards.tar_reader import iter_members
from wdstream.sources import urls as urlmod
from wdstream.sources.hashing import HashingReader
from wdstream.sources.objects import list_files
from wdstream.sources.objects import size as object_size
from wdstream.sources.openers import open_read
from wdstream.sources.stores import store_for


@dataclass
class ShardCheck:
    """One shard's verification. ``expected_*`` come from the manifest (None without one);
    ``size``, ``sha256`` and ``samples`` are what was found (None where not checked)."""

    name: str
    url: str
    expected_samples: int | None = None
    expected_bytes: int | None = None
    expected_sha256: str | None = None
    size: int | None = None
    sha256: str | None = None
    samples: int | None = None
    problems: list[str] = field(default_factory=list)
    stray_members: int | None = None  # members of no sample, skipped (deep checks)
    stray_names: list[str] = field(default_factory=list)  # the first few of them

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class VerifyReport:
    """Every shard's check. ``ok`` is True when no shard has a problem; ``notes`` holds things
    worth saying that are not problems (no manifest, shards not listed in it)."""

    source: str
    manifest_url: str | None
    deep: bool
    shards: list[ShardCheck]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shards)

    @property
    def problems(self) -> list[ShardCheck]:
        return [s for s in self.shards if not s.ok]

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (what ``wdstream verify --json`` prints)."""
        return {
            "source": self.source,
            "manifest": self.manifest_url,
            "deep": self.deep,
            "ok": self.ok,
            "shards_checked": len(self.shards),
            "shards_with_problems": len(self.problems),
            "shards": [asdict(s) | {"ok": s.ok} for s in self.shards],
            "notes": self.notes,
        }


def _check_size(check: ShardCheck, size: int | None) -> bool:
    """Record a size that differs from the manifest's; True if it does. An unknown size
    (a server that sends no Content-Length) differs from nothing: the digest tells."""
    if check.expected_bytes is None or size is None or size == check.expected_bytes:
        return False
    check.problems.append(f"size {size:,} bytes, the manifest says {check.expected_bytes:,}")
    return True


def _parse(check: ShardCheck, reader: HashingReader, url: str, limits: Limits) -> None:
    """Count the samples of a tar (or compressed tar) read from ``reader``; record a parse
    failure, a cut compressed stream, data past ``limits`` or a missing end-of-archive marker
    as a problem."""
    strays = StrayCount()
    count = 0
    try:
        members = iter_members(open_tar(reader, url, limits=limits), url,
                               member_limit=limits.sample_bytes)
        for _sample in iter_samples(members, url, strays, limits.sample_bytes):
            count += 1
    except ShardError as error:
        check.problems.append(problem_text(error, url))
        return
    check.samples = count
    check.stray_members, check.stray_names = strays.count, strays.names
    if not members.complete:
        check.problems.append(f"no end-of-archive marker after byte {members.offset:,} "
                              "(truncated at a member boundary?)")


def check_shard(check: ShardCheck, *, deep: bool, opener: str | None = None,
                progress: Progress | None = None, limits: Limits | None = None) -> ShardCheck:
    """Fill in ``check``: the shard exists, its size, its sha256, and with ``deep`` that it
    parses as a complete tar holding ``expected_samples`` samples, within ``limits``
    (default ``Limits()``). Problems are appended to ``check.problems``; only a programming
    error raises."""
    url = check.url
    size_wrong = False
    if not store_for(url).runs_command:  # a pipe has no size to ask for: read it
        try:
            check.size = object_size(url)
        except StreamError as error:
            text = problem_text(error, url)
            check.problems.append("missing" if text.startswith("not found")
                                  else f"cannot read: {text}")
            return check
        except InputError as error:
            check.problems.append(problem_text(error, url))
            return check
        size_wrong = _check_size(check, check.size)
        if size_wrong and not deep:
            return check  # the digest cannot match either: skip the download
    try:
        with open_read(url, opener=opener) as stream:
            reader = HashingReader(stream, progress, read1=True)
            if deep:
                _parse(check, reader, url, Limits() if limits is None else limits)
            reader.drain()
    except (StreamError, InputError) as error:
        check.problems.append(f"cannot read: {problem_text(error, url)}")
        return check
    check.sha256 = reader.hexdigest()
    if check.size is None:
        check.size = reader.count
        size_wrong = _check_size(check, check.size)
    elif reader.count != check.size:
        size_wrong = True
        check.problems.append(f"read {reader.count:,} of its {check.size:,} bytes "
                              "(changed while reading?)")
    if check.expected_sha256 and check.sha256 != check.expected_sha256 and not size_wrong:
        check.problems.append(f"sha256 {check.sha256[:12]}... differs from the manifest's "
                              f"{check.expected_sha256[:12]}... (same size, other bytes)")
    if (check.samples is not None and check.expected_samples is not None
            and check.samples != check.expected_samples):
        check.problems.append(f"{check.samples:,} samples, the manifest says "
                              f"{check.expected_samples:,}")
    return check


def verify(
    source: str | Sequence[str] | Shards,
    *,
    deep: bool = False,
    workers: int = 8,
    opener: str | None = None,
    progress: Progress | None = None,
    allow_external_shards: bool = False,
    limits: Limits | None = None,
) -> VerifyReport:
    """Check every shard against the manifest: it exists, its size and sha256 match; with
    ``deep`` also that it parses as a complete tar with the stated number of samples.

    Without a manifest there is nothing to compare with: every shard is parsed (as with
    ``deep``) and the report's notes say so. Problems in the data are in the report (``ok``,
    ``problems``); a source that cannot be resolved raises (ManifestError, StreamError,
    InputError). ``progress(nbytes)`` is called as bytes are read, from ``workers`` threads.
    ``limits``: what a shard may expand to (``wdstream.Limits``; a shard past one has a
    problem).
    """
    found = find_shards(source, allow_external_shards=allow_external_shards)
    manifest = found.manifest
    notes: list[str] = []
    if manifest is None:
        deep = True
        notes.append("no manifest: checked only that each shard is a complete tar "
                     "(run `wdstream index` to record sizes, digests and sample counts)")
        checks = [ShardCheck(name, url) for name, url in zip(found.names, found.urls, strict=True)]
    else:
        checks = [
            ShardCheck(name, url, info.samples, info.bytes, info.sha256)
            for name, url, info in zip(found.names, found.urls, manifest.shards, strict=True)
        ]
        if any(info.sha256 is None for info in manifest.shards):
            notes.append("the manifest has no sha256 for some shards: their digests were not "
                         "compared")
        notes.extend(_unlisted_note(manifest, found.urls))
    if found.not_shards:
        notes.append(not_shards_note(found.not_shards))
    stop = threading.Event()
    report = reporter(progress, stop)
    checked = parallel(lambda c: check_shard(c, deep=deep, opener=opener, progress=report,
                                             limits=limits),
                        checks, workers, stop)
    strays = sum(c.stray_members or 0 for c in checked)
    if strays:
        names = [name for c in checked for name in c.stray_names][:5]
        notes.append(f"{strays:,} member(s) that belong to no sample were skipped, as "
                     f"webdataset skips them: {', '.join(names)}{', ...' if strays > 5 else ''}")
    return VerifyReport(found.source, manifest.url if manifest else None, deep, checked, notes)


def _unlisted_note(manifest: Manifest, listed_urls: Sequence[str]) -> list[str]:
    """A note naming ``*.tar`` files next to the manifest that it does not list."""
    base = manifest.base
    if not base or store_for(base).runs_command:
        return []

    try:
        present = list_files(base, suffix=SHARD_SUFFIXES)
    except WdstreamError:
        return []
    known = set(listed_urls)
    extra = [urlmod.relative_to(url, base) for url, _ in present if url not in known]
    if not extra:
        return []
    shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
    return [f"{len(extra)} shard file(s) next to the manifest are not in it: {shown}"]
