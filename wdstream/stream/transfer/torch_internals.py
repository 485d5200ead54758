"""Every use of torch's private DataLoader API, in one place: the overrides of
``DataLoader._get_iterator``, ``_index_sampler`` (a fetch is several batches) and
``drop_last`` (False while workers start), the multiprocessing context the iterator makes its
queues with (``direct_put_context``), the multiprocessing iterator's ``_prefetch_factor``,
``_try_put_index``, ``_worker_result_queue._reader`` and ``_workers``, and
``UntypedStorage._new_shared``. ``missing_internals`` and ``missing_on_iterator`` name
what the installed torch lacks (tests/stream/transfer/test_torch_internals.py runs them)."""

from __future__ import annotations

import inspect
import os
import queue
import sys
from multiprocessing import context as mp_context
from multiprocessing import queues as mp_queues
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

PIPE_BYTES = 1 << 20  # Linux's pipe-max-size default: what an unprivileged process may set


class LoaderInternals:
    """The overrides of torch's private hooks, placed before ``torch.utils.data.DataLoader``
    in ``wdstream.DataLoader``'s bases. The loader provides ``_fetch_sizes()``: the index
    ranges of successive fetches."""

    _starting_workers = False
    _drop_last = False
    # torch's DataLoader's, which comes after this class in the loader's bases
    num_workers: int
    batch_size: int | None
    sampler: Any

    def _fetch_sizes(self) -> Any:
        raise NotImplementedError  # the loader's

    @property
    def drop_last(self) -> bool:
        # torch's fetcher drops a short fetch whole under drop_last; the workers see False
        # and the loader's collate wrapper drops a stream's short last batch itself.
        return self._drop_last and not self._starting_workers

    @drop_last.setter
    def drop_last(self, value: bool) -> None:  # set once, by torch's __init__
        self._drop_last = bool(value)

    def _get_iterator(self, dataset=None):
        """torch's iterator of this loader's batches; with ``dataset`` (one iteration's
        ``IterationView``) in the place of ``self.dataset``, which torch reads once, as the
        iterator starts: that is how each iteration hands its workers their spec."""
        import torch.utils.data

        if self.num_workers:
            # torch seeds numpy.random in every worker it starts: imported once here, forked
            # workers inherit it rather than import it (docs/decisions.md)
            import numpy.random  # noqa: F401
        loader: LoaderInternals | _WithDataset = self
        if self.num_workers or dataset is not None:
            context = direct_put_context(getattr(self, "multiprocessing_context", None)) \
                if self.num_workers else None
            loader = _WithDataset(self, getattr(self, "dataset", None) if dataset is None
                                  else dataset, context)
        self._starting_workers = True
        try:
            # a DataLoader to torch's method: this loader, or it with another dataset
            iterator = torch.utils.data.DataLoader._get_iterator(cast(Any, loader))
        finally:
            self._starting_workers = False
        widen_result_pipe(iterator)
        return iterator

    @property
    def _index_sampler(self):
        if self.batch_size is None:
            return self.sampler
        return self._fetch_sizes()


class _WithDataset:
    """A loader as torch's iterator reads it, with another dataset (and multiprocessing
    context): every other attribute is the loader's."""

    def __init__(self, loader, dataset, context=None):
        self.dataset = dataset
        self._loader = loader
        if context is not None:
            self.multiprocessing_context = context

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class DirectPutQueue(mp_queues.Queue):
    """A multiprocessing queue whose ``put`` in the process that made it pickles and writes
    the item at once, in the caller's thread, rather than waking a feeder thread to do it:
    the training process puts each fetch's request into a worker's index queue, and handing
    the GIL to a feeder thread and back per request costs it more than the write of a few
    dozen bytes (docs/decisions.md). Other processes (the workers putting their batches, which
    may wait for room in the pipe) put through the feeder thread as usual."""

    def put(self, obj, block: bool = True, timeout: float | None = None) -> None:
        if os.getpid() != self._opid:  # type: ignore[attr-defined]  # the maker's pid
            return super().put(obj, block, timeout)
        if self._closed:  # type: ignore[attr-defined]
            raise ValueError(f"Queue {self!r} is closed")
        if not self._sem.acquire(block, timeout):  # type: ignore[attr-defined]
            raise queue.Full
        data = ForkingPickler.dumps(obj)
        lock = self._wlock  # type: ignore[attr-defined]
        if lock is None:
            self._writer.send_bytes(data)  # type: ignore[attr-defined]
            return
        with lock:
            self._writer.send_bytes(data)  # type: ignore[attr-defined]


