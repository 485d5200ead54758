"""wdstream.Mix: proportions, determinism, stop rules, equal batches per rank and exact resume
through wdstream.DataLoader."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import wdstream
from tests.support.llm_data import sources, write_sources
from tests.support.shard_data import first_batches, write_dataset
from wdstream.errors import InputError, StateError
from wdstream.stages.mix import BLOCK, block_choices
from wdstream.stream.load.contract import IterationSpec

SOURCES = {"a": [50, 30, 40], "b": [20, 25], "c": [15]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("mix"), SOURCES)


pytestmark = pytest.mark.usefixtures("single_rank")


def mix(data, names=("a", "b"), weights=(0.7, 0.3), seed=5, **kwargs):
    parts = sources(data, names)
    return wdstream.Mix(parts, list(weights), seed=seed, names=list(names), **kwargs)


def loader(data, workers=2, batch_size=4, **kwargs):
    return wdstream.DataLoader(mix(data, **kwargs), batch_size=batch_size, num_workers=workers)


def items(batches):
    return [tuple(zip(b["__source__"], b["__key__"], strict=True)) for b in batches]


def take(loader, n):
    return items(first_batches(loader, n))


def test_block_choices_follow_the_weights_exactly():
    weights = np.array([0.5, 0.3, 0.15, 0.05])
    total = np.zeros(4)
    for block in range(40):
        counts = np.bincount(block_choices(weights, 1, 0, 0, block), minlength=4)
        assert counts.sum() == BLOCK
        assert np.all(np.abs(counts - weights * BLOCK) < 1)  # within one draw in every block
        total += counts
    assert np.allclose(total / total.sum(), weights, atol=1e-3)
    assert not np.array_equal(block_choices(weights, 1, 0, 0, 0), block_choices(weights, 1, 0, 0, 1))
    assert not np.array_equal(block_choices(weights, 1, 0, 0, 0), block_choices(weights, 1, 1, 0, 0))


class Counted:
    """A source of ``n`` dict samples per stream, without I/O."""

    def __init__(self, n: int):
        self.n, self.source, self.has_counts = n, f"counted-{n}", True

    def plan(self, epoch, world, workers, history=()):
        from wdstream.stages.base import StagePlan
        return StagePlan([self.n] * workers)

    def positioned(self, spec, stream, start):
        for position in range(start + 1, self.n + 1):
            yield {"epoch": spec.epoch}, position


@pytest.mark.parametrize("stop", ["first_exhausted", "cycle"])
@pytest.mark.slow
def test_length_from_counts_equals_the_draws_made(stop):
    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = rng.integers(0 if stop == "first_exhausted" else 1, 2500, size=3)
        weights = rng.random(3) * [1, 1, rng.integers(0, 2)]  # sometimes a weight of 0
        ds = wdstream.Mix([Counted(int(n)) for n in sizes], list(weights), seed=int(sizes[0]),
                          stop=stop)
        drawn = sum(1 for _ in ds.positioned(IterationSpec(0, 0, 1, 1), 0, 0))
        assert ds.plan(0, 1, 1).stream_samples == [drawn], (sizes, weights)


@pytest.mark.slow
def test_proportions_over_20k_draws(data):
    ds = mix(data, names=("a", "b", "c"), weights=(5, 3, 2), stop="fixed",
             samples_per_epoch=20_000)
    sources = Counter(s["__source__"] for s, _ in ds.positioned(IterationSpec(0, 0, 1, 1), 0, 0))
    assert sum(sources.values()) == 20_000
    for name, weight in zip("abc", (0.5, 0.3, 0.2), strict=True):
        assert abs(sources[name] / 20_000 - weight) < 0.015
        assert abs(sources[name] / 20_000 - weight) < 0.002  # in fact much tighter


def test_deterministic_and_seeded(data):
    first, second = items(loader(data)), items(loader(data))
    assert first == second
    assert items(loader(data, seed=6)) != first
    again = loader(data)
    assert items(again) == first and items(again) != first  # the next epoch differs


@pytest.mark.parametrize("stop", ["first_exhausted", "cycle", "fixed"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_exact_resume(data, stop, workers):
    kwargs = {"stop": stop, "workers": workers}
    if stop == "fixed":
        kwargs["samples_per_epoch"] = 250
    reference = loader(data, **kwargs)
    expected = len(reference)
    batches = items(reference)
    assert len(batches) == expected
    for stop_at in (1, len(batches) // 2, len(batches) - 1):
        first = loader(data, **kwargs)
        before = take(first, stop_at)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = loader(data, **kwargs)
        resumed.load_state_dict(state)
        assert before + items(resumed) == batches, f"stop {stop_at}"


@pytest.mark.slow
def test_state_at_the_end_of_an_epoch_starts_the_next(data):
    first = loader(data)
    items(first)
    next_epoch = items(first)
    resumed = loader(data)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    third = items(resumed)  # first's state was saved after epoch 1: epoch 2 comes next
    reference = loader(data)
    items(reference), items(reference)
    assert third == items(reference) and third != next_epoch


def test_stop_rules(data):
    spec = IterationSpec(0, 0, 1, 1)
    sizes = {n: sum(c) for n, c in SOURCES.items()}

    first = [s for s, _ in mix(data).positioned(spec, 0, 0)]
    counts = Counter(s["__source__"] for s in first)
    assert counts["a"] == sizes["a"] or counts["b"] == sizes["b"]  # one source ran out
    assert len({s["__key__"] + s["__source__"] for s in first}) == len(first)  # no repeats

    cycled = [s for s, _ in mix(data, stop="cycle").positioned(spec, 0, 0)]
    counts = Counter(s["__source__"] for s in cycled)
    assert counts["a"] >= sizes["a"] and counts["b"] >= sizes["b"]
    # the smaller source repeated, its second pass in another order
    b_keys = [s["__key__"] for s in cycled if s["__source__"] == "b"]
    assert len(b_keys) > sizes["b"]
    assert b_keys[sizes["b"]:] != b_keys[: len(b_keys) - sizes["b"]]
    assert sorted(set(b_keys)) == sorted(set(b_keys[: sizes["b"]]))

    assert len(list(mix(data, stop="fixed", samples_per_epoch=333).positioned(spec, 0, 0))) == 333


@pytest.mark.parametrize("stop", ["first_exhausted", "cycle"])
def test_equal_batches_on_every_rank(data, monkeypatch, stop):
    lengths, keys = [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ranked = loader(data, stop=stop, batch_size=3)
        expected = len(ranked)  # before iterating: afterwards it is the next epoch's
        delivered = items(ranked)
        lengths.append((len(delivered), expected))
        keys.append({k for batch in delivered for k in batch})
    assert lengths[0][0] == lengths[0][1] and len(set(lengths)) == 1
    if stop == "first_exhausted":
        assert not keys[0] & keys[1] and not keys[1] & keys[2]  # ranks read disjoint samples


def test_zero_weight_source_is_never_drawn(data):
    ds = mix(data, names=("a", "b", "c"), weights=(1, 1, 0), stop="cycle")
    drawn = {s["__source__"] for s, _ in ds.positioned(IterationSpec(0, 0, 1, 1), 0, 0)}
    assert drawn == {"a", "b"}


def test_sources_are_named_by_their_url_by_default(data):
    sources = [wdstream.StreamingDataset(str(data / n)) for n in ("a", "b")]
    batch = next(iter(wdstream.DataLoader(wdstream.Mix(sources, [1, 1]), batch_size=8)))
    assert set(batch["__source__"]) <= {str(data / "a"), str(data / "b")}
    twice = wdstream.Mix([sources[0], wdstream.StreamingDataset(str(data / "a"), seed=4)])
    assert twice.names == [f"{data / 'a'}#0", f"{data / 'a'}#1"]


def test_layout_change_is_accepted_another_mixture_refused(data):
    first = loader(data, workers=2)
    take(first, 3)
    state = first.state_dict()
    loader(data, workers=1).load_state_dict(state)  # elastic: tests/elastic/test_stages.py
    with pytest.raises(StateError):  # another mixture
        loader(data, workers=2, weights=(0.5, 0.5)).load_state_dict(state)


def test_mixture_without_manifests_streams_but_has_no_length(tmp_path):
    write_dataset(tmp_path / "x", [10, 10], manifest=False)
    write_dataset(tmp_path / "y", [10], manifest=False)
    ds = wdstream.Mix([wdstream.StreamingDataset(str(tmp_path / n)) for n in "xy"], [1, 1])
    plain = wdstream.DataLoader(ds, batch_size=2)
    assert len(items(plain)) > 0
    with pytest.raises(TypeError):
        len(plain)


@pytest.mark.parametrize("kwargs", [
    {"weights": [1]},
    {"weights": [1, -1]},
    {"weights": [0, 0]},
    {"weights": [1, float("nan")]},
    {"stop": "longest"},
    {"stop": "fixed"},
    {"samples_per_epoch": 10},
    {"stop": "fixed", "samples_per_epoch": 0},
    {"names": ["x", "x"]},
])
def test_bad_arguments(data, kwargs):
    sources = [wdstream.StreamingDataset(str(data / n)) for n in ("a", "b")]
    arguments = {"weights": [1, 1], **kwargs}
    with pytest.raises(InputError):
        wdstream.Mix(sources, **arguments)


def test_bad_position_is_refused(data):
    with pytest.raises(StateError):
        next(mix(data).positioned(IterationSpec(0, 0, 1, 1), 0, [3, [0, 1], [0, 2]]))


def test_fixed_length_is_split_over_ranks(data, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = mix(data, stop="fixed", samples_per_epoch=101)
    assert len(ds) == 50
