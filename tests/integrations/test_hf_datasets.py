"""wdstream datasets as Hugging Face ``datasets.IterableDataset`` (the real package): one shard
per wdstream stream, the rank and worker split kept, ``set_epoch``, ``.map``, exact resume
through ``state_dict``; and no silent loss inside another ``IterableDataset``'s workers."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch.utils.data

import wdstream
from tests.support.shard_data import all_keys, write_dataset
from wdstream.integrations.hf_datasets import to_iterable_dataset

if importlib.util.find_spec("datasets") is None:  # found, not imported: it takes seconds
    pytest.skip("Hugging Face datasets is not installed", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("single_rank")

COUNTS = [30, 7, 25, 18, 20]  # 100 samples


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    source = str(tmp_path_factory.mktemp("hf") / "data")
    write_dataset(source, COUNTS)
    return source


def keys_of(examples) -> list[str]:
    return [example["__key__"] for example in examples]


def in_workers(dataset, workers: int) -> list[str]:
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    return keys_of(loader)


def test_shards_are_the_streams_and_workers_read_each_once(source):
    ds = wdstream.StreamingDataset(source, seed=3, shuffle_window=8)
    converted = to_iterable_dataset(ds, num_workers=2)
    assert converted.num_shards == 2
    for workers in (2, 1, 3):  # as planned, fewer (a worker reads 2 streams), more (one idles)
        keys = in_workers(converted, workers)
        assert len(keys) == 100 and set(keys) == all_keys(COUNTS), workers
    reference = wdstream.DataLoader(ds, batch_size=None, num_workers=2)
    assert in_workers(converted, 2) == keys_of(reference)  # the very order of the loader


def test_split_dataset_by_node_gives_each_rank_its_wdstream_share(source):
    from datasets.distributed import split_dataset_by_node

    ds = wdstream.StreamingDataset(source, seed=3, shuffle_window=8)
    converted = to_iterable_dataset(ds, num_workers=2, world=2)
    assert converted.num_shards == 4
    seen = []
    for rank in range(2):
        keys = in_workers(split_dataset_by_node(converted, rank=rank, world_size=2), 2)
        os.environ.update(RANK=str(rank), WORLD_SIZE="2")
        try:
            fresh = wdstream.StreamingDataset(source, seed=3, shuffle_window=8)  # epoch 0
            expected = keys_of(wdstream.DataLoader(fresh, batch_size=None, num_workers=2))
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
        assert len(keys) == 50, (rank, len(keys), len(expected))
        assert keys == expected
        seen += keys
    assert set(seen) == all_keys(COUNTS)


def test_set_epoch_reshuffles_and_map_works(source):
    ds = wdstream.StreamingDataset(source, seed=3, shuffle_window=8)
    converted = to_iterable_dataset(ds).map(lambda example: {"n": example["json"]["index"]})
    first = list(converted)
    assert all(example["n"] == example["json"]["index"] for example in first)
    assert keys_of(converted) == keys_of(first)  # the same epoch, the same order
    converted.set_epoch(1)
    second = keys_of(converted)
    assert second != keys_of(first) and set(second) == all_keys(COUNTS)
    converted.set_epoch(2)
    assert keys_of(converted) not in (second, keys_of(first))


def test_state_dict_resumes_exactly(source):
    ds = wdstream.StreamingDataset(source, seed=3, shuffle_window=8)
    converted = to_iterable_dataset(ds, num_workers=2)
    converted.set_epoch(1)
    full = keys_of(converted)
    head = []
    for example in converted:
        head.append(example["__key__"])
        if len(head) == 63:  # inside the second shard (stream)
            break
    state = converted.state_dict()
    again = to_iterable_dataset(wdstream.StreamingDataset(source, seed=3, shuffle_window=8),
                                num_workers=2)
    again.set_epoch(1)
    again.load_state_dict(state)
    assert head + keys_of(again) == full


def _from(ds):
    yield from ds


def test_inside_from_generator_with_workers_it_says_how_instead_of_losing_half(source):
    import datasets as hf

    ds = wdstream.StreamingDataset(source, seed=3)
    wrapped = hf.IterableDataset.from_generator(_from, gen_kwargs={"ds": ds})
    assert len(in_workers(wrapped, 0)) == 100  # no worker: the whole dataset
    try:
        in_workers(wrapped, 2)
    except wdstream.errors.InputError as error:
        assert "to_iterable_dataset" in str(error), error
    else:
        raise AssertionError("no error: the workers read part of the dataset")