def direct_put_context(context) -> mp_context.BaseContext:
    """``context`` (a loader's ``multiprocessing_context``: None for the default start
    method) with queues that are ``DirectPutQueue``."""
    if context is None:
        context = mp_context._default_context.get_context()
    elif isinstance(context, str):
        context = mp_context._default_context.get_context(context)
    kind = _DIRECT_CONTEXTS.get(type(context))
    if kind is None:
        def queue(self, maxsize: int = 0):
            return DirectPutQueue(maxsize, ctx=self.get_context())

        kind = _DIRECT_CONTEXTS[type(context)] = type(
            f"DirectPut{type(context).__name__}", (type(context),), {"Queue": queue})
    direct: mp_context.BaseContext = object.__new__(kind)
    direct.__dict__.update(vars(context))
    return direct


_DIRECT_CONTEXTS: dict[type, type] = {}


def widen_result_pipe(iterator) -> None:
    """Let the workers' result pipe hold a whole fetch (1 MiB rather than 64 KiB), so that a
    fetch crosses in one write and one read rather than a wake-up of each side every 64 KiB
    (fewer context switches; docs/benchmarks.md). Best effort: Linux only."""
    queue = getattr(iterator, "_worker_result_queue", None)
    reader = getattr(queue, "_reader", None)
    if reader is None or not sys.platform.startswith("linux"):
        return
    import fcntl

    try:
        fcntl.fcntl(reader.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (OSError, ValueError):
        pass  # a lower pipe-max-size: the default pipe works, only slower


def raise_prefetch(iterator, factor: int, workers: int) -> None:
    """Keep ``factor`` fetches in flight per worker (torch keeps ``prefetch_factor``) if the
    iterator keeps fewer; the missing ones are asked for now."""
    current = getattr(iterator, "_prefetch_factor", None)
    put = getattr(iterator, "_try_put_index", None)
    if not isinstance(current, int) or put is None or current >= factor:
        return
    iterator._prefetch_factor = factor
    for _ in range((factor - current) * workers):
        put()


def worker_pids(iterator) -> list[int]:
    """The process ids of the iterator's workers (none without workers)."""
    return [process.pid for process in getattr(iterator, "_workers", ())]


def new_shared_storage(nbytes: int):
    """A CPU storage of ``nbytes`` allocated in shared memory."""
    import torch

    return torch.UntypedStorage._new_shared(nbytes)


def missing_internals() -> list[str]:
    """The private names of torch's DataLoader this module relies on that the installed torch
    does not have, each with what it must be."""
    import torch
    from torch.utils.data import dataloader

    missing = []
    if not callable(getattr(torch.UntypedStorage, "_new_shared", None)):
        missing.append("torch.UntypedStorage._new_shared (a class method)")
    loader = getattr(dataloader, "DataLoader", None)
    if not callable(getattr(loader, "_get_iterator", None)):
        missing.append("torch.utils.data.DataLoader._get_iterator (a method)")
    if not isinstance(inspect.getattr_static(loader, "_index_sampler", None), property):
        missing.append("torch.utils.data.DataLoader._index_sampler (a property)")
    multi = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
    if multi is None:
        missing.append("torch.utils.data.dataloader._MultiProcessingDataLoaderIter")
    elif not callable(getattr(multi, "_try_put_index", None)):
        missing.append("_MultiProcessingDataLoaderIter._try_put_index (a method)")
    return missing


def missing_on_iterator(iterator) -> list[str]:
    """What a multiprocessing iterator of the installed torch lacks among the attributes this
    module reads or sets."""
    missing = []
    if not isinstance(getattr(iterator, "_prefetch_factor", None), int):
        missing.append("_MultiProcessingDataLoaderIter._prefetch_factor (an int)")
    if not isinstance(getattr(iterator, "_drop_last", None), bool):
        missing.append("_BaseDataLoaderIter._drop_last (a bool copied from the loader)")
    queue = getattr(iterator, "_worker_result_queue", None)
    if queue is None:
        missing.append("_MultiProcessingDataLoaderIter._worker_result_queue")
    elif not callable(getattr(getattr(queue, "_reader", None), "fileno", None)):
        missing.append("_MultiProcessingDataLoaderIter._worker_result_queue._reader "
                       "(a connection with fileno())")
    workers = getattr(iterator, "_workers", None)
    if not isinstance(workers, list) or not all(hasattr(w, "pid") for w in workers):
        missing.append("_MultiProcessingDataLoaderIter._workers (a list of processes)")
    return missing
