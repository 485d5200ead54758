"""``StreamingDataset``: a torch ``IterableDataset`` that executes the epoch plan.

Each DataLoader worker computes the plan (cheap, no I/O), takes its own stream of sample
spans, and runs the pipeline stages: read spans (prefetch, checks, retries) -> window shuffle
-> decode -> the user's ``map``. What to read this iteration (epoch, layout, where each stream
starts after a resume) arrives as an ``IterationSpec`` set by ``wdstream.DataLoader``.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import torch.utils.data

from wdstream import options
from wdstream.errors import (
    InputError,
    ManifestError,
    OptionError,
    ShardError,
    StateError,
    UnsizedError,
    WdstreamError,
)
from wdstream.shards.compact import ShardArrays
from wdstream.shards.locate import find_shards
from wdstream.shards.manifest import Manifest, check_shard_names
from wdstream.shards.samples import split_name
from wdstream.shards.shared import check_share_option
from wdstream.sizes import parse_size
from wdstream.sources.cache import ShardCache
from wdstream.stream.batching import tune_worker_allocator
from wdstream.stream.decode import build_decoders, decode_option, decode_sample, find_decoder
from wdstream.stream.lifetime import closed_at_exit
from wdstream.stream.plan import (
    EpochPlan,
    HistorySegment,
    PlanOptions,
    drop_first,
    shard_streams,
    window_order,
)
from wdstream.stream.read import ReadOptions, ReadStats, ShardTable, SpanReader
from wdstream.stream.shm import CAN_MAP_FILES, FileSpan, read_target
from wdstream.stream.shuffle import window_shuffle
from wdstream.stream.window import DEFAULT_SHUFFLE_BYTES, bounded_window

log = logging.getLogger("wdstream.dataset")  # the logger name users configure

# State of the stream running in this process (a DataLoader worker, or the main process with
# num_workers=0). The loader's collate wrapper ships it with each batch: a worker's fetcher
# pulls exactly one batch of items and then collates, so ``position`` is then the position
# after the batch's last item.
worker_stats = ReadStats()


class _WorkerPosition:
    def __init__(self):
        self.value: object = 0  # the position after the last item handed out (with_positions)
        self.trail: list = []  # under wdstream.DataLoader: the position after each item not
        # yet tagged


worker_position = _WorkerPosition()

# Under wdstream.DataLoader a stream ends with this marker, so that the batch carrying the
# stream's last samples (or an empty one after them) tells the loader the stream is done.
END_OF_STREAM = object()


def with_positions(items: Iterator[tuple[object, object]]) -> Iterator[object]:
    """Yield the items of (item, position after it) pairs, publishing each position."""
    for item, position in items:
        worker_position.value = position
        yield item


class StreamFailure:
    """Under wdstream.DataLoader, the WdstreamError that ended a stream, as the stream's last
    item: it reaches the loader whole (its class and fields, not a worker's traceback text),
    after the batches before it and with the reader's counters (retries made before it)."""

    __slots__ = ("error",)

    def __init__(self, error: WdstreamError):
        self.error = error


def with_trail(items: Iterator[tuple[object, object]]) -> Iterator[object]:
    """``with_positions`` for wdstream.DataLoader: keeps the position after each item instead
    (the loader's collate cuts a fetch into batches and tags each with its own position),
    and ends with ``END_OF_STREAM``, or a ``StreamFailure``."""
    trail = worker_position.trail = []
    append = trail.append
    try:
        for item, position in items:
            append(position)
            yield item
    except WdstreamError as error:
        yield StreamFailure(error)
        return
    yield END_OF_STREAM


def world_info() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else the RANK and
    WORLD_SIZE variables torchrun sets, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@dataclass(frozen=True)
class IterationSpec:
    """What one iteration reads: the epoch, the layout, the segments of this epoch already
    consumed under other layouts, where each stream starts, and which stream worker 0 takes
    (``rotation``: after a resume, the stream whose batch comes next)."""

    epoch: int
    rank: int
    world: int
    workers: int
    history: tuple[HistorySegment, ...] = ()
    start: tuple[int, ...] = ()
    rotation: int = 0
    batch_size: int = 0
    # under wdstream.DataLoader with workers and the default collate: large raw payloads stay
    # in local files for the main process to map, or go straight into the shared memory the
    # batches travel in (wdstream.stream.shm)
    shared_payloads: bool = False


def _check_options(given: dict) -> dict:
    """StreamingDataset's options checked (``OptionError`` naming the accepted values), the
    numbers among them normalised."""
    owner = "StreamingDataset"
    for name in ("opener", "remainder", "on_error", "decode"):
        options.choice(owner, name, given[name])
    options.mapping(owner, "decoders", given["decoders"])
    options.function(owner, "map", given["map"])
    check_share_option(owner, "share_manifest", given["share_manifest"])
    return {
        "opener": given["opener"],
        "shuffle": options.boolean(owner, "shuffle", given["shuffle"]),
        "verify_digest": options.boolean(owner, "verify_digest", given["verify_digest"]),
        "seed": options.integer(owner, "seed", given["seed"], minimum=0),
        "shuffle_window": options.integer(owner, "shuffle_window", given["shuffle_window"],
                                          minimum=1),
        "retries": options.integer(owner, "retries", given["retries"], minimum=0),
        "timeout": options.number(owner, "timeout", given["timeout"], positive=True),
        "retry_backoff": options.number(owner, "retry_backoff", given["retry_backoff"]),
    }


def _check_opener(opener: str, shard_urls: Sequence[str]) -> None:
    """Whether the opener (and ``$WDSTREAM_OPENER`` under "auto") can read these shards: a
    typo or an opener that cannot read a scheme fails now, not at the first read (where
    ``on_error="skip"`` would never skip it either)."""
    from wdstream.sources import urls
    from wdstream.sources.openers import resolve_opener

    seen = set()
    if hasattr(shard_urls, "one_per_scheme"):  # compact.Urls: not a million URLs made here
        shard_urls = shard_urls.one_per_scheme()
    for url in shard_urls:
        kind = urls.scheme(url)
        if kind not in seen:
            seen.add(kind)
            resolve_opener(opener, url)


def _cache_options(cache_dir, cache_limit) -> dict:
    """Check the cache settings now (a bad size or folder fails here, not in a worker)."""
    if cache_dir is None:
        if cache_limit is not None:
            parse_size(cache_limit)
            raise OptionError("StreamingDataset: cache_limit applies to a cache: give cache_dir "
                              "too")
        return {}
    cache = ShardCache(cache_dir, cache_limit)
    return {"cache_dir": cache.directory, "cache_limit": cache.limit}


@dataclass(frozen=True)
class _ResolvedSource:
    table: ShardTable
    manifest: Manifest | None


def _resolve_source(source, allow_external_shards: bool = False,
                    share_manifest=False) -> _ResolvedSource:
    """A manifest URL, a prefix (with ``index.json``, or else its shard files: ``*.tar`` and
    compressed tars), a brace pattern, or a list of shard URLs."""
    if isinstance(source, Manifest):
        if source.url is not None:  # read from storage (load_manifest): its names are data
            check_shard_names(source, allow_external=allow_external_shards)
        return _from_manifest(source)
    found = find_shards(source, allow_external_shards=allow_external_shards,
                        share_manifest=share_manifest)
    if found.manifest is not None:
        return _from_manifest(found.manifest)
    if found.how == "listing":
        log.warning("%s: no index.json; streaming %d shards found there without sample counts "
                    "(run `wdstream index %s` for equal batches per rank and exact resume)",
                    found.source, len(found.urls), found.source)
        if found.not_shards:
            from wdstream.shards.compression import not_shards_note

            log.warning("%s: %s", found.source, not_shards_note(found.not_shards))
    sizes = found.sizes if found.how == "listing" and all(found.sizes) else None
    return _ResolvedSource(ShardTable(found.urls, bytes=sizes), None)  # sizes bound the reads


def _from_manifest(manifest: Manifest) -> _ResolvedSource:
    shards = manifest.shards
    if isinstance(shards, ShardArrays):  # a large manifest: arrays, URLs made when opened
        return _ResolvedSource(ShardTable(urls=shards.urls(manifest.base or ""), samples=shards.samples,
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
    return _ResolvedSource(table, manifest)


class PositionedDataset(torch.utils.data.IterableDataset):
    """What ``StreamingDataset`` and the stages built on it (``Mix``, ``PackedSequences``)
    share: the epoch rules, and iteration as one worker stream whose items carry positions.

    Subclasses implement ``positioned(spec, stream, start)`` (``(item, position after it)``
    pairs from position ``start``), ``plan``, ``has_counts`` and ``fingerprint``, and set
    ``options`` (with ``seed``) and ``source``. ``wdstream.DataLoader`` needs nothing else.
    """

    spec: IterationSpec | None = None  # set by wdstream.DataLoader before iterating
    _epoch = 0
    _epoch_explicit = False
    _started = False
    _live: tuple[IterationSpec, int] | None = None  # the stream iterated in this process
    _stream_resume: dict | None = None  # from load_state_dict (torchdata protocol)

    # ---- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration read epoch ``epoch`` (otherwise each new iteration reads
        the next epoch)."""
        self._epoch = int(epoch)
        self._epoch_explicit = True

    def next_epoch(self) -> int:
        """The epoch the next iteration will read."""
        return self._epoch + (1 if self._started and not self._epoch_explicit else 0)

    def begin_epoch(self) -> int:
        self._epoch = self.next_epoch()
        self._started, self._epoch_explicit = True, False
        return self._epoch

    # ---- what subclasses provide --------------------------------------------------------
    @property
    @abc.abstractmethod
    def has_counts(self) -> bool:
        """Whether ``plan()`` can size the epoch's streams."""

    @abc.abstractmethod
    def plan(self, epoch: int, world: int, workers: int, history: Sequence[HistorySegment] = ()):
        """Per-stream sizes of an epoch (``stream_samples``, ``rank_samples``,
        ``remainder_samples``); raises WdstreamError when they cannot be known."""

    @abc.abstractmethod
    def positioned(self, spec: IterationSpec, stream: int, start) -> Iterator[tuple]:
        """Stream ``stream``'s items from position ``start``, each with the position after
        it; positions are JSON values, never mutated once yielded."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """Identifies the data and the options that shape the order, for resume states."""

    def __len__(self) -> int:
        """Items each rank reads per epoch (``len(loader)`` gives its batches)."""
        _rank, world = world_info()
        try:
            return self.plan(self.next_epoch(), world, 1).rank_samples
        except WdstreamError as error:  # a TypeError: what len() of an unsized object raises
            raise UnsizedError(str(error)) from None

    # ---- iteration ----------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        # Resolve the spec now, not in the generator body: the loader clears it right after
        # creating its iterator.
        spec, worker = self._current_spec()
        stream = (spec.rotation + worker) % spec.workers
        start = spec.start[stream] if spec.start else 0
        self._live = (spec, stream)
        worker_position.value = start
        if self.spec is not None:  # iterated by wdstream.DataLoader
            if torch.utils.data.get_worker_info() is not None:
                tune_worker_allocator()
            return closed_at_exit(with_trail(self.positioned(spec, stream, start)))
        return closed_at_exit(with_positions(self.positioned(spec, stream, start)))

    def _current_spec(self) -> tuple[IterationSpec, int]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        if self.spec is not None:
            return self.spec, worker
        # Used without wdstream.DataLoader: a plain loop or a plain torch DataLoader. Only
        # the main process can advance the epoch; in workers call set_epoch() each epoch.
        if info is not None and info.dataset is not self:
            _check_outer_dataset(info)
        rank, world = world_info()
        workers = info.num_workers if info is not None else 1
        resume, self._stream_resume = self._stream_resume, None
        if resume is not None:
            self._check_stream_state(resume, world, workers, worker)
            self.set_epoch(resume["epoch"])
        epoch = self.begin_epoch() if info is None or resume is not None else self._epoch
        start = [0] * workers
        if resume is not None:
            start[worker] = resume["position"]
        return IterationSpec(epoch, rank, world, workers, start=tuple(start)), worker


def _check_outer_dataset(info) -> None:
    """Iterated inside another dataset in a DataLoader worker, this dataset reads the worker's
    share of its streams: right for a wrapper that iterates it in every worker, a silent loss
    under a Hugging Face ``datasets.IterableDataset``, which already gives each worker only
    some of its shards (a one-shard ``from_generator`` runs in worker 0 alone)."""
    outer = type(info.dataset)
    if outer.__module__.split(".")[0] == "datasets":
        raise InputError(
            f"a wdstream dataset iterated inside a datasets.{outer.__name__} in DataLoader "
            f"worker {info.id} of {info.num_workers} would read only that worker's share of "
            "the shards datasets gave it, and lose the rest: convert it with "
            "wdstream.integrations.hf_datasets.to_iterable_dataset(ds, num_workers="
            f"{info.num_workers}) (one shard per wdstream stream), or use wdstream.DataLoader")


class StreamingDataset(PositionedDataset):
    """Samples streamed from WebDataset shards, in an order fixed by (seed, epoch, layout).

    ``source``: a prefix or manifest URL (``s3://bucket/prefix/``, ``…/index.json``), a brace
    pattern (``s3://b/shard-{000000..000099}.tar``), or a list of shard URLs; local paths,
    ``s3://``, ``gs://``, ``pipe:COMMAND`` and other fsspec URLs.

    A sample is a dict with ``__key__``, ``__url__`` and one entry per member keyed by
    extension, decoded by ``decoders`` (``json`` -> object, ``txt`` -> str, ``cls``/``index``
    -> int, ``npy`` -> array, ``mp`` -> object with msgpack, ``NAME.gz`` gunzipped and
    decoded as ``NAME``, others bytes; ``{ext: callable}`` adds or replaces, ``{ext: None}``
    keeps bytes, ``{"pyd": "pickle"}`` / ``{"pth": "torch"}`` opt in to unpickling) unless
    ``decode=False``. Images stay bytes unless ``decode`` names how to decode them (Pillow,
    in the workers): ``"pil"``, ``"rgb8"`` (uint8 HxWx3 arrays), ``"torchrgb8"`` (uint8
    3xHxW tensors), ``"torchrgb"`` (float tensors in [0, 1]) and the other names of
    ``wdstream.stream.decode.IMAGE_MODES``. ``map`` is applied last, in the workers.

    Order: ``shuffle`` permutes shards per epoch and samples within windows of
    ``shuffle_window`` samples of each worker's stream, seeded by ``seed`` and the epoch; a
    worker holds one window in memory. ``shuffle_bytes`` (default 256 MiB; a number or a size
    such as ``"1GiB"``; None: no bound) bounds that window in bytes too: with a manifest, the
    window holds at most ``shuffle_bytes`` divided by its mean sample size (tar bytes per
    sample) samples, so 1 MiB samples shuffle in windows of about 250.
    ``remainder``: ``"drop"`` (default) or ``"pad"`` -- how the fewer-than-world-size samples
    that do not divide evenly among ranks are handled, so every rank gets as many.

    Reading: ``opener`` is ``"auto"`` (``$WDSTREAM_OPENER``, else per scheme: the S3 SDK for
    ``s3://``, fsspec for ``gs://``), ``"cli"``, ``"fsspec"`` or ``"sdk"``. A read with no data
    for ``timeout`` seconds is a stall. Transient failures are retried ``retries`` times,
    waiting ``retry_backoff`` seconds and doubling, from the last sample delivered. When
    retries run out, or a sample cannot be decoded, ``on_error="raise"`` (default) raises
    and ``"skip"`` leaves it out and counts it in ``loader.stats`` (a configuration,
    credentials or permission problem always raises). ``verify_digest`` checks each shard's
    sha256 against the manifest when read whole. Every option is checked here, when the
    dataset is built (``OptionError`` naming the accepted values; see ``wdstream.options``).

    ``cache_dir``: a local folder that keeps shards read once for later epochs (remote and
    ``pipe:`` shards; local files are read in place), at most ``cache_limit`` bytes of them
    (``"50GB"``, ``"512MiB"`` or a number; default 10 GB), least recently used evicted
    first. Keyed by the full URL (and the manifest's size and digest), filled while reading
    (the first sample never waits for the whole shard), and safe to share between workers,
    ranks and jobs on one machine. See ``wdstream.sources.cache``.

    Names read from storage are data: a manifest's shards must be names under its prefix
    unless ``allow_external_shards=True`` (for one manifest over several buckets or prefixes:
    then any URL or path it names is read), and a ``pipe:`` command is never taken from a
    manifest or a listing. ``pipe:`` sources given here in code work. See docs/security.md.

    ``share_manifest``: a large manifest is parsed once per node and the other processes map
    its arrays (True, or a directory of this user; see ``wdstream.shards.shared``); False:
    each process parses its own.
    """

    def __init__(
        self,
        source,
        *,
        shuffle: bool = True,
        seed: int = 0,
        opener: str = "auto",
        shuffle_window: int = 1000,
        shuffle_bytes: int | str | None = DEFAULT_SHUFFLE_BYTES,
        remainder: str = "drop",
        decode: bool | str = True,
        decoders: Mapping[str, object] | None = None,
        map: Callable[[dict], object] | None = None,  # the usual pipeline name
        timeout: float = 60.0,
        retries: int = 3,
        retry_backoff: float = 0.5,
        on_error: str = "raise",
        verify_digest: bool = False,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        allow_external_shards: bool = False,
        share_manifest: bool | str | os.PathLike = True,
    ):
        super().__init__()
        checked = _check_options(locals())  # every option, before any I/O
        self.source = source
        resolved = _resolve_source(source, bool(allow_external_shards), share_manifest)
        self.shards = resolved.table
        self.manifest = resolved.manifest
        _check_opener(checked["opener"], self.shards.urls)
        window = bounded_window(checked["shuffle_window"], shuffle_bytes, self.manifest)
        self.options = PlanOptions(seed=checked["seed"], shuffle=checked["shuffle"],
                                   window=window if shuffle else 1, remainder=remainder)
        self.read_options = ReadOptions(opener=None if opener == "auto" else opener,
                                        timeout=checked["timeout"], retries=checked["retries"],
                                        backoff=checked["retry_backoff"], on_error=on_error,
                                        verify_digest=checked["verify_digest"],
                                        **_cache_options(cache_dir, cache_limit))
        self.decode = decode
        images = decode_option(decode)
        self.decoders = build_decoders(decoders, images) if decode else None
        self.map = map

    # ---- sizes --------------------------------------------------------------------------
    @property
    def has_counts(self) -> bool:
        return self.shards.samples is not None

    def plan(self, epoch: int, world: int, workers: int,
             history: Sequence[HistorySegment] = ()) -> EpochPlan:
        if not self.has_counts:
            raise ManifestError(f"{self.source}: no manifest, so sample counts are unknown; "
                                "run `wdstream index` on the shards' prefix")
        return EpochPlan(self.shards.samples, epoch, world, workers, self.options, history)

    def fingerprint(self) -> str:
        """Identifies the data and the options that shape the order; part of a resume state."""
        if self.manifest is not None:
            data = self.manifest.fingerprint()
        else:
            data = hashlib.sha256("\n".join(self.shards.urls).encode()).hexdigest()[:16]
        o = self.options
        options = json.dumps([o.shuffle, o.window, o.remainder])
        return f"{data}-{hashlib.sha256(options.encode()).hexdigest()[:8]}"

    # ---- iteration ----------------------------------------------------------------------
    def positioned(self, spec: IterationSpec, stream: int, start: int
                   ) -> Iterator[tuple[dict, int]]:
        """Stream ``stream``'s samples from position ``start`` (samples already consumed),
        each with the position after it. Stages built on this dataset (mixing, packing) call
        it and report positions of their own."""
        position = start
        samples = self._samples(spec, stream, start)
        decoders, mapper = self.decoders, self.map
        for sample in samples:
            position += 1
            if sample is None:  # a sample skipped by on_error="skip"
                continue
            if decoders is not None:
                try:
                    sample = decode_sample(sample, decoders)
                except ShardError as error:
                    if self.read_options.on_error == "raise":
                        raise
                    log.error("skipped: %s", error)
                    worker_stats.skipped_samples += 1
                    continue
            if mapper is not None:
                sample = mapper(sample)
            if sample is not None:  # a map may drop a sample
                yield sample, position

    def _samples(self, spec: IterationSpec, stream: int, start: int) -> Iterator[dict | None]:
        """The stream's raw samples from position ``start``, in the plan's order (None for a
        sample skipped by ``on_error="skip"``)."""
        window = self.options.window
        first_window, skip = divmod(start, window)
        target = self._payload_target(spec)
        if self.has_counts:
            plan = self.plan(spec.epoch, spec.world, spec.workers, spec.history)
            spans = drop_first(plan.stream_spans(spec.rank, stream), first_window * window)
            samples = SpanReader(spans, self.shards, self.read_options, worker_stats, target)

            def order(index, size):
                return plan.window_order(spec.rank, stream, index, size)
        else:
            if spec.history:
                raise StateError(f"{self.source}: resuming on another layout needs a manifest")
            o = self.options
            if spec.world > 1 and len(self.shards.urls) < spec.world * spec.workers:
                raise ManifestError(
                    f"{self.source}: {len(self.shards.urls)} shards cannot feed {spec.world} "
                    f"ranks x {spec.workers} workers without a manifest (ranks would get "
                    "unequal batches); run `wdstream index` on the shards' prefix")
            spans = shard_streams(len(self.shards.urls), o.seed, spec.epoch, o.shuffle,
                                  spec.world, spec.workers, spec.rank, stream)
            samples = SpanReader(spans, self.shards, self.read_options, worker_stats, target)
            samples = islice(samples, first_window * window, None)

            def order(index, size):
                return window_order(size, o.seed, spec.epoch, 0, spec.rank, stream, index,
                                    o.shuffle)
        return window_shuffle(samples, window, order, first_window, skip)

    def _payload_target(self, spec: IterationSpec):
        """Where large payloads go (see ``iter_members``) when the loader asks for shared
        payloads, for members nothing in the worker needs as ``bytes`` (those without a
        decoder, and none when there is a map): from a local file, nowhere (the main process
        maps them from the page cache); from other streams, into the worker's shared memory."""
        if not spec.shared_payloads or self.map is not None \
                or torch.utils.data.get_worker_info() is None:
            return None
        decoders = self.decoders

        def target(name: str, size: int, region):
            if decoders is not None:
                try:
                    extension = split_name(name)[1].lower()
                except ShardError:
                    return None  # reported when the sample is grouped
                if find_decoder(decoders, extension) is not None:
                    return None
            if region is not None and CAN_MAP_FILES:  # a local file: mapped, never read
                return FileSpan(region, size), None
            return read_target(size)

        return target

    # ---- torchdata's StatefulDataLoader protocol ----------------------------------------
    # StatefulDataLoader calls these on the dataset copy in each worker (or in the main
    # process with num_workers=0): the state is that one stream's position. It restores the
    # worker round-robin itself, so worker k always reads stream k here.
    def state_dict(self) -> dict:
        """The position of the stream this process iterates (torchdata protocol)."""
        if self._live is None:
            rank, world = world_info()
            info = torch.utils.data.get_worker_info()
            return {"fingerprint": self.fingerprint(), "seed": self.options.seed,
                    "epoch": self.next_epoch(), "world": world,
                    "workers": info.num_workers if info else 1,
                    "stream": info.id if info else 0, "position": 0}
        spec, stream = self._live
        return {"fingerprint": self.fingerprint(), "seed": self.options.seed,
                "epoch": spec.epoch, "world": spec.world, "workers": spec.workers,
                "stream": stream, "position": worker_position.value}

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration continue this stream where ``state`` was taken."""
        if not isinstance(state, dict) or not {"fingerprint", "seed", "epoch", "position"} <= set(state):
            raise StateError(f"not a wdstream dataset state: {state!r:.200}")
        if state["fingerprint"] != self.fingerprint() or state["seed"] != self.options.seed:
            raise StateError("the dataset state belongs to another dataset, seed or options")
        self._stream_resume = dict(state)

    @staticmethod
    def _check_stream_state(state: dict, world: int, workers: int, worker: int) -> None:
        saved = (state.get("world"), state.get("workers"), state.get("stream"))
        if saved != (world, workers, worker):
            raise StateError(f"the dataset state was saved by stream {saved[2]} of {saved[1]} "
                             f"workers x {saved[0]} ranks; this is stream {worker} of {workers} "
                             f"x {world} (use wdstream.DataLoader for elastic resume)")
