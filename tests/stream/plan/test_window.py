"""Shuffle windows that grow at the start of a stream: the schedule, what the reader pulls
before the first sample, permutations, exact resume at every position of the first windows,
and states saved by a wdstream whose windows were all one size."""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter

import numpy as np
import pytest

import wdstream
from tests.support.shard_data import all_keys, batch_keys, sample_key, take, write_dataset
from wdstream.errors import OptionError
from wdstream.stream.load.contract import IterationSpec
from wdstream.stream.plan.window import (
    DEFAULT_SHUFFLE_START,
    WindowSchedule,
    chunk_size,
    window_chunks,
    window_shuffle,
)
from wdstream.stream.read.shard_reader import SpanReader

COUNTS = [13, 40, 7, 25, 3, 31, 18, 9, 60, 44]  # 250 samples, uneven shards

pytestmark = pytest.mark.usefixtures("single_rank")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("growing")
    write_dataset(folder, COUNTS)
    return str(folder)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """The same shards without a manifest (the reader's islice path)."""
    folder = tmp_path_factory.mktemp("growing-bare")
    write_dataset(folder, COUNTS, manifest=False)
    return str(folder)


# ---- the schedule -----------------------------------------------------------------------
SCHEDULES = [(1000, 32), (1000, 1), (255, 32), (16, 1), (16, 4), (16, 16), (16, 32), (7, 3),
             (1, 32), (64, 64), (100, None)]


