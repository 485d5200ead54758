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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .dataset import IterationSpec, PositionedDataset
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


class Stage(PositionedDataset):
    """A stage on top of one or more ``StreamingDataset``s: the epoch rules and iteration
    come from ``PositionedDataset``; subclasses implement ``positioned``, ``plan``,
    ``has_counts``, ``fingerprint`` and set ``options`` and ``source``."""

    options: StageOptions
    source: str
