"""``PositionedDataset``: what ``StreamingDataset`` and the stages built on it (``Mix``,
``PackedSequences``) share to fulfil the dataset contract (``wdstream.stream.load.contract``): the
epoch rules, and iteration as one worker stream whose items carry positions.

Iterators left open when the interpreter exits are closed while it still can: an ``atexit``
hook closes them before module teardown, so their clean-up (closing shard bodies, unmapping
shared memory) runs normally rather than against module globals already set to None
(``closed_at_exit``)."""

from __future__ import annotations

import abc
import atexit
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch.utils.data

from wdstream.errors import InputError, UnsizedError, WdstreamError
from wdstream.stream.load.context import StreamContext
from wdstream.stream.load.contract import IterationSpec, world_info
from wdstream.stream.plan.epoch import HistorySegment
from wdstream.stream.transfer.batching import tune_worker_process


class PositionedDataset(torch.utils.data.IterableDataset):
    """A torch ``IterableDataset`` that fulfils ``wdstream.stream.load.contract.Trackable``.

    Subclasses implement ``positioned(spec, stream, start)``, ``plan``, ``has_counts`` and
    ``fingerprint``, and set ``options`` (with ``seed``) and ``source``; this class gives the
    epoch rules, ``len()`` and iteration, under ``wdstream.DataLoader`` or on its own.
    """

    _epoch = 0
    _epoch_explicit = False
    _started = False
    _live: tuple[IterationSpec, int] | None = None  # the stream iterated in this process
    _stream_resume: dict | None = None  # from load_state_dict (torchdata protocol)

    # ---- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration read epoch ``epoch`` (otherwise each new iteration reads
        the next epoch)."""
        self._epoch = int(epoch)
        self._epoch_explicit = True

    def next_epoch(self) -> int:
        """The epoch the next iteration will read."""
        return self._epoch + (1 if self._started and not self._epoch_explicit else 0)

    def begin_epoch(self) -> int:
        self._epoch = self.next_epoch()
        self._started, self._epoch_explicit = True, False
        return self._epoch

    # ---- what subclasses provide --------------------------------------------------------
    @property
    @abc.abstractmethod
    def has_counts(self) -> bool:
        """Whether ``plan()`` can size the epoch's streams."""

    @abc.abstractmethod
    def plan(self, epoch: int, world: int, workers: int, history: Sequence[HistorySegment] = ()):
        """Per-stream sizes of an epoch; see ``wdstream.stream.load.contract.Trackable``."""

    @abc.abstractmethod
    def positioned(self, spec: IterationSpec, stream: int, start) -> Iterator[tuple]:
        """Stream ``stream``'s items from position ``start``, each with the position after
        it; see ``wdstream.stream.load.contract.Trackable``."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """Identifies the data and the options that shape the order, for resume states."""

    @staticmethod
    def _check_stream_state(state: dict, world: int, workers: int, worker: int) -> None:
        """Refuse a state loaded into ``_stream_resume`` that is not this stream's (the
        dataset that loads one checks it)."""
        raise NotImplementedError

    def positioned_chunks(self, spec: IterationSpec, stream: int, start
                          ) -> Iterator[tuple[list, Sequence]]:
        """``positioned`` as lists: ``(items, the position after each)``, one item per list
        here; a dataset whose items come in lists anyway (``StreamingDataset``) gives them
        as they are."""
        for item, position in self.positioned(spec, stream, start):
            yield [item], (position,)

    def __len__(self) -> int:
        """Items each rank reads per epoch (``len(loader)`` gives its batches)."""
        _rank, world = world_info()
        try:
            return self.plan(self.next_epoch(), world, 1).rank_samples
        except WdstreamError as error:  # a TypeError: what len() of an unsized object raises
            raise UnsizedError(str(error)) from None

    # ---- iteration ----------------------------------------------------------------------
    @property
    def stream_context(self) -> StreamContext | None:
        """The reports (reader counters, position) of the stream this process iterates, or
        iterated last; None before. Under ``wdstream.DataLoader``, ``loader.stats`` sums them
        over the workers."""
        return None if self._live is None else self._live[0].context

    def __iter__(self) -> Iterator:
        """Iterated directly: a plain loop or a plain torch ``DataLoader``."""
        spec, worker = self._direct_spec()
        return self.iterate(spec, worker)

    def iterate(self, spec: IterationSpec, worker: int | None = None) -> Iterator:
        """The items of the stream ``worker`` reads in the iteration ``spec`` describes
        (``worker``: this DataLoader worker's id, by default), as ``wdstream.DataLoader`` asks
        for them through its ``IterationView``; without a context in ``spec`` (iterated
        directly), the items alone."""
        if worker is None:
            info = torch.utils.data.get_worker_info()
            worker = info.id if info is not None else 0
        stream = (spec.rotation + worker) % spec.workers
        start = spec.start[stream] if spec.start else 0
        by_loader = spec.context is not None
        context = spec.context if spec.context is not None else StreamContext()
        if not by_loader:
            spec = replace(spec, context=context)
        context.position = start
        self._live = (spec, stream)
        chunks = self.positioned_chunks(spec, stream, start)
        if by_loader:
            if torch.utils.data.get_worker_info() is not None:
                tune_worker_process()
            return closed_at_exit(context.with_trail(chunks))
        return closed_at_exit(context.with_positions(chunks))

    def _direct_spec(self) -> tuple[IterationSpec, int]:
        """The spec of an iteration without ``wdstream.DataLoader``. Only the main process
        can advance the epoch; in workers call set_epoch() each epoch."""
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        if info is not None and info.dataset is not self:
            _check_outer_dataset(info)
        rank, world = world_info()
        workers = info.num_workers if info is not None else 1
        resume, self._stream_resume = self._stream_resume, None
        if resume is not None:
            self._check_stream_state(resume, world, workers, worker)
            self.set_epoch(resume["epoch"])
        epoch = self.begin_epoch() if info is None or resume is not None else self._epoch
        start = [0] * workers
        if resume is not None:
            start[worker] = resume["position"]
        return IterationSpec(epoch, rank, world, workers, start=tuple(start)), worker


def _check_outer_dataset(info) -> None:
    """Iterated inside another dataset in a DataLoader worker, this dataset reads the worker's
    share of its streams: right for a wrapper that iterates it in every worker, a silent loss
    under a Hugging Face ``datasets.IterableDataset``, which already gives each worker only
    some of its shards (a one-shard ``from_generator`` runs in worker 0 alone)."""
    outer = type(info.dataset)
    if outer.__module__.split(".")[0] == "datasets":
        raise InputError(
            f"a wdstream dataset iterated inside a datasets.{outer.__name__} in DataLoader "
            f"worker {info.id} of {info.num_workers} would read only that worker's share of "
            "the shards datasets gave it, and lose the rest: convert it with "
            "wdstream.integrations.hf_datasets.to_iterable_dataset(ds, num_workers="
            f"{info.num_workers}) (one shard per wdstream stream), or use wdstream.DataLoader")


class _OpenIterators:
    """The registry of one process. Iterators are held weakly: one dropped half-way is
    finalized by the garbage collector as usual and leaves the registry by itself."""

    def __init__(self):
        self.iterators: weakref.WeakSet = weakref.WeakSet()
        self.hooked = False

    def add(self, iterator):
        if not self.hooked:
            atexit.register(self.close_all)
            self.hooked = True
        self.iterators.add(iterator)
        return iterator

    def close_all(self) -> None:
        for iterator in list(self.iterators):
            try:
                iterator.close()
            except Exception:  # exiting: a failed clean-up has nowhere to go
                pass
        self.iterators.clear()


# The interpreter's exit is process-wide, and so is what must be closed before it.
_open = _OpenIterators()


def closed_at_exit(iterator):
    """Return ``iterator`` (a generator), registered to be closed before the interpreter
    tears its modules down."""
    return _open.add(iterator)
