"""Looking at a dataset from Python: what it holds, whether its shards are intact, its samples.

The ``wdstream ls``, ``verify`` and ``cat`` commands are thin wrappers over these functions::

    from wdstream.inspection import describe, verify, read_samples, sample_to_json

    summary = describe("s3://bucket/prefix/")          # shards, counts, sizes, extensions, extra
    report = verify("s3://bucket/prefix/", deep=True)  # report.ok, report.problems
    for sample in read_samples("s3://bucket/prefix/", limit=3):
        print(sample_to_json(sample))                   # {"__key__": ..., "jpg": {"bytes": 1234}}

A *source* is what ``StreamingDataset`` accepts: a dataset prefix (with ``index.json``, or else
the ``*.tar`` files directly under it), a manifest URL ending in ``.json``, a brace pattern
(``s3://b/shard-{000000..000009}.tar``), a single ``.tar`` URL, or a list of shard URLs.
``allow_external_shards`` is ``StreamingDataset``'s: a manifest may then name shards outside
its prefix (never a ``pipe:`` command).
Only ``benchmark`` imports torch, when it is called.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from wdstream.errors import InputError, ShardError, StreamError, WdstreamError
from wdstream.shards.compression import not_shards_note
from wdstream.shards.locate import Shards, find_shards
from wdstream.shards.manifest import Manifest
from wdstream.sources import urls as urlmod

Progress = Callable[[int], object]  # called with a number of bytes just read


class _Cancelled(Exception):
    """Raised in worker threads at their next read once the main thread was interrupted."""


def _parallel(function: Callable, items: Sequence, workers: int,
              stop: threading.Event | None = None) -> list:
    """``[function(item) for item in items]`` in ``workers`` threads, in order. If the main
    thread is interrupted (Ctrl-C), ``stop`` is set so that readers give up promptly."""
    if workers < 1:
        raise InputError(f"workers must be at least 1, got {workers}")
    if workers == 1 or len(items) <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(function, item) for item in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            if stop is not None:
                stop.set()
            for f in futures:
                f.cancel()
            raise


def _reporter(progress: Progress | None, stop: threading.Event) -> Progress:
    """A per-chunk callback for reader threads: ``progress`` made thread-safe, and the place
    where a reader notices that the run was interrupted."""
    lock = threading.Lock()

    def report(nbytes: int) -> None:
        if stop.is_set():
            raise _Cancelled()
        if progress is not None:
            with lock:
                progress(nbytes)

    return report


# --------------------------------------------------------------------------- describe


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
        counts = [s.samples for s in self.shards]
        return None if any(c is None for c in counts) else sum(counts)

    @property
    def bytes(self) -> int | None:
        sizes = [s.bytes for s in self.shards]
        return None if any(b is None for b in sizes) else sum(sizes)

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

    from wdstream.shards.index import index_shard
    from wdstream.shards.samples import StrayCount

    stop = threading.Event()
    report = _reporter(progress, stop)

    def scan_one(item: tuple[str, str, int | None]) -> tuple[ShardSummary, set[str]]:
        name, url, size = item
        strays = StrayCount()
        try:
            info, extensions = index_shard(url, progress=report, strays=strays)
        except (ShardError, StreamError) as error:
            return ShardSummary(name, url, None, size, problem=_problem_text(error, url)), set()
        return ShardSummary(name, url, info.samples, info.bytes, info.sha256,
                            stray_members=strays.count), extensions

    results = _parallel(scan_one, list(zip(found.names, found.urls, found.sizes, strict=True)),
                        workers, stop)
    extensions = sorted(set().union(*(exts for _, exts in results)))
    return DatasetSummary(found.source, None, found.how, True, [s for s, _ in results],
                          extensions, not_shards=dict(found.not_shards))


def _problem_text(error: WdstreamError, url: str) -> str:
    """An error's message without the shard URL in front (tables name the shard already)."""
    text = str(error)
    return text[len(url) + 2:] if text.startswith(url + ": ") else text


# --------------------------------------------------------------------------- verify


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


