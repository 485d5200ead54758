"""``wdstream.DataLoader``: a torch DataLoader that knows where it is. It counts, per worker
stream, the samples the training loop has received; with the epoch, the layout and the
segments consumed under other layouts they are its whole state. Fetches carry several
batches, tagged with their positions; batches are handed out one per stream in turn, so
fetch sizes change neither the order nor what a state means."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any, cast

import torch.utils.data

from wdstream.errors import (
    OptionError,
    OptionTypeError,
    StreamError,
    UnsizedError,
    WdstreamError,
)
from wdstream.options import loader_arguments
from wdstream.stream.load.context import StreamContext
from wdstream.stream.load.contract import IterationSpec, IterationView, Trackable, world_info
from wdstream.stream.load.positioned import closed_at_exit
from wdstream.stream.load.ranks import gather_positions
from wdstream.stream.load.state import (
    check_loadable,
    make_state,
    resume_history,
)
from wdstream.stream.load.tagging import TaggedCollate
from wdstream.stream.plan.epoch import HistorySegment, batches_in_stream
from wdstream.stream.transfer.batching import (
    approximate_bytes,
    collate,
    tune_allocator,
    unpack_shared,
)
from wdstream.stream.transfer.shm import unmap_workers
from wdstream.stream.transfer.torch_internals import LoaderInternals, raise_prefetch, worker_pids

log = logging.getLogger("wdstream.loader")  # the logger name users configure

_FAILED = object()  # in a stream's queue of (position, batch): the error that ended it


class DataLoader(LoaderInternals, torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` over a ``StreamingDataset`` or a stage built on one
    (``Mix``, ``PackedSequences``: the contract of ``wdstream.stream.load.contract``), with
    ``state_dict()``, ``load_state_dict()`` and a ``len()`` known before the first batch.
    Arguments torch's loader takes are accepted, except those that would break the plan, the
    order or resume, which are refused with a reason.

    Args:
        dataset: a ``StreamingDataset`` or a stage over one.
        batch_size (int | None, default 1): samples per batch, per rank; None: single samples.
        num_workers (int, default 0): worker processes, each reading one stream.
        collate_fn (callable | None): makes a batch; default ``wdstream.collate`` (a dict of
            lists, arrays of one shape stacked, numbers as a tensor).
        drop_last (bool, default False): drop each stream's last, short batch.
        persistent_workers (bool): refused: each epoch's plan and resume position reach the
            workers when they start.
        bytes_as (str, default "bytes"): undecoded members as ``bytes``, or ``"tensor"``:
            1-D ``uint8`` tensors sharing the memory the worker filled (no copy here; large
            payloads of local shards are copy-on-write views of the file).
        tune_malloc (bool, default True): when payloads from 32 KiB are copied into ``bytes``
            here, set glibc's malloc once as in the workers (blocks under 4 MiB from the heap,
            64 MiB of it kept freed); False leaves it as it is.
        **kwargs: torch's ``DataLoader`` arguments (``prefetch_factor``, ``timeout``,
            ``pin_memory``...); samplers, ``shuffle`` and ``in_order=False`` are refused.
    """

    def __init__(self, dataset: Trackable, batch_size: int | None = 1, *,
                 num_workers: int = 0, collate_fn: Callable | None = None,
                 drop_last: bool = False, persistent_workers: bool = False,
                 bytes_as: str = "bytes", tune_malloc: bool = True, **kwargs):
        if not isinstance(dataset, Trackable):
            raise OptionTypeError("DataLoader: needs a wdstream.StreamingDataset or a stage "
                                  "built on one (Mix, PackedSequences), not "
                                  f"{type(dataset).__name__}")
        loader_arguments(batch_size, num_workers, collate_fn, drop_last, persistent_workers,
                         bytes_as, tune_malloc, kwargs)
        self.bytes_as = bytes_as
        self.tune_malloc = tune_malloc
        self._malloc_tuned = False
        self.user_collate = collate_fn if collate_fn is not None else (
            collate if batch_size is not None else _identity)
        # the workers leave large raw payloads of local files in place for the main process
        # to map, and read those of other streams straight into shared memory
        self._shared_payloads = num_workers > 0 and collate_fn is None
        self._tagger = TaggedCollate(self.user_collate, max(1, num_workers), batch_size,
                                     drop_last, share_bytes=bytes_as == "tensor")
        # estimated bytes per sample, pickled and in shared memory: they size the fetches
        self._sample_bytes: tuple[float, float] | None = None
        # torch's default prefetch_factor (2 fetches per worker), raised for small fetches
        self._default_prefetch = num_workers > 0 and kwargs.get("prefetch_factor") is None
        try:  # torch's own checks of its arguments, as wdstream's errors
            super().__init__(cast(Any, dataset), batch_size=batch_size, num_workers=num_workers,
                             collate_fn=self._tagger, drop_last=drop_last, **kwargs)
        except TypeError as error:
            raise OptionTypeError(f"DataLoader: {error}") from None
        except ValueError as error:
            raise OptionError(f"DataLoader: {error}") from None
        self.stats: dict[str, Any] = {"retries": 0, "skipped_shards": [], "skipped_samples": 0,
                      "stray_members": 0}
        self._pending: dict | None = None  # a loaded state, applied when iteration starts
        self._epoch: int | None = None  # the epoch being read, None before the first
        self._history: tuple[HistorySegment, ...] = ()
        self._positions: list = []  # per stream: where the loop is (samples received)
        self._batches: list[int] = []  # per stream: batches received
        self._rank = 0
        self._reading = False  # an iteration of the epoch is in progress
        self._placement: Callable | None = None  # place_batches(): e.g. to a device
        self._placed = False  # place_batches() was called
        self._prepared_by_accelerate = False  # returned by Accelerator.prepare

    # ---- Accelerate ---------------------------------------------------------------------
    @property
    def _is_accelerate_prepared(self) -> bool:
        """What ``Accelerator.prepare`` asks before rebuilding a loader as a plain torch
        DataLoader (which would lose the plan, the state and the batches' tags): this loader
        stays as it is. ``wdstream.integrations.accelerate.prepare_loader`` moves its batches
        to the accelerator's device and checkpoints its state with ``save_state``."""
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self._prepared_by_accelerate = bool(value)  # Accelerate marks what it returns

    def place_batches(self, placement: Callable | None) -> None:
        """Apply ``placement`` to every batch this loader yields from now on.

        Args:
            placement (Callable | None): a function of a batch, returning the batch to yield
                (e.g. its tensors moved to a device); None yields the batches as collated.
        """
        self._placement = placement
        self._placed = True

    # ---- fetches: several batches per transfer from a worker -----------------------------
    # A DataLoader's transfers from its workers are few per second whatever their size, so
    # small batches travel several to a fetch. The first fetch of each worker is one batch
    # (time to first batch), later ones grow up to FETCH_SAMPLES samples, FETCH_BYTES pickled
    # and FETCH_SHARED_BYTES in shared memory (tensors, raw members: only their handles go
    # through the pipe). The loader hands batches out in the same order whatever the fetch
    # sizes. A larger fetch would outgrow the 1 MiB result pipe (torch_internals.PIPE_BYTES);
    # docs/benchmarks.md has the figures behind these defaults.
    FETCH_SAMPLES = 512
    FETCH_BYTES = 1 << 20
    FETCH_SHARED_BYTES = 4 << 20

    def _fetch_sizes(self):
        size = cast(int, self.batch_size)  # _index_sampler asks only with a batch size
        if self.num_workers == 0:  # no transfer to save
            while True:
                yield range(size)
        batches = 1
        while True:
            for _worker in range(self.num_workers):
                yield range(batches * size)
            if self._sample_bytes:  # grow once a batch has told how large samples are
                pickled, shared = self._sample_bytes
                limit = min(self.FETCH_SAMPLES, int(self.FETCH_BYTES / max(pickled, 1)),
                            int(self.FETCH_SHARED_BYTES / max(shared, 1)))
                batches = max(1, min(batches * 2, limit // size))

    @property
    def streams(self) -> int:
        return max(1, self.num_workers)

    @property
    def _batch(self) -> int:
        return self.batch_size or 0

    def _stream_batches(self, stream_samples: list[int]) -> list[int]:
        return [batches_in_stream(n, self._batch, self.drop_last) for n in stream_samples]

    def _batchable(self, stream_samples: list[int]) -> list[int]:
        """Samples of each stream that end up in batches (drop_last drops a partial one)."""
        if self.drop_last and self._batch:
            return [n - n % self._batch for n in stream_samples]
        return list(stream_samples)

    def __len__(self) -> int:
        """Batches per rank per epoch: the same on every rank. After a resume on another
        layout (loaded, or being read), the batches of the rest of the epoch."""
        dataset = cast(Trackable, self.dataset)  # the one it was built with
        _rank, world = world_info()
        history: tuple[HistorySegment, ...]
        epoch, history = dataset.next_epoch(), ()
        if self._pending is not None:
            epoch = self._pending["epoch"]
            history, _changed = resume_history(self._pending, world, self.streams, self._batch,
                                               self.drop_last)
        elif self._reading and self._epoch is not None:  # (reading: an epoch is set)
            epoch, history = self._epoch, self._history
        try:
            batches = sum(self._stream_batches(
                dataset.plan(epoch, world, self.streams, history).stream_samples))
            if history and not batches and not self._reading:  # saved at the epoch's end
                batches = sum(self._stream_batches(
                    dataset.plan(epoch + 1, world, self.streams).stream_samples))
        except WdstreamError as error:  # a TypeError: what len() of an unsized object raises
            raise UnsizedError(str(error)) from None
        return batches

    # ---- iteration ----------------------------------------------------------------------
    def _next_stream(self, batches: list[int], exhausted: list[bool]) -> int | None:
        """The stream whose batch comes next: workers take turns, so it is the first stream,
        in worker order, among those with batches left and the fewest delivered."""
        open_streams = [k for k in range(len(batches)) if not exhausted[k]]
        if not open_streams:
            return None
        return min(open_streams, key=lambda k: (batches[k], k))

    def _exhausted(self, plan, positions: list) -> list[bool]:
        """Which streams have no batch left; unknown (False) without sample counts or for
        positions that are not sample counts (stages such as packing)."""
        if plan is None:
            return [False] * len(positions)
        batchable = self._batchable(plan.stream_samples)
        return [isinstance(p, int) and p >= n for p, n in zip(positions, batchable, strict=True)]

    def _begin(self) -> IterationSpec:
        dataset = cast(Trackable, self.dataset)  # the one it was built with
        rank, world = world_info()
        self._rank = rank
        layout = (world, self.streams, self._batch)
        fresh = [0] * self.streams
        state, self._pending = self._pending, None
        history: tuple[HistorySegment, ...]
        if state is None:
            epoch, history, positions, batches = dataset.begin_epoch(), (), fresh, fresh
        else:
            history, changed = resume_history(state, *layout, self.drop_last)
            positions, batches = list(state["positions"]), list(state["batches"])
            if changed:
                positions, batches = fresh, fresh
                log.info("epoch %d continues on a new layout: %d ranks x %d workers, batch %d",
                         state["epoch"], *layout)
            dataset.set_epoch(state["epoch"])
            epoch = dataset.begin_epoch()
        plan = dataset.plan(epoch, world, self.streams, history) if dataset.has_counts else None
        rotation = self._next_stream(batches, self._exhausted(plan, positions))
        if rotation is None:  # saved at the very end of the epoch: start the next one
            epoch, history, positions, batches = dataset.begin_epoch(), (), fresh, fresh
            plan = dataset.plan(epoch, world, self.streams) if dataset.has_counts else None
            rotation = 0
        if plan is not None and rank == 0:
            policy = getattr(dataset.options, "remainder", "drop")
            log.info("epoch %d: %d samples per rank, %d %s (remainder=%r)", epoch,
                     plan.rank_samples, plan.remainder_samples,
                     "dropped" if policy == "drop" else "repeated", policy)
        self._epoch, self._history, self._reading = epoch, history, True
        self._positions, self._batches = list(positions), list(batches)
        # one context for the dataset and the collate wrapper: in each worker, its own copy
        context = StreamContext()
        self.collate_fn = self._tagger.for_iteration(rotation, context)  # read by torch's iterator
        return IterationSpec(epoch=epoch, rank=rank, world=world, workers=self.streams,
                             history=history, start=tuple(positions), rotation=rotation,
                             batch_size=self._batch, shared_payloads=self._shared_payloads,
                             context=context)

    def __iter__(self):
        return closed_at_exit(self._iterate())

    def _iterate(self):
        if self._prepared_by_accelerate and not self._placed:
            raise OptionError(
                "accelerator.prepare() keeps a wdstream.DataLoader as it is, but cannot move "
                "its batches to the device nor checkpoint its state: also call "
                "wdstream.integrations.accelerate.prepare_loader(accelerator, loader) "
                "(docs/accelerate.md)")
        dataset = cast(Trackable, self.dataset)  # the one it was built with
        resumed = self._pending is not None
        iterator = self._get_iterator(IterationView(dataset, self._begin()))
        workers = worker_pids(iterator)
        delivered = 0
        accounting = getattr(dataset, "accounting", None)  # stages: per-source counts
        try:
            for stream, position, batch in self._in_order(iterator):
                # first: a batch that cannot be unpacked (JSON decoded here) is not consumed
                batch = unpack_shared(batch, self.bytes_as, self._before_copy)
                self._positions[stream] = position
                self._batches[stream] += 1
                delivered += 1
                if accounting is not None:
                    self.stats["sources"] = accounting(self._positions, self._history,
                                                       self._rank)
                yield batch if self._placement is None else self._placement(batch)
        except WdstreamError as error:
            raise _without_worker_traceback(error) from None
        finally:
            unmap_workers(workers)  # the segments of this iteration's workers
        self._reading = False
        if resumed and delivered == 0:
            # A state taken after the last batch of an epoch whose end could not be told from
            # the state alone (positions that are not sample counts): go on with the next.
            yield from self.__iter__()

    def _before_copy(self) -> None:
        """Payloads are about to be copied into ``bytes`` here: ``tune_malloc`` applies."""
        if self.tune_malloc and not self._malloc_tuned:
            self._malloc_tuned = True
            tune_allocator()

    def _in_order(self, iterator):
        """``(stream, position, batch)`` in the order of one batch per stream in turn (the
        stream with the fewest batches delivered, the first in worker order on a tie), as
        workers making one batch per fetch would deliver them, whatever the fetch sizes."""
        streams = self.streams
        queues: list[collections.deque] = [collections.deque() for _ in range(streams)]
        ended = [False] * streams
        batch_samples = self.batch_size or 1
        deepen = self._default_prefetch  # once per iteration, after the first fetch
        while True:
            stream = self._next_stream(self._batches, [ended[k] and not queues[k]
                                                       for k in range(streams)])
            if stream is None:
                return
            while not queues[stream] and not ended[stream]:
                try:
                    source, batches, stats, last, failure = next(iterator)
                except StopIteration:
                    ended = [True] * streams
                    break
                queues[source].extend(batches)
                if failure is not None:  # raised where the stream's next batch would be
                    queues[source].append((_FAILED, failure))
                ended[source] = ended[source] or last
                self._add_stats(stats)
                if batches:
                    pickled, shared = approximate_bytes(batches[0][1])
                    self._sample_bytes = (pickled / batch_samples, shared / batch_samples)
                    if deepen:
                        deepen = False
                        self._prefetch_small_fetches(iterator)
            if queues[stream]:
                position, batch = queues[stream].popleft()
                if position is _FAILED:
                    # no local may hold the error: its traceback holds this frame, and that
                    # cycle would keep torch's iterator (and its workers) until a collection
                    error, batch, failure = batch, None, None
                    try:
                        raise error
                    finally:
                        del error
                yield stream, position, batch

    SMALL_FETCH_PREFETCH = 4  # fetches in flight per worker when a full fetch is <= 1 MiB

    def _prefetch_small_fetches(self, iterator) -> None:
        """Keep more fetches in flight per worker once batches prove small: a worker then has
        work queued while the loop takes batches from a fetch received earlier (see
        docs/benchmarks.md). Large batches keep torch's default, which bounds the memory in
        flight. Only when ``prefetch_factor`` was left to its default; best effort
        (``torch_internals``)."""
        if self._sample_bytes is None or \
                sum(self._sample_bytes) * self.FETCH_SAMPLES > self.FETCH_BYTES:
            return  # large samples: torch's default stays
        raise_prefetch(iterator, self.SMALL_FETCH_PREFETCH, self.num_workers)

    def _add_stats(self, stats: dict) -> None:
        self.stats["retries"] += stats["retries"]
        skipped = self.stats["skipped_shards"]
        # several streams may share a shard (and all skip their part of it): listed once
        skipped.extend(url for url in stats["skipped_shards"] if url not in skipped)
        self.stats["skipped_samples"] += stats["skipped_samples"]
        self.stats["stray_members"] += stats.get("stray_members", 0)

    # ---- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the training loop is: enough to resume this rank, and under DDP (lockstep
        batches) the whole job, on the same or another layout."""
        dataset = cast(Trackable, self.dataset)  # the one it was built with
        if self._pending is not None:
            return dict(self._pending)
        _rank, world = world_info()
        history: tuple[HistorySegment, ...]
        if self._epoch is None:
            epoch, history = dataset.next_epoch(), ()
            positions, batches = [0] * self.streams, [0] * self.streams
        else:
            epoch, history = self._epoch, self._history
            positions, batches = self._positions, self._batches
        if getattr(dataset, "positions_per_rank", False):  # packing: every rank's, gathered
            positions = gather_positions(positions, self._rank, world)
        return make_state(dataset, epoch=epoch, world=world, workers=self.streams,
                          batch_size=self._batch, drop_last=self.drop_last,
                          positions=positions, batches=batches, history=history,
                          rank=self._rank)

    def load_state_dict(self, state: dict) -> None:
        """Continue, at the next iteration, exactly where ``state`` was taken. Refuses a state
        of another dataset or seed, or a malformed one (``StateError``).

        Args:
            state (dict): what ``state_dict()`` returned, on this rank or (elastic resume)
                rank 0's, on the same or another number of ranks and workers.
        """
        rank, world = world_info()
        check_loadable(state, cast(Trackable, self.dataset), world=world, rank=rank, workers=self.streams,
                       batch_size=self._batch)
        self._pending = dict(state)
        if rank == 0:
            log.info("resuming epoch %d: %d batches per rank delivered on %d ranks x %d "
                     "workers, batch %d (%d earlier layouts)", state["epoch"],
                     sum(state["batches"]), state["world"], state["workers"],
                     state["batch_size"], len(state["history"]))


def _without_worker_traceback(error: WdstreamError) -> WdstreamError:
    """torch re-raises a worker's error as ``type(error)(worker traceback + message)``; give
    the user the error's own message, as it would read with ``num_workers=0``."""
    text = str(error)
    if not text.startswith("Caught "):
        return error
    marker = f"{type(error).__module__}.{type(error).__name__}: "
    message = text.rsplit(marker, 1)[-1] if marker in text else text
    cleaned = type(error)(message)
    if isinstance(cleaned, StreamError):  # (of error's type)
        cleaned.url = message.split(": ", 1)[0]
    return cleaned


def _identity(sample):
    return sample
