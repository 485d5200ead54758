"""The dataset contract: what ``wdstream.DataLoader`` needs of a dataset, described here once.

``StreamingDataset`` and the stages built on it (``Mix``, ``PackedSequences``) fulfil it
through ``wdstream.stream.load.positioned.PositionedDataset``; ``Trackable`` is the check the loader
makes of what it is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from wdstream.stream.load.context import StreamContext
from wdstream.stream.plan.epoch import HistorySegment


@dataclass(frozen=True)
class IterationSpec:
    """What one iteration reads: the epoch, the layout, the segments of this epoch already
    consumed under other layouts, where each stream starts, and which stream worker 0 takes
    (``rotation``: after a resume, the stream whose batch comes next). ``context``: where the
    stream reports (its reader counters, its positions); a stage hands it on in the specs it
    gives the datasets it reads."""

    epoch: int
    rank: int
    world: int
    workers: int
    history: tuple[HistorySegment, ...] = ()
    start: tuple[int, ...] = ()
    rotation: int = 0
    batch_size: int = 0
    # under wdstream.DataLoader with workers and the default collate: large raw payloads stay
    # in local files for the main process to map, or go straight into the shared memory the
    # batches travel in (wdstream.stream.transfer.shm)
    shared_payloads: bool = False
    context: StreamContext | None = field(default=None, compare=False, repr=False)


class TrackableOptions(Protocol):
    """What the loader reads of a dataset's ``options``."""

    @property
    def seed(self) -> int: ...


@runtime_checkable
class Trackable(Protocol):
    """A dataset ``wdstream.DataLoader`` can track and resume.

    Iteration: each worker reads one stream. ``positioned(spec, stream, start)`` yields the
    stream's items from position ``start`` as ``(item, position after it)`` pairs. A position
    is a JSON value (a sample count for ``StreamingDataset``, lists of ints for stages), never
    mutated once yielded (with ``num_workers=0`` the loader keeps the very object); a fresh
    stream starts at ``0``. The loader stores each stream's position in ``state_dict()`` and
    hands it back as ``spec.start[stream]``. Each iteration of the loader reads an
    ``IterationView`` of the dataset, which its workers receive: the view's iteration is
    ``dataset.iterate(spec)`` (an ``IterationSpec``, with a ``context``), the items of the
    stream of the worker iterating it. The dataset counts what its readers retried or skipped
    in ``spec.context.stats``.

    Sizes: ``plan(epoch, world, workers, history)`` gives per-stream sizes of an epoch
    (``stream_samples``, ``rank_samples``, ``remainder_samples``) when ``has_counts``, and raises
    a ``WdstreamError`` when they cannot be known. Epochs: ``begin_epoch()`` starts the next
    one and returns it, ``next_epoch()`` tells it, ``set_epoch(n)`` chooses it. A state is
    checked against ``fingerprint()`` (the data and the options that shape the order) and
    ``options.seed``; ``options.remainder`` is named in the loader's log line, ``source`` in
    its errors.

    Elastic resume: the loader records the positions of a layout it leaves as a
    ``HistorySegment`` of the epoch's history (``spec.history``); the dataset leaves what they
    consumed out of its plan and lays the rest over the new layout.

    Optional: ``elastic`` (whether a state resumes on another layout; by default, when every
    position is a sample count), ``positions_per_rank`` (positions differ between ranks: the
    loader gathers every rank's into its state, ``stream.load.ranks.gather_positions``),
    ``accounting(positions, history, rank)`` (per-source counts for ``loader.stats["sources"]``),
    ``check_position(position, world)`` (raises ``StateError`` for a position of a loaded
    state, of a layout of ``world`` ranks, that ``positioned`` cannot start from;
    ``wdstream.stream.load.state`` calls it on every position and history entry before
    anything is planned) and ``counts_setting`` (what gives a dataset without ``has_counts``
    its sizes, named when a resume on another layout needs them; by default "a manifest";
    ``resumes_unsized``: True for a stage that resumes on another layout without them, its
    streams reading what the old layout left, however many items that makes).
    """

    @property
    def source(self) -> object: ...
    @property
    def options(self) -> TrackableOptions: ...
    @property
    def has_counts(self) -> bool: ...

    def positioned(self, spec: IterationSpec, stream: int, start): ...
    def iterate(self, spec: IterationSpec): ...
    def plan(self, epoch: int, world: int, workers: int, history=()): ...
    def begin_epoch(self) -> int: ...
    def next_epoch(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def fingerprint(self) -> str: ...


class IterationView:
    """One iteration of ``wdstream.DataLoader`` over ``dataset``: what torch hands its
    workers in place of the dataset, so that each reads the stream ``spec`` gives it. The
    user's dataset is left as it was."""

    def __init__(self, dataset: Trackable, spec: IterationSpec):
        self.dataset = dataset
        self.spec = spec

    def __iter__(self):
        return self.dataset.iterate(self.spec)


def world_info() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else the RANK and
    WORLD_SIZE variables torchrun sets, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