class _Hashing:
    """Wraps a stream: hashes, counts and reports every byte read."""

    def __init__(self, stream, progress: Progress | None):
        self._stream = stream
        # read1: return what has arrived rather than wait for n bytes, so that progress (and
        # an interruption, noticed in the progress callback) come chunk by chunk
        self._read = getattr(stream, "read1", stream.read)
        self._progress = progress
        self.digest = hashlib.sha256()
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self._read(n)
        if data:
            self.digest.update(data)
            self.count += len(data)
            if self._progress is not None:
                self._progress(len(data))
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def _check_size(check: ShardCheck, size: int) -> bool:
    """Record a size that differs from the manifest's; True if it does."""
    if check.expected_bytes is None or size == check.expected_bytes:
        return False
    check.problems.append(f"size {size:,} bytes, the manifest says {check.expected_bytes:,}")
    return True


def _parse(check: ShardCheck, reader: _Hashing, url: str) -> None:
    """Count the samples of a tar (or compressed tar) read from ``reader``; record a parse
    failure, a cut compressed stream or a missing end-of-archive marker as a problem."""
    from wdstream.shards.compression import open_tar
    from wdstream.shards.samples import StrayCount, iter_samples
    from wdstream.shards.tar_reader import iter_members

    strays = StrayCount()
    count = 0
    try:
        members = iter_members(open_tar(reader, url), url)
        for _sample in iter_samples(members, url, strays):
            count += 1
    except ShardError as error:
        check.problems.append(_problem_text(error, url))
        return
    check.samples = count
    check.stray_members, check.stray_names = strays.count, strays.names
    if not members.complete:
        check.problems.append(f"no end-of-archive marker after byte {members.offset:,} "
                              "(truncated at a member boundary?)")


