"""The private parts of torch's DataLoader that wdstream.DataLoader relies on
(``wdstream.stream.transfer.torch_internals``) are still there, and still work as relied on: a torch
upgrade that changes one fails here, naming it."""

from __future__ import annotations

import torch
import torch.utils.data

import wdstream
from tests.support.shard_data import write_dataset
from wdstream.stream.transfer import torch_internals


class Counting(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from range(10)


def test_the_private_names_are_there():
    missing = torch_internals.missing_internals()
    assert not missing, f"torch {torch.__version__} lacks: {', '.join(missing)}"


def test_a_live_iterator_has_what_is_read_and_set():
    loader = torch.utils.data.DataLoader(Counting(), batch_size=2, num_workers=1)
    iterator = loader._get_iterator()
    try:
        missing = torch_internals.missing_on_iterator(iterator)
        assert not missing, f"torch {torch.__version__} lacks: {', '.join(missing)}"
        assert torch_internals.worker_pids(iterator), "_workers lists no worker process"
    finally:
        iterator._shutdown_workers()


def test_the_overrides_take_effect(tmp_path, single_rank):
    """The workers see drop_last False while the loader keeps True; fetches are drawn from
    the loader's _index_sampler; more fetches can be put in flight."""
    write_dataset(tmp_path, [12])
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False)
    loader = wdstream.DataLoader(ds, batch_size=3, num_workers=1, drop_last=True)
    iterator = loader._get_iterator()
    try:
        assert loader.drop_last is True
        assert iterator._drop_last is False, "the iterator no longer copies loader.drop_last"
        assert list(next(iterator._sampler_iter)) == [0, 1, 2], \
            "the iterator no longer draws its fetches from DataLoader._index_sampler"
        before = iterator._prefetch_factor
        torch_internals.raise_prefetch(iterator, before + 1, 1)
        assert iterator._prefetch_factor == before + 1
    finally:
        iterator._shutdown_workers()