@pytest.mark.parametrize("window,start", SCHEDULES)
def test_windows_tile_the_stream_and_locate_round_trips(window, start):
    schedule = WindowSchedule.of(window, start)
    first = window if start is None else min(start, window)
    position = 0
    for index in range(40):
        size = schedule.size(index)
        assert schedule.begin(index) == position
        # doubling from the first size while below the window, then the window
        assert size == min(first * 2 ** index, window) if first * 2 ** index < window \
            else size == window
        for p in (position, position + size // 2, position + size - 1):
            assert schedule.locate(p) == (index, position)
        position += size
    assert schedule.growing == (first < window)


def test_schedule_figures():
    schedule = WindowSchedule.of(1000, 32)
    assert [schedule.size(i) for i in range(7)] == [32, 64, 128, 256, 512, 1000, 1000]
    assert [schedule.begin(i) for i in range(7)] == [0, 32, 96, 224, 480, 992, 1992]
    assert schedule.growth_windows == 5 and schedule.growth_samples == 992
    assert schedule.locate(31) == (0, 0) and schedule.locate(32) == (1, 32)
    assert schedule.locate(991) == (4, 480) and schedule.locate(992) == (5, 992)
    assert schedule.locate(10**12) == (5 + (10**12 - 992) // 1000,
                                       992 + (10**12 - 992) // 1000 * 1000)
    bounded = WindowSchedule.of(255, 32)  # shuffle_bytes: 1 MiB samples, 256 MiB
    assert [bounded.size(i) for i in range(5)] == [32, 64, 128, 255, 255]
    assert WindowSchedule.of(16, 32) == WindowSchedule(16, 16)  # never larger than the window
    assert not WindowSchedule.of(1, 32).growing  # shuffle=False
    with pytest.raises(OptionError):
        WindowSchedule(16, 17)
    with pytest.raises(OptionError):
        WindowSchedule.of(16, 4).locate(-1)
    assert DEFAULT_SHUFFLE_START == 32


# ---- the shuffle over a counting source ---------------------------------------------------
def counted(n: int, pulled: list):
    for i in range(n):
        pulled.append(i)
        yield i


def window_order(index, size):
    return np.random.default_rng(index).permutation(size)


@pytest.mark.parametrize("window,start", [(1000, 32), (16, 1), (16, 4), (10, None)])
def test_each_window_is_read_only_when_its_turn_comes(window, start):
    schedule = WindowSchedule.of(window, start)
    pulled = []
    out = window_shuffle(counted(20_000, pulled), schedule, window_order)
    got = []
    for index in range(10):
        size = schedule.size(index)
        for _pick in range(size):
            got.append(next(out))
            # the first pick of a window needs that window read, and nothing after it
            assert len(pulled) == schedule.begin(index) + size
    assert sorted(got) == list(range(len(got)))  # each window a permutation of its positions
    for index in range(10):
        begin, size = schedule.begin(index), schedule.size(index)
        assert sorted(got[begin:begin + size]) == list(range(begin, begin + size))


@pytest.mark.parametrize("size", [1, 7, 64])
@pytest.mark.parametrize("window,start,skip", [(1000, 32, 0), (16, 4, 3), (1, None, 0)])
def test_lists_never_hold_two_windows(size, window, start, skip):
    schedule = WindowSchedule.of(window, start)
    pulled = []
    lists = window_chunks(counted(3000, pulled), schedule, window_order, 0, skip, size)
    flat = list(window_shuffle(counted(3000, []), schedule, window_order, 0, skip))
    got, index, taken = [], 0, skip  # taken: picks of window ``index`` handed out
    for items in lists:
        assert 0 < len(items) <= size
        if window > 1:
            # every item of a list from one window, and the list asked for nothing after it
            assert len(pulled) == min(schedule.begin(index) + schedule.size(index), 3000)
            begin, end = schedule.begin(index), schedule.begin(index) + schedule.size(index)
            assert all(begin <= item < end for item in items)
            taken += len(items)
            if taken == min(schedule.size(index), 3000 - begin):
                index, taken = index + 1, 0
        got.extend(items)
    assert got == flat  # the same order as one by one


def test_an_int_is_a_window_of_one_size():
    pulled = []
    out = window_shuffle(counted(100, pulled), 10, window_order)
    next(out)
    assert len(pulled) == 10


# ---- the dataset: what the reader is asked for ---------------------------------------------
def count_reads(monkeypatch, counts: Counter) -> None:
    """Count in ``counts`` the samples datasets pull from their reader, per process."""
    real = SpanReader.__iter__

    def counting(self):
        for sample in real(self):
            counts[os.getpid()] += 1
            yield sample

    monkeypatch.setattr(SpanReader, "__iter__", counting)


@pytest.fixture
def pulls(monkeypatch):
    """Counts the samples the dataset pulls from its reader, per process."""
    counts = Counter()
    count_reads(monkeypatch, counts)
    return counts


def spec(world=1, workers=1, rank=0, epoch=0):
    return IterationSpec(epoch=epoch, rank=rank, world=world, workers=workers)


@pytest.mark.parametrize("source", ["data", "bare"])
def test_first_sample_after_the_first_window_only(request, pulls, source):
    url = request.getfixturevalue(source)
    ds = wdstream.StreamingDataset(url, seed=5)  # shuffle_window 1000, first window 32
    stream = ds.positioned(spec(), 0, 0)
    next(stream)
    assert pulls[os.getpid()] == 32
    for _ in range(31):
        next(stream)
    assert pulls[os.getpid()] == 32
    next(stream)
    assert pulls[os.getpid()] == 96  # the second window, 64 samples
    pulls.clear()
    next(wdstream.StreamingDataset(url, seed=5, shuffle_start=None).positioned(spec(), 0, 0))
    assert pulls[os.getpid()] == sum(COUNTS)  # the old way: the whole (1000) window
    pulls.clear()
    unshuffled = wdstream.StreamingDataset(url, seed=5, shuffle=False)
    next(unshuffled.positioned(spec(), 0, 0))
    # unshuffled samples go on a list at a time: one list (about 1 MiB of samples; 1 sample
    # without a manifest's sizes) read before the first sample
    manifest = unshuffled.manifest
    expected = 1 if manifest is None else chunk_size(manifest.samples, manifest.bytes)
    assert pulls[os.getpid()] == expected
    pulls.clear()
    resumed = wdstream.StreamingDataset(url, seed=5).positioned(spec(), 0, 100)
    next(resumed)  # position 100 is in the third window, [96, 224); without a manifest the
    # reader cannot skip the samples before it by their counts, and reads them
    assert pulls[os.getpid()] == (224 - 96 if source == "data" else 224)


def stamp_pulls(sample):
    sample["pulled"] = PULLED[os.getpid()]
    return sample


PULLED = Counter()  # what the counting reader pulled in this (worker) process


def test_each_worker_yields_its_first_sample_after_its_first_window(data, monkeypatch):
    """Under the loader, in worker processes (forked with the counting reader)."""
    count_reads(monkeypatch, PULLED)
    ds = wdstream.StreamingDataset(data, seed=2, map=stamp_pulls)
    loader = wdstream.DataLoader(ds, batch_size=4, num_workers=2,
                                 multiprocessing_context="fork")
    batches = list(loader)
    stamps = [p for batch in batches for p in batch["pulled"]]
    streams = ds.plan(0, 1, 2).stream_samples  # 125 each: windows 32, 64, 29
    assert streams == [125, 125]
    # batches alternate between the two workers: the first 8 batches of each are its
    # first window (32 samples), read before its first sample and not one more
    firsts = [batches[i]["pulled"] for i in range(0, 16)]
    assert all(p == 32 for batch in firsts for p in batch)
    assert max(stamps) == 125 and stamps.count(96) == 2 * 64


# ---- every epoch a permutation; resume at every position of the first windows -----------
@pytest.mark.parametrize("window,start", [(16, 1), (16, 4), (1000, 32), (1000, 1), (64, None)])
def test_every_epoch_is_a_permutation(data, window, start):
    ds = wdstream.StreamingDataset(data, seed=9, shuffle_window=window, shuffle_start=start)
    orders = []
    for epoch in range(3):
        for world, workers in ((1, 1), (2, 3)):
            keys = [s["__key__"] for rank in range(world) for k in range(workers)
                    for s, _ in ds.positioned(spec(world, workers, rank, epoch), k, 0)]
            assert len(keys) == len(set(keys)) == ds.plan(epoch, world, workers).rank_samples \
                * world
            assert set(keys) <= all_keys(COUNTS)
            if world == 1:
                orders.append(keys)
    assert len({tuple(o) for o in orders}) == 3  # epochs differ


def rest_of(ds, s, stream, start):
    return [(sample["__key__"], position) for sample, position in ds.positioned(s, stream, start)]


@pytest.mark.parametrize("window,start", [(16, 1), (16, 4), (1000, 32), (1000, 1)])
@pytest.mark.parametrize("source", ["data", "bare"])
@pytest.mark.slow
def test_resume_at_every_position_of_the_first_windows(request, source, window, start):
    ds = wdstream.StreamingDataset(request.getfixturevalue(source), seed=4,
                                   shuffle_window=window, shuffle_start=start)
    for world, workers, rank, stream in ((1, 1, 0, 0), (1, 2, 0, 1)):
        s = spec(world, workers, rank)
        whole = rest_of(ds, s, stream, 0)
        assert [p for _, p in whole] == list(range(1, len(whole) + 1))
        for position in range(71):
            assert rest_of(ds, s, stream, position) == whole[position:], \
                f"resume at {position} of stream {stream}/{workers}"


@pytest.mark.slow
def test_a_loader_resumes_exactly_inside_growing_windows(data):
    def make(workers):
        ds = wdstream.StreamingDataset(data, seed=6, shuffle_window=100, shuffle_start=2)
        return wdstream.DataLoader(ds, batch_size=3, num_workers=workers)

    for workers in (0, 2):
        reference = batch_keys(make(workers))
        for stop in (1, 2, 3, 5, 8, 13, 21):
            first = make(workers)
            before = take(first, stop)
            resumed = make(workers)
            resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
            assert before + batch_keys(resumed) == reference, f"stop {stop}, {workers} workers"


# ---- options and fingerprints ---------------------------------------------------------------
def test_shuffle_start_is_checked_and_part_of_the_fingerprint(data):
    for bad in (0, -1):
        with pytest.raises(OptionError, match="shuffle_start"):
            wdstream.StreamingDataset(data, shuffle_start=bad)
    with pytest.raises(TypeError, match="shuffle_start"):
        wdstream.StreamingDataset(data, shuffle_start="32")
    prints = {wdstream.StreamingDataset(data, shuffle_start=s).fingerprint()
              for s in (1, 32, 64, None)}
    assert len(prints) == 4
    # windows of one size whatever the start: one order, so one fingerprint
    same = {wdstream.StreamingDataset(data, shuffle_window=16, shuffle_start=s).fingerprint()
            for s in (16, 32, None)}
    assert len(same) == 1
    assert wdstream.StreamingDataset(data, shuffle=False).fingerprint() == \
        wdstream.StreamingDataset(data, shuffle=False, shuffle_start=None).fingerprint()


def test_first_batches_keys_come_from_the_first_window(data):
    """The cost: a stream's first batch is a permutation of its first 32 positions."""
    ds = wdstream.StreamingDataset(data, seed=3)
    s = spec()
    first = [sample["__key__"] for sample, _ in itertools.islice(ds.positioned(s, 0, 0), 32)]
    plan = ds.plan(0, 1, 1)
    in_order = [sample_key(span.shard, i) for span in plan.stream_spans(0, 0)
                for i in range(span.start, span.stop)]
    assert sorted(first) == sorted(in_order[:32]) and first != in_order[:32]