def check_shard(check: ShardCheck, *, deep: bool, opener: str | None = None,
                progress: Progress | None = None) -> ShardCheck:
    """Fill in ``check``: the shard exists, its size, its sha256, and with ``deep`` that it
    parses as a complete tar holding ``expected_samples`` samples. Problems are appended to
    ``check.problems``; only a programming error raises."""
    from wdstream.sources.objects import size as object_size
    from wdstream.sources.openers import open_read

    url = check.url
    size_wrong = False
    if urlmod.scheme(url) != "pipe":  # a pipe has no size to ask for: read it
        try:
            check.size = object_size(url)
        except StreamError as error:
            text = _problem_text(error, url)
            check.problems.append("missing" if text.startswith("not found")
                                  else f"cannot read: {text}")
            return check
        except InputError as error:
            check.problems.append(_problem_text(error, url))
            return check
        size_wrong = _check_size(check, check.size)
        if size_wrong and not deep:
            return check  # the digest cannot match either: skip the download
    try:
        with open_read(url, opener=opener) as stream:
            reader = _Hashing(stream, progress)
            if deep:
                _parse(check, reader, url)
            reader.drain()
    except (StreamError, InputError) as error:
        check.problems.append(f"cannot read: {_problem_text(error, url)}")
        return check
    check.sha256 = reader.digest.hexdigest()
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
) -> VerifyReport:
    """Check every shard against the manifest: it exists, its size and sha256 match; with
    ``deep`` also that it parses as a complete tar with the stated number of samples.

    Without a manifest there is nothing to compare with: every shard is parsed (as with
    ``deep``) and the report's notes say so. Problems in the data are in the report (``ok``,
    ``problems``); a source that cannot be resolved raises (ManifestError, StreamError,
    InputError). ``progress(nbytes)`` is called as bytes are read, from ``workers`` threads.
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
    report = _reporter(progress, stop)
    checked = _parallel(lambda c: check_shard(c, deep=deep, opener=opener, progress=report),
                        checks, workers, stop)
    strays = sum(c.stray_members or 0 for c in checked)
    if strays:
        names = [name for c in checked for name in c.stray_names][:5]
        notes.append(f"{strays:,} member(s) that belong to no sample were skipped, as "
                     f"webdataset skips them: {', '.join(names)}{', ...' if strays > 5 else ''}")
    return VerifyReport(found.source, manifest.url if manifest else None, deep, checked, notes)


def _unlisted_note(manifest: Manifest, listed_urls: list[str]) -> list[str]:
    """A note naming ``*.tar`` files next to the manifest that it does not list."""
    base = manifest.base
    if not base or urlmod.scheme(base) == "pipe":
        return []
    from wdstream.sources.objects import list_files

    try:
        from wdstream.shards.compression import SHARD_SUFFIXES

        present = list_files(base, suffix=SHARD_SUFFIXES)
    except WdstreamError:
        return []
    known = set(listed_urls)
    extra = [urlmod.relative_to(url, base) for url, _ in present if url not in known]
    if not extra:
        return []
    shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
    return [f"{len(extra)} shard file(s) next to the manifest are not in it: {shown}"]


# --------------------------------------------------------------------------- cat


def read_samples(
    source: str | Sequence[str] | Shards,
    *,
    key: str | None = None,
    limit: int | None = None,
    opener: str | None = None,
    allow_external_shards: bool = False,
) -> Iterator[dict]:
    """Raw samples (``{"__key__", "__url__", ext: bytes}``) in file order: shard by shard as
    listed, members as stored, no shuffling.

    ``key`` yields only the first sample with that key, and raises InputError if no shard
    holds it; ``limit`` stops after that many samples. A corrupt shard raises ShardError.
    """
    from wdstream.shards.compression import DecompressingStream, open_tar
    from wdstream.shards.identity import head_check
    from wdstream.shards.samples import iter_samples
    from wdstream.shards.tar_reader import iter_members
    from wdstream.sources.openers import open_read

    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    found = find_shards(source, allow_external_shards=allow_external_shards)
    yielded = 0
    scanned = 0
    shards = found.manifest.shards if found.manifest is not None else None
    for index, url in enumerate(found.urls):
        if limit is not None and yielded >= limit:
            return
        info = shards[index] if shards is not None else None  # bound and identity, if known
        checks = {} if info is None else {
            "limit": info.bytes or None,
            "on_head": head_check(url, info.head) if info.head else None}
        with open_read(url, opener=opener) as stream:
            tar = open_tar(stream, url, stored_limit=checks.get("limit"))
            if isinstance(tar, DecompressingStream):  # the manifest's bytes are the stored ones
                checks.pop("limit", None)
            for sample in iter_samples(iter_members(tar, url, **checks), url):
                scanned += 1
                if key is not None and sample["__key__"] != key:
                    continue
                yield sample
                yielded += 1
                if key is not None or (limit is not None and yielded >= limit):
                    return
    if key is not None:
        raise InputError(f"{found.source}: no sample with key {key!r} in {scanned:,} samples "
                         f"of {len(found.urls):,} shards")


def member_to_json(ext: str, payload: bytes, *, decode: bool = True,
                   base64_bytes: bool = False) -> object:
    """One member as a JSON value: ``json`` parsed, ``txt``/``text`` as str, ``cls`` as int,
    ``npy`` as ``{"npy": {"shape", "dtype"}}``; anything else (or everything when not
    ``decode``) as ``{"bytes": size}`` or ``{"base64": ...}``. A member that fails to decode
    is shown as binary with a ``decode_error``."""
    if decode:
        from wdstream.stream.decode import build_decoders, decode_member

        try:
            value = decode_member(build_decoders(None), ext, payload)
        except Exception as error:  # shown, not raised: cat is for looking
            return _binary(payload, base64_bytes) | {"decode_error": str(error)}
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return {"npy": {"shape": list(value.shape), "dtype": str(value.dtype)}}
        if isinstance(value, bytes):
            return _binary(value, base64_bytes)
        return value
    return _binary(payload, base64_bytes)


def _binary(payload: bytes, base64_bytes: bool) -> dict:
    if base64_bytes:
        return {"base64": base64.b64encode(payload).decode("ascii")}
    return {"bytes": len(payload)}


def sample_to_json(sample: dict, *, fields: Sequence[str] | None = None, decode: bool = True,
                   base64_bytes: bool = False) -> dict:
    """A raw sample as a JSON-serialisable dict: ``__key__``, ``__url__`` (unless ``fields``
    is given) and each member through ``member_to_json``. ``fields`` keeps only those members
    (by extension), in that order; ``__key__`` is always kept."""
    out: dict = {"__key__": sample["__key__"]}
    if fields is None:
        out["__url__"] = sample["__url__"]
        names = [name for name in sample if not name.startswith("__")]
    else:
        names = [name for name in fields if name in sample and not name.startswith("__")]
        if "__url__" in fields:
            out["__url__"] = sample["__url__"]
    for name in names:
        out[name] = member_to_json(name, sample[name], decode=decode, base64_bytes=base64_bytes)
    return out


# --------------------------------------------------------------------------- bench


@dataclass
class BenchResult:
    """What ``benchmark`` measured. ``mb_per_s`` counts shard bytes, estimated from the
    manifest's mean bytes per sample (None without a manifest). ``steady_samples_per_s``
    leaves out the first batch (None with a single batch)."""

    source: str
    workers: int
    batch_size: int | None
    opener: str
    shuffle: bool
    decode: bool | str  # a string: the image mode (decode="rgb8"...)
    bytes_as: str
    batches: int
    samples: int
    seconds: float
    first_batch_seconds: float | None
    samples_per_s: float
    steady_samples_per_s: float | None
    mb_per_s: float | None
    retries: int
    skipped_shards: list[str]
    skipped_samples: int

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (what ``wdstream bench --json`` prints)."""
        return asdict(self)


