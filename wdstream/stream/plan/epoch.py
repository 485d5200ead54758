"""The epoch plan: which samples each rank and DataLoader worker reads, in which order. Pure
functions of (shard sample counts, seed, epoch, world size, workers, options) and of what
was consumed this epoch: no I/O, so every process computes the same plan. Shards are
permuted per epoch; their samples form the epoch's sequence, cut into equal contiguous runs
per rank and streams per worker, shuffled in windows (``window.WindowSchedule``). A new
layout re-plans what was not consumed as a new segment of the epoch (``HistorySegment``).
See docs/resume.md, "How it works"."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wdstream.errors import OptionError
from wdstream.options import CHOICES
from wdstream.stream.plan.spans import OPEN, Span, SpanArray
from wdstream.stream.plan.window import DEFAULT_SHUFFLE_START, WindowSchedule

REMAINDER_POLICIES = CHOICES["remainder"]


STREAM_END = "end"  # a consumed entry: the stream was read to its end
RANKS = "ranks"  # key of a consumed entry that holds every rank's (see consumed_at)
COUNT_LIMIT = 1 << 63  # counts in positions and states fit an int64
EPOCH_LIMIT = 1 << 40  # epochs read by a loader; those above are cycled passes' (stages.base)


def is_count(value) -> bool:
    """Whether ``value`` is a count as positions and states hold them: an int (not a bool)
    from 0 to ``COUNT_LIMIT - 1``."""
    return type(value) is int and 0 <= value < COUNT_LIMIT


@dataclass(frozen=True)
class HistorySegment:
    """A part of an epoch run with one layout: ``consumed[k]`` samples of stream k were
    delivered on every rank. Stages (``Mix``, ``PackedSequences``) store their own JSON
    positions there, and ``{"ranks": [...]}`` when the ranks' positions differ."""

    world: int
    workers: int
    batch_size: int
    consumed: tuple

    def to_list(self) -> list:
        return [self.world, self.workers, self.batch_size, list(self.consumed)]

    @classmethod
    def from_list(cls, value) -> HistorySegment:
        world, workers, batch_size, consumed = value
        return cls(int(world), int(workers), int(batch_size),
                   tuple(c if isinstance(c, list | dict | str) else int(c) for c in consumed))


def consumed_at(value, rank: int):
    """A segment's entry for ``rank``: the same on every rank, or one of ``{"ranks": [...]}``."""
    if isinstance(value, dict):
        return value[RANKS][rank]
    return value


def generator(*words: int) -> np.random.Generator:
    """A generator seeded by every word: SeedSequence mixes them all, so (seed, epoch) and
    (seed, epoch + 1) are unrelated. The one source of randomness of plans and stages."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(w) for w in words])))


_SHARD_ORDER, _WINDOW_ORDER = 1, 2  # domain tags keep the two kinds of draw independent


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which an epoch visits the shards."""
    if not shuffle:
        return np.arange(n_shards)
    return generator(_SHARD_ORDER, seed, epoch).permutation(n_shards)


def window_order(size: int, seed: int, epoch: int, segment: int, rank: int, stream: int,
                 window: int, shuffle: bool) -> np.ndarray:
    """The order in which one shuffle window of ``size`` samples is yielded."""
    if not shuffle:
        return np.arange(size)
    return generator(_WINDOW_ORDER, seed, epoch, segment, rank, stream, window).permutation(size)


