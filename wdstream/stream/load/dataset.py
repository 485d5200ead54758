"""``StreamingDataset``: a torch ``IterableDataset`` that executes the epoch plan. Each
DataLoader worker computes the plan, takes its stream of sample spans and runs the pipeline:
read (prefetch, checks, retries), window shuffle, decode, the user's ``map``. What to read
arrives as an ``IterationSpec`` (``wdstream.stream.load.contract``)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice

import torch.utils.data

from wdstream import options
from wdstream.errors import ManifestError, OptionError, ShardError, StateError
from wdstream.limits import Limits, checked_limits
from wdstream.shards.samples import split_name
from wdstream.shards.shared import check_share_option
from wdstream.sizes import parse_size
from wdstream.sources.cache import ShardCache
from wdstream.sources.openers import resolve_opener
from wdstream.sources.stores import store_for
from wdstream.stream.load.contract import IterationSpec, world_info
from wdstream.stream.load.positioned import PositionedDataset
from wdstream.stream.plan.epoch import (
    COUNT_LIMIT,
    EPOCH_LIMIT,
    EpochPlan,
    HistorySegment,
    PlanOptions,
    drop_first,
    is_count,
    shard_streams,
    window_order,
)
from wdstream.stream.plan.window import (
    DEFAULT_SHUFFLE_BYTES,
    DEFAULT_SHUFFLE_START,
    bounded_window,
    chunk_size,
    window_chunks,
)
from wdstream.stream.read.decode import SampleDecoder, build_decoders, decode_option, find_decoder
from wdstream.stream.read.resolve import resolve_source
from wdstream.stream.read.shard_reader import ReadOptions, ReadStats
from wdstream.stream.transfer.deferred import DeferringDecoder, can_defer
from wdstream.stream.transfer.shm import CAN_MAP_FILES, FileSpan, read_target
from wdstream.tables.reads import Access
from wdstream.tables.row_range import RowRange
from wdstream.tables.units import RawOptions, UnitTable

log = logging.getLogger("wdstream.dataset")  # the logger name users configure


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
        "shuffle_start": None if given["shuffle_start"] is None else options.integer(
            owner, "shuffle_start", given["shuffle_start"], minimum=1),
        "retries": options.integer(owner, "retries", given["retries"], minimum=0),
        "timeout": options.number(owner, "timeout", given["timeout"], positive=True),
        "retry_backoff": options.number(owner, "retry_backoff", given["retry_backoff"]),
        "raw": _raw_options(owner, given["columns"], given["key_column"], given["index"],
                            given["rows"]),
    }


def _raw_options(owner: str, columns, key_column, index, rows) -> RawOptions:
    """``columns`` (a list of names, or None), ``key_column`` (a name, or None), ``index``
    (a URL, or None) and ``rows`` (``"START:STOP"``, or None) checked."""
    if columns is not None:
        if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns or \
                not all(isinstance(c, str) and c for c in columns):
            raise OptionError(f"{owner}: columns must be a non-empty list of column names, got "
                              f"{columns!r}")
        columns = tuple(columns)
    if key_column is not None and (not isinstance(key_column, str) or not key_column):
        raise OptionError(f"{owner}: key_column must be a column name, got {key_column!r}")
    if index is not None and not isinstance(index, str | os.PathLike):
        raise OptionError(f"{owner}: index must be the URL of a unit index, got {index!r}")
    return RawOptions(columns, key_column, None if index is None else os.fspath(index),
                      None if rows is None else RowRange.parse(rows, owner))


def _check_opener(opener: str, shard_urls: Sequence[str]) -> None:
    """Whether the opener (and ``$WDSTREAM_OPENER`` under "auto") can read these shards: a
    typo or an opener that cannot read a scheme fails now, not at the first read (where
    ``on_error="skip"`` would never skip it either)."""
    seen = set()
    if hasattr(shard_urls, "one_per_store"):  # compact.Urls: not a million URLs made here
        shard_urls = shard_urls.one_per_store()
    for url in shard_urls:
        kind = store_for(url).scheme
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


class StreamingDataset(PositionedDataset):
    """Samples streamed from WebDataset shards (or raw Parquet, JSON Lines and Arrow files), in
    an order fixed by (seed, epoch, layout), resumable exactly through ``wdstream.DataLoader``.
    A sample is a dict with ``__key__``, ``__url__`` and one entry per member, keyed by
    extension. Every option is checked when the dataset is built (``OptionError`` naming the
    accepted values); names read from storage are data (see docs/security.md).

    Args:
        source: a prefix or manifest URL (``s3://bucket/prefix/``, ``.../index.json``), a
            brace pattern (``shard-{000000..000099}.tar``) or a list of shard URLs: local
            paths, ``s3://``, ``gs://``, ``pipe:COMMAND`` and other fsspec URLs; or raw files
            (a folder at any depth, a pattern, a file or a list; see docs/raw-files.md).
        shuffle (bool, default True): permute shards per epoch and samples within windows of
            each worker's stream, seeded by ``seed`` and the epoch.
        seed (int, default 0): the seed of every permutation.
        opener (str, default "auto"): how bytes are read: ``"auto"`` (``$WDSTREAM_OPENER``,
            else ``"sdk"`` for ``s3://`` and ``gs://``, fsspec for other URLs), ``"cli"``,
            ``"fsspec"`` or ``"sdk"`` (the stores' APIs, concurrent ranged parts).
        shuffle_window (int, default 1000): samples per shuffle window; a worker holds one.
        shuffle_bytes (int | str | None, default 256 MiB): bounds a window in bytes too (at
            most this divided by the manifest's mean sample size); None: no bound.
        shuffle_start (int | None, default 32): the first window's samples; windows then
            double up to ``shuffle_window``, so the first batch waits for few samples.
            None: every window full size.
        remainder (str, default "drop"): ``"drop"`` or ``"pad"``: the samples that do not
            divide evenly among ranks, so that every rank gets as many.
        decode (bool | str, default True): decode members by ``decoders``; False keeps
            bytes; an image mode (``"pil"``, ``"rgb8"``, ``"torchrgb8"``, ``"torchrgb"``,
            the names of ``wdstream.options.IMAGE_MODES``) decodes images with Pillow too.
        decoders (dict | None): ``{ext: callable}`` adds or replaces a decoder, ``{ext:
            None}`` keeps bytes, ``{"pyd": "pickle"}`` / ``{"pth": "torch"}`` opt in to
            unpickling. Built in: ``json``, ``txt``, ``cls``/``index``, ``npy``, ``mp``,
            ``NAME.gz``.
        map (callable | None): applied to each decoded sample, last, in the workers; a
            ``None`` result drops the sample.
        timeout (float, default 60): seconds without data after which a read is a stall.
        retries (int, default 3): retries of a transient failure, from the last sample
            delivered.
        retry_backoff (float, default 0.5): seconds before the first retry, doubling.
        on_error (str, default "raise"): when retries run out or a sample cannot be decoded,
            ``"raise"``, or ``"skip"`` it and count it in ``loader.stats`` (a configuration,
            credentials or permission problem always raises).
        verify_digest (bool, default False): check each shard read whole against the
            manifest's sha256.
        cache_dir (path | None): a local folder keeping remote and ``pipe:`` shards read once
            for later epochs, shared safely by workers, ranks and jobs on one machine.
        cache_limit (int | str | None, default 10 GB): the cache's bytes, least recently used
            evicted first.
        allow_external_shards (bool, default False): let a manifest name shards outside its
            prefix (any URL or path); a ``pipe:`` command is never taken from a manifest.
        share_manifest (bool | path, default True): parse a large manifest once per node and
            map its arrays in the other processes, and cut raw files into units once per node
            (a directory: where); False: each process parses and cuts.
        columns (list[str] | None): raw files: only these columns are read.
        key_column (str | None): raw files: the column whose value is ``__key__`` (default
            ``"path/in/source.parquet:ROW"``).
        index (path | None): raw files: the unit index ``wdstream index --output`` wrote,
            instead of counting JSON Lines by reading them.
        rows (str | None): raw files: only rows ``"START:STOP"`` of the files in their
            order, each bound a row number or a percentage, negative from the end
            (``"100:200"``, ``":20%"``, ``"-5%:"``), as ``datasets`` reads a split's slice;
            only the units holding them are read. None: every row.
        limits (wdstream.Limits | None): what shards may make the reader expand to; past one
            is a ``LimitError`` naming the shard, member and limit. None: the defaults.
    """

    _epoch_samples: int | None = None  # epoch_samples(), once known

    def __init__(
        self,
        source,
        *,
        shuffle: bool = True,
        seed: int = 0,
        opener: str = "auto",
        shuffle_window: int = 1000,
        shuffle_bytes: int | str | None = DEFAULT_SHUFFLE_BYTES,
        shuffle_start: int | None = DEFAULT_SHUFFLE_START,
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
        columns: Sequence[str] | None = None,
        key_column: str | None = None,
        index: str | os.PathLike | None = None,
        rows: str | None = None,
        limits: Limits | None = None,
    ):
        super().__init__()
        checked = _check_options(locals())  # every option, before any I/O
        self.limits = limits = checked_limits("StreamingDataset", limits)
        self.source = source
        resolved = resolve_source(source, bool(allow_external_shards), share_manifest,
                                  checked["raw"], Access(None if opener == "auto" else opener,
                                                         checked["timeout"], limits))
        self.shards = resolved.table
        self.manifest = resolved.manifest
        self.totals = resolved.totals  # samples and bytes, when known
        self.reader = resolved.reader
        _check_opener(checked["opener"], self.shards.urls)
        window = bounded_window(checked["shuffle_window"], shuffle_bytes, self.totals)
        self.options = PlanOptions(seed=checked["seed"], shuffle=checked["shuffle"],
                                   window=window if shuffle else 1, remainder=remainder,
                                   start=checked["shuffle_start"])
        self.read_options = ReadOptions(opener=None if opener == "auto" else opener,
                                        timeout=checked["timeout"], retries=checked["retries"],
                                        backoff=checked["retry_backoff"], on_error=on_error,
                                        verify_digest=checked["verify_digest"], limits=limits,
                                        **_cache_options(cache_dir, cache_limit))
        self.decode = decode
        images = decode_option(decode)
        raw = isinstance(self.shards, UnitTable)  # rows are values already: nothing to decode
        self.decoders = build_decoders(decoders, images, limits) if decode and not raw else None
        self.map = map

    # ---- sizes --------------------------------------------------------------------------
    @property
    def has_counts(self) -> bool:
        return self.shards.samples is not None

    def plan(self, epoch: int, world: int, workers: int,
             history: Sequence[HistorySegment] = ()) -> EpochPlan:
        samples = self.shards.samples
        if samples is None:  # not has_counts
            raise ManifestError(f"{self.source}: no manifest, so sample counts are unknown; "
                                "run `wdstream index` on the shards' prefix")
        return EpochPlan(samples, epoch, world, workers, self.options, history)

    def epoch_samples(self) -> int | None:
        """Samples in an epoch (the manifest's counts), None without a manifest."""
        samples = self.shards.samples
        if self._epoch_samples is None and samples is not None:  # has_counts
            self._epoch_samples = int(self.manifest.samples) if self.manifest is not None \
                else sum(int(n) for n in samples)
        return self._epoch_samples

    def check_position(self, position, world: int = 1) -> None:
        """Refuse (``StateError``) a position of a state that ``positioned`` cannot start
        from: anything but a sample count up to an epoch's samples (the same on each of the
        ``world`` ranks)."""
        samples = self.epoch_samples()
        most = COUNT_LIMIT - 1 if samples is None else samples
        if not is_count(position) or position > most:
            raise StateError(f"{self.source}: the state's position {position!r:.40} is not a "
                             f"sample count from 0 to {most}")

    def fingerprint(self) -> str:
        """Identifies the data and the options that shape the order; part of a resume state.
        Windows of one size (no growth) keep the fingerprint they had before windows grew,
        as they keep the order."""
        if self.manifest is not None:
            data = self.manifest.fingerprint()
        elif isinstance(self.shards, UnitTable):
            data = self.shards.fingerprint()
        else:
            data = hashlib.sha256("\n".join(self.shards.urls).encode()).hexdigest()[:16]
        o = self.options
        shape = [o.shuffle, o.window, o.remainder]
        schedule = o.schedule
        if schedule.growing:
            shape.append({"start": schedule.start})
        options = json.dumps(shape)
        return f"{data}-{hashlib.sha256(options.encode()).hexdigest()[:8]}"

    # ---- iteration ----------------------------------------------------------------------
    def positioned(self, spec: IterationSpec, stream: int, start: int
                   ) -> Iterator[tuple[dict, int]]:
        """Stream ``stream``'s samples from position ``start`` (samples already consumed),
        each with the position after it. Stages built on this dataset (mixing, packing) call
        it and report positions of their own."""
        for items, positions in self.positioned_chunks(spec, stream, start):
            yield from zip(items, positions, strict=True)

    def positioned_chunks(self, spec: IterationSpec, stream: int, start: int
                          ) -> Iterator[tuple[list, Sequence[int]]]:
        """``positioned`` as lists: ``(samples, the position after each)``. A failure comes
        after the samples before it."""
        position = start
        stats = spec.context.stats if spec.context is not None else ReadStats()
        totals = self.totals
        size = chunk_size(totals.samples, totals.bytes) if totals is not None else 1
        chunks = self._sample_chunks(spec, stream, start, stats, size)
        decode_sample = self._sample_decoder(spec)
        for chunk in chunks:
            if self.map is None and None not in chunk and (
                    decode_sample is None or decode_sample.unchanged(chunk)):
                yield chunk, range(position + 1, position + 1 + len(chunk))
            else:
                yield from self._transformed(chunk, position, decode_sample, stats)
            position += len(chunk)

    def _sample_decoder(self, spec: IterationSpec):
        """What decodes a sample in this iteration (None: nothing to decode). In a worker
        under the loader, with no map, small JSON is left to the main process: the collate
        wrapper sees which members (``DeferringDecoder``)."""
        decoders = self.decoders
        if spec.shared_payloads and spec.context is not None and self.map is None and \
                decoders is not None and can_defer(decoders) and self.read_options.on_error == "raise" and \
                torch.utils.data.get_worker_info() is not None:
            return DeferringDecoder(decoders, spec.context.json_names, self.limits.sample_bytes)
        if decoders is None:
            return None
        return SampleDecoder(decoders, sample_bytes=self.limits.sample_bytes)

    def _transformed(self, chunk: list, position: int, decode_sample, stats: ReadStats
                     ) -> Iterator[tuple[list, list[int]]]:
        """The samples of ``chunk`` (after ``position``) decoded and mapped, with the position
        after each; samples skipped or dropped are left out. A failure comes after the samples
        before it."""
        items, positions = [], []
        try:
            for after, sample in enumerate(chunk, position + 1):
                if sample is not None:  # None: a sample skipped by on_error="skip"
                    sample = self._transform(sample, decode_sample, stats)
                if sample is not None:  # a map may drop a sample
                    items.append(sample)
                    positions.append(after)
        except Exception:
            if items:  # the samples before the failure first
                yield items, positions
            raise
        if items:
            yield items, positions

    def _transform(self, sample: dict, decode_sample, stats: ReadStats):
        """One sample decoded (None if skipped by ``on_error="skip"``), then mapped."""
        if decode_sample is not None:
            try:
                sample = decode_sample(sample)
            except ShardError as error:
                if self.read_options.on_error == "raise":
                    raise
                log.error("skipped: %s", error)
                stats.skipped_samples += 1
                return None
        return sample if self.map is None else self.map(sample)

    def _sample_chunks(self, spec: IterationSpec, stream: int, start: int, stats: ReadStats,
                       size: int) -> Iterator[list[dict | None]]:
        """The stream's raw samples from position ``start``, in the plan's order (None for a
        sample skipped by ``on_error="skip"``), in lists of at most ``size`` that never span
        two shuffle windows."""
        schedule = self.options.schedule
        first_window, begin = schedule.locate(start)  # the stream restarts at that window
        skip = start - begin
        target = self._payload_target(spec)
        if self.has_counts:
            # what the stream reads before its first item leaves: a batch, and its whole first
            # shuffle window (its reader sizes its first requests by these samples' bytes)
            first = max(skip + spec.batch_size, schedule.size(first_window))
            plan = self.plan(spec.epoch, spec.world, spec.workers, spec.history)
            spans = drop_first(plan.stream_spans(spec.rank, stream), begin)
            samples = self.reader(spans, self.shards, self.read_options, stats, target,
                                  first_samples=first)
            o, segment = self.options, plan.segment
            del plan  # the order needs a few integers, not the epoch's arrays

            def order(index, size):
                return window_order(size, o.seed, spec.epoch, segment, spec.rank, stream,
                                    index, o.shuffle)
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
            samples = self.reader(spans, self.shards, self.read_options, stats, target)
            samples = islice(samples, begin, None)

            def order(index, size):
                return window_order(size, o.seed, spec.epoch, 0, spec.rank, stream, index,
                                    o.shuffle)
        return window_chunks(samples, schedule, order, first_window, skip, size)

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
                "stream": stream,
                "position": spec.context.position if spec.context is not None else 0}

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration continue this stream where ``state`` was taken."""
        if not isinstance(state, dict) or not {"fingerprint", "seed", "epoch", "position"} <= set(state):
            raise StateError(f"not a wdstream dataset state: {state!r:.200}")
        if not is_count(state["epoch"]) or state["epoch"] >= EPOCH_LIMIT:
            raise StateError(f"the dataset state: 'epoch' must be an integer from 0 to "
                             f"{EPOCH_LIMIT - 1}, not {state['epoch']!r:.40}")
        self.check_position(state["position"])
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