def benchmark(
    source: str | Sequence[str] | Shards,
    *,
    workers: int = 2,
    batch_size: int | None = 32,
    batches: int | None = None,
    opener: str = "auto",
    shuffle: bool = True,
    decode: bool | str = True,
    on_error: str = "raise",
    bytes_as: str = "bytes",
    progress: Callable[[int], object] | None = None,
    on_length: Callable[[int | None], object] | None = None,
    allow_external_shards: bool = False,
) -> BenchResult:
    """Stream ``source`` through a real ``wdstream.DataLoader`` (one epoch, or the first
    ``batches`` batches) and time it: samples/s, MB/s, time to the first batch, and the
    loader's retry and skip counters. ``bytes_as`` is the loader's (``"tensor"``: undecoded
    members as uint8 tensors, without a copy in this process). ``progress(1)`` is called after
    each batch; ``on_length(n)`` once before the first, with the batches of an epoch (None
    when unknown: no manifest).

    Imports torch. A worker's error is raised as the wdstream error it was (ShardError,
    StreamError...), not wrapped in torch's worker traceback.
    """
    import time

    if workers < 0:
        raise InputError(f"workers must be >= 0, got {workers}")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    if batches is not None and batches < 1:
        raise InputError(f"batches must be >= 1, got {batches}")
    # before importing torch: a bad source fails fast
    found = find_shards(source, allow_external_shards=allow_external_shards)
    from wdstream.stream.dataset import StreamingDataset
    from wdstream.stream.loader import DataLoader

    # the resolved shards as they are: listed names are names, not patterns to expand again
    dataset = StreamingDataset(found.manifest or found, shuffle=shuffle, opener=opener,
                               decode=decode, on_error=on_error,
                               allow_external_shards=allow_external_shards)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, bytes_as=bytes_as)
    manifest = dataset.manifest
    bytes_per_sample = (manifest.bytes / manifest.samples
                        if manifest is not None and manifest.samples else None)

    if on_length is not None:
        on_length(len(loader) if dataset.has_counts else None)
    count = samples = first_samples = 0
    first = None
    start = time.perf_counter()
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        n = _batch_samples(batch)
        samples += n
        count += 1
        if count == 1:
            first_samples = n
        if progress is not None:
            progress(1)
        if batches is not None and count >= batches:
            break
    seconds = time.perf_counter() - start
    steady = None
    if count > 1 and first is not None and seconds > first:
        steady = (samples - first_samples) / (seconds - first)
    stats = loader.stats
    return BenchResult(
        source=found.source,
        workers=workers, batch_size=batch_size, opener=opener, shuffle=shuffle, decode=decode,
        bytes_as=bytes_as, batches=count, samples=samples, seconds=seconds, first_batch_seconds=first,
        samples_per_s=samples / seconds if seconds > 0 else 0.0,
        steady_samples_per_s=steady,
        mb_per_s=(samples * bytes_per_sample / seconds / 1e6
                  if bytes_per_sample is not None and seconds > 0 else None),
        retries=stats["retries"], skipped_shards=list(stats["skipped_shards"]),
        skipped_samples=stats["skipped_samples"],
    )


def _batch_samples(batch) -> int:
    """Samples in a batch from the default collate (a dict with a ``__key__`` list), a list
    of samples, or a single sample (``batch_size=None``)."""
    if isinstance(batch, dict):
        keys = batch.get("__key__")
        return len(keys) if isinstance(keys, (list, tuple)) else 1
    if isinstance(batch, (list, tuple)):
        return len(batch)
    return 1
