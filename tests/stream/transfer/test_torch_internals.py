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


def _put_from_child(queue) -> None:
    queue.put(("child", [1, 2]))


def test_index_requests_are_written_without_a_feeder_thread(tmp_path, single_rank):
    """The iterator's queues are made with the loader's context, direct_put_context's: the
    training process writes each request straight into a worker's index pipe (no feeder
    thread to wake), the batches still come in order, and a queue's put in another process
    goes through the feeder thread as usual."""
    import multiprocessing
    import threading

    from wdstream.stream.load.contract import IterationView

    write_dataset(tmp_path, [40, 30])
    dataset = wdstream.StreamingDataset(str(tmp_path), shuffle=False)
    loader = wdstream.DataLoader(dataset, batch_size=4, num_workers=2)
    before = {t.ident for t in threading.enumerate()}
    iterator = loader._get_iterator(IterationView(dataset, loader._begin()))
    try:
        keys = []
        for _ in range(6):
            keys += [k for _, batches, *_ in [next(iterator)] for _, b in batches
                     for k in b["__key__"]]
        queues = iterator._index_queues
        assert all(type(q) is torch_internals.DirectPutQueue for q in queues), \
            "the iterator no longer makes its index queues with multiprocessing_context.Queue"
        assert all(q._thread is None for q in queues)
        assert {t.ident for t in threading.enumerate()} == before  # no feeder thread here
        assert len(keys) == len(set(keys)) > 12
    finally:
        iterator._shutdown_workers()
    assert loader.multiprocessing_context is None  # the loader's own stays as given
    # another process's put: the feeder thread's, read back here
    context = torch_internals.direct_put_context("fork")
    queue = context.Queue()
    child = context.Process(target=_put_from_child, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == ("child", [1, 2])
    child.join(60)
    assert child.exitcode == 0 and type(queue) is torch_internals.DirectPutQueue
    queue.put("here")  # this process's put, read back as any item
    assert queue.get(timeout=10) == "here" and queue._thread is None
    assert isinstance(context, multiprocessing.context.ForkContext)
