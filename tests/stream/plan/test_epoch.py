"""The epoch plan: pure functions, checked exhaustively on small layouts."""

from collections import Counter

import numpy as np
import pytest

from wdstream.stream.plan.epoch import (
    EpochPlan,
    HistorySegment,
    PlanOptions,
    Span,
    drop_first,
    shard_streams,
)

COUNTS = [5, 50, 7, 3, 40, 11, 1, 30]  # uneven on purpose: 3 to 50 samples per shard


def positions(spans):
    return [(s.shard, i) for s in spans for i in range(s.start, s.stop)]


def stream_order(plan, rank, stream, consumed=0):
    """The (shard, index) samples a stream yields, window-shuffled as the reader does."""
    samples = positions(plan.stream_spans(rank, stream))
    out = []
    for w, begin, size in window_bounds(plan.options, len(samples)):
        chunk = samples[begin:begin + size]
        out.extend(chunk[i] for i in plan.window_order(rank, stream, w, len(chunk)))
    return out


def window_bounds(options, length):
    """(index, start, size) of a stream's windows: ``options.start`` samples, doubling while
    smaller than the window, then windows of ``options.window``."""
    window = options.window
    size = window if options.start is None else min(options.start, window)
    w = begin = 0
    while begin < length:
        yield w, begin, size
        w, begin = w + 1, begin + size
        size = min(size * 2, window)


@pytest.mark.parametrize("world,workers", [(1, 1), (1, 3), (2, 2), (3, 1), (4, 3), (16, 2)])
@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_every_sample_once_and_equal_ranks(world, workers, remainder):
    plan = EpochPlan(COUNTS, epoch=0, world=world, workers=workers,
                     options=PlanOptions(seed=7, window=4, remainder=remainder))
    total = sum(COUNTS)
    seen = Counter()
    for rank in range(world):
        rank_samples = [s for k in range(workers) for s in stream_order(plan, rank, k)]
        assert len(rank_samples) == plan.rank_samples
        seen.update(rank_samples)
    if remainder == "drop":
        assert plan.rank_samples == total // world
        assert all(v == 1 for v in seen.values())
        assert len(seen) == total - plan.remainder_samples
    else:
        assert len(seen) == total
        assert sum(seen.values()) - total == plan.remainder_samples < world


def test_deterministic_and_seed_epoch_dependent():
    def order(seed, epoch):
        plan = EpochPlan(COUNTS, epoch, 2, 2, PlanOptions(seed=seed, window=8))
        return [stream_order(plan, r, k) for r in range(2) for k in range(2)]

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(2, 0)
    assert order(1, 0) != order(1, 1)


def test_shards_permuted_before_split():
    ranks_of_shard_0 = set()
    for epoch in range(20):
        plan = EpochPlan([10] * 8, epoch, 4, 1, PlanOptions(seed=0))
        for rank in range(4):
            if any(s.shard == 0 for s in plan.stream_spans(rank, 0)):
                ranks_of_shard_0.add(rank)
    assert len(ranks_of_shard_0) > 1


def test_no_shuffle_is_file_order():
    plan = EpochPlan(COUNTS, 3, 1, 1, PlanOptions(shuffle=False, window=1))
    assert positions(plan.stream_spans(0, 0)) == [(s, i) for s, n in enumerate(COUNTS)
                                                  for i in range(n)]


def test_fewer_shards_than_slots_splits_samples():
    plan = EpochPlan([9, 8], 0, 3, 2, PlanOptions(seed=1, window=2))
    sizes = [len(positions(plan.stream_spans(r, k))) for r in range(3) for k in range(2)]
    assert sizes == [3, 2] * 3  # 17 // 3 = 5 per rank, 3 + 2 per rank


@pytest.mark.parametrize("before,after", [((2, 2), (1, 3)), ((2, 2), (3, 1)), ((3, 2), (2, 2)),
                                          ((1, 1), (4, 2))])
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.77, 1.0])
def test_elastic_replan_delivers_the_rest_exactly_once(before, after, fraction):
    options = PlanOptions(seed=5, window=6)
    first = EpochPlan(COUNTS, 2, *before, options)
    consumed = tuple(int(n * fraction) for n in first.stream_samples)
    delivered = Counter()
    for rank in range(before[0]):
        for k in range(before[1]):
            delivered.update(stream_order(first, rank, k)[:consumed[k]])
    segment = HistorySegment(before[0], before[1], 4, consumed)
    second = EpochPlan(COUNTS, 2, *after, options, history=[segment])
    assert second.total == sum(COUNTS) - sum(delivered.values())
    for rank in range(after[0]):
        rank_samples = [s for k in range(after[1]) for s in stream_order(second, rank, k)]
        assert len(rank_samples) == second.rank_samples
        delivered.update(rank_samples)
    assert all(v == 1 for v in delivered.values())
    assert len(delivered) == sum(COUNTS) - second.remainder_samples


