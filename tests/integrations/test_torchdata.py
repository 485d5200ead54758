"""torchdata's ``StatefulDataLoader`` over a ``StreamingDataset``: the dataset implements the
``state_dict`` / ``load_state_dict`` protocol per stream, so stopping, saving and resuming in a
new loader continues exactly where the first one stopped."""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("torchdata")

from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

import wdstream  # noqa: E402
from tests.support.shard_data import all_keys, batch_keys, take, write_dataset  # noqa: E402
from wdstream.errors import StateError  # noqa: E402

COUNTS = [13, 40, 7, 25, 3, 31, 18, 9]  # uneven shards, 146 samples
BATCH = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torchdata")
    write_dataset(folder, COUNTS)
    return str(folder)


pytestmark = pytest.mark.usefixtures("single_rank")


def make(data, workers, seed=3, window=5):
    ds = wdstream.StreamingDataset(data, seed=seed, shuffle_window=window)
    return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers,
                              collate_fn=wdstream.collate)


keys_of = batch_keys


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_uninterrupted_epoch_reads_every_sample_once(data, workers):
    batches = keys_of(make(data, workers))
    assert Counter(k for b in batches for k in b) == Counter(all_keys(COUNTS))
    assert batches == keys_of(make(data, workers))  # deterministic


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_stop_save_load_finish_equals_uninterrupted(data, workers):
    reference = keys_of(make(data, workers))
    n = len(reference)
    # the start, inside the first shuffle window, the middle, the last batch, the very end
    for stop in sorted({0, 1, 2, 3, 7, n // 2, n - 1, n}):
        first = make(data, workers)
        before = take(first, stop)
        state = first.state_dict()
        state = json.loads(json.dumps(state))  # as if through a JSON checkpoint
        second = make(data, workers)
        second.load_state_dict(state)
        after = keys_of(second)
        assert before + after == reference, f"stop {stop} of {n}"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_resume_twice(data, workers):
    reference = keys_of(make(data, workers))
    first = make(data, workers)
    part1 = take(first, 5)
    second = make(data, workers)
    second.load_state_dict(first.state_dict())
    part2 = take(second, 9)
    third = make(data, workers)
    third.load_state_dict(second.state_dict())
    assert part1 + part2 + keys_of(third) == reference


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_inside_a_later_epoch(data, workers):
    """The state carries the epoch: a loader whose dataset is still at epoch 0 resumes a
    stream of epoch 1. (Under a plain or stateful torch DataLoader with workers the epoch
    only moves with ``set_epoch``.)"""
    def epoch_one():
        loader = make(data, workers)
        loader.dataset.set_epoch(1)
        return loader

    reference = keys_of(epoch_one())
    assert reference != keys_of(make(data, workers))  # epoch 1 has another order
    first = epoch_one()
    before = take(first, 6)
    second = make(data, workers)
    second.load_state_dict(first.state_dict())
    assert before + keys_of(second) == reference


def test_state_of_another_dataset_is_refused(data):
    # num_workers=0 only: with workers the StateError is raised in the workers and reaches
    # the loop all the same, but torchdata 0.11 then takes 5 s per worker to shut them down
    # (any dataset whose load_state_dict raises does that).
    first = make(data, 0)
    take(first, 3)
    state = first.state_dict()
    other = make(data, 0, seed=4)
    with pytest.raises(StateError, match="another dataset"):
        other.load_state_dict(state)
        keys_of(other)