def samples_per_rank(total: int, world: int, remainder: str) -> int:
    if remainder not in REMAINDER_POLICIES:
        raise OptionError(f"remainder must be one of {REMAINDER_POLICIES}, not {remainder!r}")
    if remainder == "pad":
        return -(-total // world)
    return total // world


def stream_sizes(rank_samples: int, workers: int) -> list[int]:
    """Samples in each of a rank's ``workers`` streams: contiguous, the first ones longer."""
    base, extra = divmod(rank_samples, workers)
    return [base + (1 if k < extra else 0) for k in range(workers)]


def batches_in_stream(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches a DataLoader worker makes of a stream (batch_size 0 means one sample each)."""
    if batch_size <= 0:
        return samples
    return samples // batch_size if drop_last else -(-samples // batch_size)


class Positions:
    """An epoch's sequence of positions, stored as spans (three arrays: shard, start, stop)
    with their cumulative offsets; ``Span`` objects are made only for the slices asked for."""

    def __init__(self, shard, start, stop):
        self.shard = np.asarray(shard, dtype=np.int64)
        self.start = np.asarray(start, dtype=np.int64)
        self.stop = np.asarray(stop, dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.stop - self.start)))

    @classmethod
    def of(cls, spans: Sequence[Span]) -> Positions:
        return cls([s.shard for s in spans], [s.start for s in spans], [s.stop for s in spans])

    @property
    def spans(self) -> SpanArray:
        return SpanArray(self.shard, self.start, self.stop)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def slice(self, start: int, stop: int) -> SpanArray:
        """Spans covering positions ``[start, stop)``; positions past the end wrap around
        (that is how ``remainder="pad"`` repeats samples)."""
        return SpanArray(*self._slice(start, stop))

    def _slice(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        total = len(self)
        pieces = []
        while start < stop and total:
            begin = start % total
            end = min(begin + (stop - start), total)
            first = int(np.searchsorted(self.offsets, begin, side="right")) - 1
            last = int(np.searchsorted(self.offsets, end, side="left"))  # exclusive
            offsets = self.offsets[first:last]
            lo = self.start[first:last] + np.maximum(0, begin - offsets)
            hi = self.start[first:last] + np.minimum(self.stop[first:last]
                                                     - self.start[first:last], end - offsets)
            keep = hi > lo
            pieces.append((self.shard[first:last][keep], lo[keep], hi[keep]))
            start += end - begin
        if not pieces:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        return _merge_adjacent(*(np.concatenate(column) for column in zip(*pieces, strict=True)))

    def subtract(self, begins: np.ndarray, ends: np.ndarray) -> Positions:
        """The positions outside the intervals ``[begins[i], ends[i])``, in arrays."""
        total = len(self)
        begins = np.minimum(np.append(begins, total).astype(np.int64), total)
        ends = np.minimum(np.append(ends, total).astype(np.int64), total)
        order = np.argsort(begins, kind="stable")
        begins, ends = begins[order], ends[order]
        # a gap before each interval: from the furthest end before it
        covered = np.concatenate(([0], np.maximum.accumulate(ends)[:-1]))
        gap = begins > covered
        low, high = covered[gap], begins[gap]
        if not len(low):
            return Positions([], [], [])
        # each gap's pieces: the spans it overlaps, cut to it
        first = np.searchsorted(self.offsets, low, side="right") - 1
        counts = np.searchsorted(self.offsets, high, side="left") - first
        span = np.repeat(first, counts) + np.arange(counts.sum()) - np.repeat(
            np.cumsum(counts) - counts, counts)
        offsets = self.offsets[span]
        lo = self.start[span] + np.maximum(0, np.repeat(low, counts) - offsets)
        hi = self.start[span] + np.minimum(self.stop[span] - self.start[span],
                                           np.repeat(high, counts) - offsets)
        keep = hi > lo
        return Positions(*_merge_adjacent(self.shard[span][keep], lo[keep], hi[keep]))


def _merge_adjacent(shard: np.ndarray, start: np.ndarray, stop: np.ndarray):
    """Join neighbours that continue each other (same shard, one's stop the next's start)."""
    if len(shard) < 2:
        return shard, start, stop
    joins = (shard[1:] == shard[:-1]) & (start[1:] == stop[:-1])
    if not joins.any():
        return shard, start, stop
    heads = np.flatnonzero(np.concatenate(([True], ~joins)))
    tails = np.concatenate((heads[1:] - 1, [len(shard) - 1]))
    return shard[heads], start[heads], stop[tails]


@dataclass(frozen=True)
class PlanOptions:
    """``window``: samples of a full shuffle window; ``start``: samples of a stream's first
    window, doubling up to ``window`` (None: every window full size)."""

    seed: int = 0
    shuffle: bool = True
    window: int = 1000
    remainder: str = "drop"
    start: int | None = DEFAULT_SHUFFLE_START

    def __post_init__(self):
        if self.window < 1:
            raise OptionError(f"shuffle window must be at least 1 sample, not {self.window}")
        if self.start is not None and self.start < 1:
            raise OptionError(f"the first shuffle window must be at least 1 sample, not "
                              f"{self.start}")
        samples_per_rank(0, 1, self.remainder)  # validates the policy

    @property
    def schedule(self) -> WindowSchedule:
        """Where a stream's shuffle windows begin (``wdstream.stream.plan.window``)."""
        return WindowSchedule.of(self.window, self.start)


class Layout:
    """How a sequence of positions is cut into equal rank runs and per-worker streams."""

    def __init__(self, total: int, world: int, workers: int, remainder: str):
        if world < 1 or workers < 1:
            raise OptionError(f"world size and workers must be at least 1, not {world}, {workers}")
        self.total, self.world, self.workers = total, world, workers
        self.rank_samples = samples_per_rank(total, world, remainder)
        self.stream_samples = stream_sizes(self.rank_samples, workers)
        self._stream_offsets = [0, *itertools.accumulate(self.stream_samples[:-1])]

    @property
    def remainder_samples(self) -> int:
        """Samples dropped (``drop``) or repeated (``pad``) to give every rank as many."""
        return abs(self.total - self.rank_samples * self.world)

    def stream_start(self, rank: int, stream: int) -> int:
        return rank * self.rank_samples + self._stream_offsets[stream]


class EpochPlan:
    """The plan of one epoch for one layout (world size, workers), after the segments of this
    epoch that earlier layouts already consumed (``history``)."""

    def __init__(self, counts: Sequence[int], epoch: int, world: int, workers: int,
                 options: PlanOptions, history: Sequence[HistorySegment] = ()):
        self.epoch = epoch
        self.options = options
        self.schedule = options.schedule
        self.segment = len(history)
        order = shard_order(len(counts), options.seed, epoch, options.shuffle)
        sizes = np.asarray(counts, dtype=np.int64)[order]
        sequence = Positions(order, np.zeros(len(order), dtype=np.int64), sizes)
        for index, done in enumerate(history):
            if len(done.consumed) != done.workers:
                raise OptionError("a segment needs one consumed count per worker stream")
            layout = Layout(len(sequence), done.world, done.workers, options.remainder)
            taken = [self._consumed_intervals(layout, index, rank, stream,
                                              done.consumed[stream])
                     for rank in range(done.world) for stream in range(done.workers)]
            sequence = sequence.subtract(np.concatenate([b for b, _e in taken]),
                                         np.concatenate([e for _b, e in taken]))
        self.sequence = sequence
        self.layout = Layout(len(sequence), world, workers, options.remainder)

    @property
    def total(self) -> int:
        return self.layout.total

    @property
    def rank_samples(self) -> int:
        return self.layout.rank_samples

    @property
    def stream_samples(self) -> list[int]:
        return self.layout.stream_samples

    @property
    def remainder_samples(self) -> int:
        return self.layout.remainder_samples

    def stream_spans(self, rank: int, stream: int) -> SpanArray:
        """The spans stream ``stream`` of rank ``rank`` reads, in order."""
        start = self.layout.stream_start(rank, stream)
        return self.sequence.slice(start, start + self.layout.stream_samples[stream])

    def window_order(self, rank: int, stream: int, window: int, size: int) -> np.ndarray:
        return self._window_order(self.segment, rank, stream, window, size)

    def _window_order(self, segment, rank, stream, window, size) -> np.ndarray:
        o = self.options
        return window_order(size, o.seed, self.epoch, segment, rank, stream, window, o.shuffle)

    def _consumed_intervals(self, layout: Layout, segment: int, rank: int, stream: int,
                            consumed: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions (as [begin, end) intervals, two arrays) of the first ``consumed`` samples
        a stream yielded: its whole windows, and the first picks of the window it was in.
        Padding positions past the end repeat earlier ones and deliver nothing new: left
        out."""
        size = layout.stream_samples[stream]
        consumed = consumed_at(consumed, rank)
        consumed = size if consumed == STREAM_END else min(int(consumed), size)
        if consumed == 0:  # nothing delivered (or an empty stream)
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        start = layout.stream_start(rank, stream)
        schedule = self.schedule
        index, full = schedule.locate(consumed)
        begins = np.array([start], dtype=np.int64)
        if consumed > full:
            order = self._window_order(segment, rank, stream, index,
                                       min(schedule.size(index), size - full))
            begins = np.append(begins, start + full + order[: consumed - full])
        ends = begins + 1
        ends[0] = start + full
        inside = begins < layout.total
        return begins[inside], np.minimum(ends[inside], layout.total)


def drop_first(spans: Sequence[Span], count: int) -> SpanArray:
    """The spans left after skipping ``count`` positions (spans must have known lengths)."""
    return SpanArray.of(spans).drop_first(count)


def shard_streams(n_shards: int, seed: int, epoch: int, shuffle: bool, world: int, workers: int,
                  rank: int, stream: int) -> SpanArray:
    """Without sample counts (no manifest) the plan can only split whole shards: after the
    epoch's permutation, shard i goes to slot ``i % (world * workers)``. Ranks may then get
    unequal sample counts; a manifest (``wdstream index``) lifts that limit."""
    order = shard_order(n_shards, seed, epoch, shuffle)
    slot = rank * workers + stream
    shards = order[slot:: world * workers]
    return SpanArray(shards, np.zeros(len(shards), dtype=np.int64),
                     np.full(len(shards), OPEN, dtype=np.int64))