@pytest.mark.parametrize("window,start", [(32, 2), (1000, 32), (12, 1)])
@pytest.mark.parametrize("before,after", [((2, 2), (1, 3)), ((1, 3), (3, 2))])
def test_elastic_replan_inside_growing_windows(window, start, before, after):
    """A stream stopped anywhere in its first windows (which grow): the rest of the epoch,
    re-planned on another layout, delivers every sample exactly once."""
    options = PlanOptions(seed=3, window=window, start=start)
    first = EpochPlan(COUNTS, 1, *before, options)
    assert options.schedule.growing
    for stop in range(0, 70, 3):
        consumed = tuple(min(stop + k, n) for k, n in enumerate(first.stream_samples))
        delivered = Counter()
        for rank in range(before[0]):
            for k in range(before[1]):
                delivered.update(stream_order(first, rank, k)[:consumed[k]])
        second = EpochPlan(COUNTS, 1, *after, options,
                           history=[HistorySegment(before[0], before[1], 4, consumed)])
        assert second.total == sum(COUNTS) - sum(delivered.values())
        for rank in range(after[0]):
            delivered.update(s for k in range(after[1]) for s in stream_order(second, rank, k))
        assert all(v == 1 for v in delivered.values()), f"stop {stop}"
        assert len(delivered) == sum(COUNTS) - second.remainder_samples


def test_windows_of_one_size_without_a_start():
    """``start=None`` (or a start at least the window) is the order of windows of one size."""
    fixed = EpochPlan(COUNTS, 0, 1, 2, PlanOptions(seed=2, window=8, start=None))
    same = EpochPlan(COUNTS, 0, 1, 2, PlanOptions(seed=2, window=8, start=8))
    growing = EpochPlan(COUNTS, 0, 1, 2, PlanOptions(seed=2, window=8, start=2))
    for k in range(2):
        samples = positions(fixed.stream_spans(0, k))
        chunks = [samples[b:b + 8] for b in range(0, len(samples), 8)]
        order = [c[i] for w, c in enumerate(chunks) for i in fixed.window_order(0, k, w, len(c))]
        assert stream_order(fixed, 0, k) == order == stream_order(same, 0, k)
        assert stream_order(growing, 0, k) != order
        assert sorted(stream_order(growing, 0, k)) == sorted(order)


def test_two_elastic_changes_chain():
    options = PlanOptions(seed=9, window=5)
    first = EpochPlan(COUNTS, 0, 2, 2, options)
    seg1 = HistorySegment(2, 2, 1, tuple(n // 3 for n in first.stream_samples))
    second = EpochPlan(COUNTS, 0, 3, 1, options, [seg1])
    seg2 = HistorySegment(3, 1, 1, tuple(n // 2 for n in second.stream_samples))
    third = EpochPlan(COUNTS, 0, 1, 2, options, [seg1, seg2])
    seen = Counter()
    for plan, seg in ((first, seg1), (second, seg2)):
        for rank in range(seg.world):
            for k in range(seg.workers):
                seen.update(stream_order(plan, rank, k)[:seg.consumed[k]])
    for k in range(2):
        seen.update(stream_order(third, 0, k))
    assert all(v == 1 for v in seen.values()) and len(seen) == sum(COUNTS)


def test_drop_first_and_shard_streams():
    spans = [Span(3, 2, 6), Span(1, 0, 4)]
    assert drop_first(spans, 5) == [Span(1, 1, 4)]
    streams = [shard_streams(10, 0, 0, True, 2, 2, r, k) for r in range(2) for k in range(2)]
    assert sorted(s.shard for spans in streams for s in spans) == list(range(10))


def test_plan_scales_to_100k_shards():
    counts = np.random.default_rng(0).integers(500, 1500, 100_000)
    plan = EpochPlan(counts, 0, 8, 4, PlanOptions(seed=1))
    assert sum(s.length for s in plan.stream_spans(7, 3)) == plan.stream_samples[3]
