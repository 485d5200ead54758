"""What pipeline stages on top of a ``StreamingDataset`` (``Mix``, ``PackedSequences``) share.

A stage is a torch ``IterableDataset`` that reads one worker stream of its inner dataset(s)
through ``positioned(spec, stream, start)`` and yields ``(item, position_after)`` pairs of its
own. Its positions are JSON values (lists of ints) from which it restarts exactly, so
``wdstream.DataLoader`` tracks and resumes a stage the way it does a plain dataset: the loader
stores each stream's position in ``state_dict()`` and hands it back as ``spec.start[stream]``.
A fresh stream starts at position ``0``.

The loader also needs, and a stage provides: ``plan()`` (when ``has_counts``), the epoch
methods, ``fingerprint()``, ``options.seed``, ``options.remainder``, ``spec`` and ``source``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch.utils.data

from .dataset import IterationSpec, with_positions, worker_position, world_info
from .errors import StateError
from .plan import Segment, stream_sizes

# Epochs that cycled passes of an inner dataset read live above every real epoch number, so a
# pass never replays the order of another epoch (see cycle_epoch).
_CYCLE_EPOCHS = 1 << 40


def cycle_epoch(epoch: int, cycle: int) -> int:
    """The epoch an inner dataset reads on its ``cycle``-th pass within the outer ``epoch``.

    Pass 0 reads the outer epoch itself (a stage over one dataset reads what the dataset
    alone would). Later passes read an epoch number of their own, unique to (epoch, cycle)
    (a Cantor pairing), so a source restarted in epoch 3 does not repeat epoch 4's order."""
    if cycle == 0:
        return epoch
    n = epoch + cycle - 1
    return _CYCLE_EPOCHS + n * (n + 1) // 2 + cycle - 1


def generator(*words: int) -> np.random.Generator:
    """A generator seeded by every word (SeedSequence mixes them all)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(w) for w in words])))


@dataclass(frozen=True)
class StageOptions:
    """What ``wdstream.DataLoader`` reads of ``dataset.options``: the seed it checks on resume,
    and the remainder policy it names in its log line."""

    seed: int
    remainder: str = "drop"


@dataclass(frozen=True)
class StagePlan:
    """Items per worker stream of one rank in an epoch, in the shape of ``EpochPlan`` that
    ``wdstream.DataLoader`` reads (``len(loader)``, which streams are exhausted)."""

    stream_samples: list[int]
    remainder_samples: int = 0

    @property
    def rank_samples(self) -> int:
        return sum(self.stream_samples)


def fixed_plan(per_epoch: int, world: int, workers: int) -> StagePlan:
    """``per_epoch`` items split over ranks (``per_epoch // world`` each: equal batches per
    rank) and over a rank's streams as the epoch plan does."""
    rank_items = per_epoch // world
    return StagePlan(stream_sizes(rank_items, workers), per_epoch - rank_items * world)


def check_layout(spec: IterationSpec, history: Sequence[Segment] = ()) -> None:
    """Stages resume on the layout they were saved with; the loader refuses another layout
    for positions that are not sample counts, and this guards direct callers."""
    if spec.history or history:
        raise StateError("mixing and packing stages cannot resume on another layout (world "
                         "size, workers or batch size): resume with the one they were saved with")


class Stage(torch.utils.data.IterableDataset):
    """Epoch bookkeeping and iteration shared by stages; subclasses implement ``positioned``,
    ``plan``, ``has_counts``, ``fingerprint`` and set ``options`` and ``source``."""

    options: StageOptions
    source: str

    def __init__(self):
        super().__init__()
        self._epoch = 0
        self._epoch_explicit = False
        self._started = False
        self.spec: IterationSpec | None = None  # set by wdstream.DataLoader before iterating

    # ---- epochs (the same rules as StreamingDataset) --------------------------------------
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

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def has_counts(self) -> bool:
        raise NotImplementedError

    def plan(self, epoch: int, world: int, workers: int,
             history: Sequence[Segment] = ()) -> StagePlan:
        raise NotImplementedError

    def __len__(self) -> int:
        """Items each rank reads per epoch with one stream per rank (``len(loader)`` counts
        the real layout's streams)."""
        if not self.has_counts:
            raise TypeError(f"{self.source}: the number of items per epoch is unknown")
        _rank, world = world_info()
        return self.plan(self.next_epoch(), world, 1).rank_samples

    # ---- iteration ------------------------------------------------------------------------
    def positioned(self, spec: IterationSpec, stream: int, start) -> Iterator[tuple[object, object]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[object]:
        # Resolve the spec now, not in a generator body: the loader clears it right after
        # creating its iterator.
        spec, worker = self._current_spec()
        stream = (spec.rotation + worker) % spec.workers
        start = spec.start[stream] if spec.start else 0
        worker_position.value = start
        return with_positions(self.positioned(spec, stream, start))

    def _current_spec(self) -> tuple[IterationSpec, int]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        if self.spec is not None:
            return self.spec, worker
        # Without wdstream.DataLoader (a plain loop or torch DataLoader): only the main
        # process can advance the epoch; in workers call set_epoch() each epoch.
        rank, world = world_info()
        workers = info.num_workers if info is not None else 1
        epoch = self.begin_epoch() if info is None else self._epoch
        return IterationSpec(epoch, rank, world, workers), worker
