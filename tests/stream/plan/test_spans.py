"""A stream's spans as arrays (wdstream.stream.plan.spans): the same spans, orders and visits as
the lists of Span objects the plan and the reader used before, with no object per shard."""

from __future__ import annotations

import gc
import hashlib
import itertools
import json

import numpy as np
import pytest

from wdstream.errors import OptionError
from wdstream.stream.plan.epoch import (
    EpochPlan,
    HistorySegment,
    PlanOptions,
    Span,
    drop_first,
    shard_streams,
)
from wdstream.stream.plan.spans import SpanArray
from wdstream.stream.read.shard_reader import ReadOptions, ShardTable, SpanReader

# What the list-based plan (a Span object per span, a list per visit) gave for the cases of
# plans_digest(), computed with it before the spans became arrays: the orders are pinned.
LIST_PLAN_DIGEST = "2be2032417c73632"


def _triples(spans) -> list:
    return [(s.shard, s.start, s.stop) for s in spans]


def _plan_digest(plan: EpochPlan, world: int, workers: int) -> str:
    digest = hashlib.sha256()
    table = ShardTable(urls=[f"u{i}" for i in range(1000)])
    for rank, stream in itertools.product(range(world), range(workers)):
        spans = plan.stream_spans(rank, stream)
        skipped = drop_first(spans, 3 * plan.options.window)
        visits = SpanReader(skipped, table, ReadOptions()).visits
        digest.update(json.dumps([_triples(spans), _triples(skipped),
                                  [_triples(v) for v in visits]]).encode())
    return digest.hexdigest()


def plans_digest() -> str:
    """Every stream's spans, those after drop_first and the reader's visits, over seeds,
    windows, remainders, shuffle on and off, layouts, and elastic histories."""
    counts = np.random.default_rng(5).integers(0, 40, 200).tolist()  # empty shards too
    digest = hashlib.sha256()
    for seed, window, remainder, shuffle in itertools.product(
            (0, 12345), (1, 16), ("drop", "pad"), (True, False)):
        options = PlanOptions(seed=seed, shuffle=shuffle, window=window, remainder=remainder)
        for world, workers in ((1, 1), (2, 3), (3, 2)):
            history = [HistorySegment(2, 3, 8, (37, 5, "end")),
                       HistorySegment(world, workers, 4, tuple(range(3, 3 + workers)))]
            for done in (0, 1, 2):
                plan = EpochPlan(counts, 1, world, workers, options, history[:done])
                digest.update(_plan_digest(plan, world, workers).encode())
    for rank, stream in itertools.product(range(2), range(3)):
        digest.update(json.dumps(_triples(shard_streams(50, 3, 1, True, 2, 3, rank,
                                                        stream))).encode())
    return digest.hexdigest()[:16]


def test_plans_are_the_ones_the_list_based_plan_gave():
    assert plans_digest() == LIST_PLAN_DIGEST


def list_drop_first(spans, count):
    """drop_first as it was, over a list of Span objects."""
    kept = []
    for span in spans:
        if count >= span.length:
            count -= span.length
            continue
        kept.append(Span(span.shard, span.start + count, span.stop))
        count = 0
    return kept


def list_visits(spans):
    """The reader's visits as they were: lists of consecutive spans of one shard."""
    visits = []
    for span in spans:
        last = visits[-1][-1] if visits else None
        if (last is not None and last.shard == span.shard and last.stop is not None
                and span.stop is not None and span.start >= last.stop):
            visits[-1].append(span)
        else:
            visits.append([span])
    return visits


def random_spans(rng, count: int, open_ended: bool = False) -> list[Span]:
    """Spans as elastic resumes make them: few shards, short, some empty, some out of order."""
    spans = []
    for _ in range(count):
        start = int(rng.integers(0, 20))
        stop = None if open_ended and rng.random() < 0.3 else start + int(rng.integers(0, 6))
        spans.append(Span(int(rng.integers(0, 4)), start, stop))
    return spans


@pytest.mark.parametrize("seed", range(40))
def test_drop_first_and_visits_match_the_list_versions(seed):
    rng = np.random.default_rng(seed)
    spans = random_spans(rng, int(rng.integers(0, 30)))
    for count in (0, 1, 3, 7, 40, 1000):
        assert drop_first(spans, count) == list_drop_first(spans, count)
        assert list(drop_first(SpanArray.of(spans), count)) == list_drop_first(spans, count)
    mixed = random_spans(rng, int(rng.integers(0, 30)), open_ended=True)
    for given in (spans, mixed):
        visits = SpanArray.of(given).visits()
        assert list(visits) == list_visits(given)
        assert [visits.shard(i) for i in range(len(visits))] == [v[0].shard for v in
                                                                  list_visits(given)]


def test_a_span_array_is_a_sequence_of_spans():
    spans = [Span(3, 2, 6), Span(1, 0, 4), Span(7, 5, None)]
    array = SpanArray.of(spans)
    assert len(array) == 3 and array == spans and spans == list(array)
    assert array[0] == Span(3, 2, 6) and array[-1] == Span(7, 5, None)
    assert array[1:] == spans[1:] and isinstance(array[1:], SpanArray)
    assert array != spans[:2] and array != [Span(3, 2, 6), Span(1, 0, 4), Span(7, 5, 9)]
    assert SpanArray.of(array) is array and array == SpanArray.of(list(array))
    with pytest.raises(IndexError):
        array[3]
    with pytest.raises(OptionError):
        array.lengths()
    with pytest.raises(OptionError):
        drop_first(array, 1)
    assert list(SpanArray([], [], [])) == [] and len(SpanArray([], [], []).visits()) == 0
    assert "3 spans" in repr(array)


def test_a_stream_holds_no_object_per_shard():
    counts = np.full(100_000, 10)
    plan = EpochPlan(counts, 0, 1, 2, PlanOptions(seed=1, window=4))
    gc.collect()
    before = len(gc.get_objects())
    spans = drop_first(plan.stream_spans(0, 1), 8)
    reader = SpanReader(spans, ShardTable(urls=["u"] * len(counts)), ReadOptions())
    assert len(reader.visits) == len(spans) == 50_000
    assert len(gc.get_objects()) - before < 100
    assert sum(s.length for s in spans) == plan.stream_samples[1] - 8
