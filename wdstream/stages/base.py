"""What the stages over a ``StreamingDataset`` (``Mix``, ``PackedSequences``) share: a stage
fulfils the dataset contract (``wdstream.stream.load.contract``), reads one worker stream of its
inner dataset(s) and yields items with positions of its own, from which it restarts exactly.
On another layout it turns its history into that of the datasets it reads (``inner_history``),
which re-plan their unread samples; positions that differ between ranks are gathered by the
loader (``wdstream.stream.load.ranks``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wdstream.errors import StateError
from wdstream.stream.load.positioned import PositionedDataset
from wdstream.stream.load.ranks import ranks_of
from wdstream.stream.plan.epoch import (
    EPOCH_LIMIT,
    RANKS,
    STREAM_END,
    HistorySegment,
    stream_sizes,
)

# Epochs that cycled passes of an inner dataset read live above every epoch a loader reads,
# so a pass never replays the order of another epoch (see cycle_epoch).
_CYCLE_EPOCHS = EPOCH_LIMIT


def cycle_epoch(epoch: int, cycle: int) -> int:
    """The epoch an inner dataset reads on its ``cycle``-th pass within the outer ``epoch``.

    Pass 0 reads the outer epoch itself (a stage over one dataset reads what the dataset
    alone would). Later passes read an epoch number of their own, unique to (epoch, cycle)
    (a Cantor pairing), so a source restarted in epoch 3 does not repeat epoch 4's order."""
    if cycle == 0:
        return epoch
    n = epoch + cycle - 1
    return _CYCLE_EPOCHS + n * (n + 1) // 2 + cycle - 1


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


def segment_entries(segment: HistorySegment) -> list[list]:
    """Per stream, the positions of every rank (one, if the same on every rank)."""
    entries = []
    for value in segment.consumed:
        ranks = ranks_of(value) if isinstance(value, dict) else [value]
        if not isinstance(ranks, list) or any(r is None for r in ranks):
            raise StateError("the state lacks some ranks' positions: save it with "
                             "loader.state_dict() called on every rank")
        entries.append(ranks)
    return entries


def inner_history(history: Sequence[HistorySegment], extract: Callable[[object, int], tuple]
                  ) -> tuple[int, tuple[HistorySegment, ...]]:
    """The pass of an inner dataset in progress after the segments ``history`` of a stage,
    and the segments of that pass the inner dataset has to leave out (its own history).

    ``extract(position, base)`` gives (pass, inner position consumed) for one stream's
    position, ``base`` being the pass every stream started the segment at; a pass None means
    read to its end. The new segment continues the pass furthest behind: streams already
    past it count it as read to their end, and its earlier segments stay relevant only if
    no stream left it."""
    base = 0
    segments: tuple[HistorySegment, ...] = ()
    for segment in history:
        entries = [[extract(value, base) for value in ranks]
                   for ranks in segment_entries(segment)]
        passes = [p for ranks in entries for p, _ in ranks if p is not None]
        current = min(passes, default=base)
        consumed = []
        for raw, ranks in zip(segment.consumed, entries, strict=True):
            values = [c if p == current else STREAM_END for p, c in ranks]
            consumed.append({RANKS: values} if isinstance(raw, dict) else values[0])
        if current != base:
            segments = ()
        segments += (HistorySegment(segment.world, segment.workers, segment.batch_size,
                             tuple(consumed)),)
        base = current
    return base, segments


def remaining_items(per_epoch: int, history: Sequence[HistorySegment], count) -> int:
    """Of a fixed ``per_epoch`` items, those not delivered in the segments ``history``;
    ``count(position)`` is the items a stream's position stands for (STREAM_END: its whole
    stream)."""
    left = per_epoch
    for segment in history:
        sizes = fixed_plan(left, segment.world, segment.workers).stream_samples
        delivered = 0
        for k, ranks in enumerate(segment_entries(segment)):
            done = [sizes[k] if v == STREAM_END else min(count(v), sizes[k]) for v in ranks]
            delivered += sum(done) if len(ranks) > 1 else done[0] * segment.world
        left -= delivered
    return max(left, 0)


class Stage(PositionedDataset):
    """A stage on top of one or more ``StreamingDataset``s: the epoch rules and iteration
    come from ``PositionedDataset``; subclasses implement ``positioned``, ``plan``,
    ``has_counts``, ``fingerprint`` and set ``options`` and ``source``."""

    options: StageOptions
    source: str

    @property
    def positions_per_rank(self) -> bool:
        """Whether positions differ between ranks (then the loader gathers them into its
        state); a subclass may set it as a class attribute."""
        return False

    @property
    def elastic(self) -> bool:
        """Whether a state resumes on another layout: every source has sample counts."""
        return all(d.has_counts and getattr(d, "elastic", True) for d in self.inner())

    def inner(self) -> list:
        """The datasets this stage reads."""
        raise NotImplementedError

    def check_position(self, position, world: int = 1) -> None:
        """Refuse (``StateError``) a position of a state that ``positioned`` cannot start
        from: this stage's own (``check_own``), or those of the ``world`` ranks of its layout,
        gathered (None for a rank whose position is missing)."""
        if not isinstance(position, dict):
            self.check_own(position)
            return
        ranks = ranks_of(position)
        if not isinstance(ranks, list) or len(ranks) != world:
            raise StateError(f"{self.source}: not the positions of {world} ranks: "
                             f"{position!r:.80}")
        for value in ranks:
            if value is not None:
                self.check_own(value)

    def check_own(self, position) -> None:
        """Refuse one rank's position of this stage that it cannot start from; a stage
        checks its own shape here (this one accepts any)."""


def check_inner(dataset, position) -> None:
    """Refuse a position of ``dataset``, read by a stage, that it cannot start from."""
    check = getattr(dataset, "check_position", None)
    if check is not None:
        check(position)
