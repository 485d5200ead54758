"""``wdstream.Mix``: samples drawn from several datasets by weight. Each worker stream reads the
same stream of every source and draws from them in blocks of source choices fixed by
(seed, epoch, stream, block), the same on every rank, so ranks get equal batches and a
resume computes one block. A position is ``[draws, pass_0, position_0, pass_1, position_1,
...]`` then the documents drawn from each source (see ``mix_stream.MixStream``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np

from wdstream.errors import InputError, StateError, UnsizedError
from wdstream.options import CHOICES, choice, integer
from wdstream.stages.base import (
    Stage,
    StageOptions,
    StagePlan,
    check_inner,
    cycle_epoch,
    fixed_plan,
    inner_history,
    remaining_items,
)
from wdstream.stages.choices import BLOCK, block_choices, stream_length
from wdstream.stages.mix_stream import MixStream
from wdstream.stages.schedule import make_schedule, normalise
from wdstream.stream.load.contract import IterationSpec
from wdstream.stream.load.ranks import rank_entry, ranks_of
from wdstream.stream.plan.epoch import STREAM_END, HistorySegment, is_count

STOP_RULES = CHOICES["stop"]


def _checked_datasets(datasets: Sequence) -> list:
    datasets = list(datasets)
    if not datasets:
        raise InputError("Mix needs at least one dataset")
    for index, dataset in enumerate(datasets):
        if not hasattr(dataset, "positioned"):
            raise InputError(f"Mix: dataset {index} is a {type(dataset).__name__}, not a "
                             "wdstream.StreamingDataset or stage")
    return datasets


def _checked_schedule(schedule, weights, stop: str, count: int):
    """The ``Schedule`` of ``schedule``, or None when the mixture has fixed ``weights``."""
    if schedule is None:
        return None
    if weights is not None:
        raise InputError("Mix: give weights or a schedule, not both")
    if stop == "cycle":
        raise InputError("Mix: a schedule needs stop='fixed' or 'first_exhausted' "
                         "(under 'cycle' a source left out by a late stage never ends)")
    return make_schedule(schedule, count)


def _check_samples_per_epoch(samples_per_epoch, stop: str) -> None:
    if (stop == "fixed") != (samples_per_epoch is not None):
        raise InputError("Mix: samples_per_epoch is required with stop='fixed' and "
                         "only used with it")
    if samples_per_epoch is not None and (
            isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, int)
            or samples_per_epoch < 1):
        raise InputError(f"Mix: samples_per_epoch must be a positive integer, not "
                         f"{samples_per_epoch!r}")


def _checked_names(names, datasets: list) -> list[str]:
    """``names``, or the sources' URLs (numbered if one is read twice)."""
    if names is None:
        names = [str(d.source) for d in datasets]
        if len(set(names)) != len(names):  # the same data twice, with other options
            names = [f"{name}#{index}" for index, name in enumerate(names)]
    if len(names) != len(datasets) or len(set(names)) != len(names) \
            or not all(isinstance(name, str) for name in names):
        raise InputError("Mix: names must give one distinct string per dataset")
    return list(names)

class Mix(Stage):
    """Samples drawn from ``datasets`` by weight, in a sequence of source choices fixed by
    (seed, epoch, stream, draw): deterministic, resumable, equal batches on every rank. Each
    sample (a dict) gets ``__source__``, its source's name (a string, which the default
    collate keeps as a list). A restarted source reads a new order: its pass p of epoch e
    reads the source's epoch ``cycle_epoch(e, p)``. ``len(mix)`` is known when the sources
    have manifests, or with ``"fixed"``.

    Args:
        datasets (list): ``StreamingDataset``s or other stages.
        weights (list[float] | None): one weight per dataset (normalised); or give
            ``schedule``.
        seed (int, default 0): the seed of the source choices.
        stop (str, default "first_exhausted"): when a stream's epoch ends:
            ``"first_exhausted"`` at the first draw whose source has no sample left;
            ``"cycle"`` once every source with a positive weight was read to its end
            (smaller sources restart); ``"fixed"`` after ``samples_per_epoch`` (sources
            restart).
        samples_per_epoch (int | None): under ``"fixed"`` only (and required there): samples
            per epoch in all, ``samples_per_epoch // world`` per rank.
        names (list[str] | None): one distinct name per dataset; default their URLs.
        schedule (list | callable | None): weights changing over the epoch: stages
            ``{"start": samples drawn over the job, "weights": [...]}`` (or
            ``"start_tokens"``, counted by a ``PackedSequences`` over the mixture), or a pure
            function ``samples drawn -> weights`` (see ``wdstream.stages.schedule``).
    """

    def __init__(self, datasets: Sequence, weights: Sequence[float] | None = None, *,
                 seed: int = 0, stop: str = "first_exhausted",
                 samples_per_epoch: int | None = None, names: Sequence[str] | None = None,
                 schedule=None):
        super().__init__()
        self.datasets = _checked_datasets(datasets)
        choice("Mix", "stop", stop)
        seed = integer("Mix", "seed", seed, minimum=0)
        self.schedule = _checked_schedule(schedule, weights, stop, len(self.datasets))
        self.weights = normalise(weights, len(self.datasets)) if self.schedule is None \
            else self.schedule.weights[0]
        _check_samples_per_epoch(samples_per_epoch, stop)
        self.stop = stop
        self.samples_per_epoch = samples_per_epoch
        self.names = _checked_names(names, self.datasets)
        self.options = StageOptions(seed=int(seed))
        self.source = "Mix(" + ", ".join(str(d.source) for d in self.datasets) + ")"
        self._plans: dict[tuple, StagePlan] = {}

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def has_counts(self) -> bool:
        return self.stop == "fixed" or all(d.has_counts for d in self.datasets)

    def inner(self) -> list:
        return self.datasets

    @property
    def counts_setting(self) -> str:
        """What the first source without sizes needs (see the dataset contract)."""
        for dataset in self.datasets:
            if not dataset.has_counts:
                return getattr(dataset, "counts_setting", "a manifest")
        return "a manifest"

    @property
    def positions_per_rank(self) -> bool:
        return any(getattr(d, "positions_per_rank", False) for d in self.datasets)

    def source_histories(self, history: Sequence[HistorySegment]) -> list[tuple[int, tuple]]:
        """Per source, after the segments ``history`` of this epoch run on other layouts: the
        pass in progress and the segments of it already read (see ``inner_history``)."""
        def extractor(index):
            def extract(position, base):
                if position == 0:
                    return base, 0
                if position == STREAM_END:
                    return None, STREAM_END
                self._parse(position)
                return position[1 + 2 * index], position[2 + 2 * index]
            return extract
        return [inner_history(history, extractor(i)) for i in range(len(self.datasets))]

    def _quota(self, history: Sequence[HistorySegment]) -> int:
        """Under ``fixed``: the samples of the epoch not drawn in the segments ``history``."""
        total = cast(int, self.samples_per_epoch)  # "fixed" requires it (the constructor)
        return remaining_items(total, history,
                               lambda position: self._parse(position)[0])

    def drawn(self, epoch: int, history: Sequence[HistorySegment]) -> int:
        """Samples drawn over every rank and stream in the segments ``history``: the progress
        a schedule follows."""
        total = 0
        for index, segment in enumerate(history):
            for k, value in enumerate(segment.consumed):
                ranks = ranks_of(value) if isinstance(value, dict) else [value] * segment.world
                for position in ranks:
                    if position == STREAM_END:
                        total += self.plan(epoch, segment.world, segment.workers,
                                           history[:index]).stream_samples[k]
                    else:
                        total += self._parse(position)[0]
        return total

    def _block_weights(self, epoch: int, world: int, workers: int,
                       history: Sequence[HistorySegment]):
        """The weights of each block of a stream: the schedule's stage at the block's first
        draw, counted over the whole job (see ``wdstream.stages.schedule``)."""
        if self.schedule is None:
            return lambda _block: self.weights
        if self.by_tokens:
            return None  # the packing stage's clock decides (see positioned)
        schedule, before, step = self.schedule, self.drawn(epoch, history), BLOCK * world * workers
        return lambda block: schedule.weights_at(before + block * step)

    def plan(self, epoch: int, world: int, workers: int,
             history: Sequence[HistorySegment] = ()) -> StagePlan:
        """Samples per stream of every rank (equal on every rank) in epoch ``epoch``."""
        if self.stop == "fixed":
            return fixed_plan(self._quota(history), world, workers)
        if self.by_tokens:
            raise UnsizedError(f"{self.source}: under a schedule by tokens, where a stream "
                               "stops depends on the tokens; use stop='fixed'")
        if not self.has_counts:
            raise UnsizedError(f"{self.source}: a source without a manifest has no known length")
        key = (epoch, world, workers, json.dumps([s.to_list() for s in history]))
        if key not in self._plans:
            # Streams have the same sizes on every rank, so rank 0 stands for all.
            passes = self.source_histories(history)
            sizes = [d.plan(cycle_epoch(epoch, base), world, workers, segments).stream_samples
                     for d, (base, segments) in zip(self.datasets, passes, strict=True)]
            bases = [base for base, _ in passes]
            weights = self._block_weights(epoch, world, workers, history)
            self._plans[key] = StagePlan([
                self._stream_length([s[k] for s in sizes], epoch, k, len(history), bases,
                                    weights) for k in range(workers)])
        return self._plans[key]

    def _stream_length(self, source_sizes: list[int], epoch: int, stream: int,
                       segment: int = 0, bases: Sequence[int] | None = None,
                       block_weights=None) -> int:
        """Draws a stream makes before it stops (see ``choices.stream_length``); under
        ``cycle``, a source whose first pass was read before this segment does not count."""
        if block_weights is None:
            def block_weights(_block):
                return self.weights
        active = self.weights > 0 if self.schedule is None else self.schedule.ever_positive()
        if bases is not None and self.stop == "cycle":
            active = active & (np.asarray(bases) == 0)
        return stream_length(np.asarray(source_sizes, dtype=np.int64), self.stop, active,
                             block_weights, self.options.seed, epoch, stream, segment)

    # ---- identity -------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """The sources (data, options, seeds), the weights and the stop rule: what decides the
        order (not the names, which default to URLs: data copied elsewhere still resumes)."""
        parts = [[d.fingerprint(), d.options.seed] for d in self.datasets]
        weights = [float(w) for w in self.weights] if self.schedule is None \
            else self.schedule.identity()
        text = json.dumps([parts, weights, self.stop, self.samples_per_epoch, BLOCK])
        return "mix-" + hashlib.sha256(text.encode()).hexdigest()[:16]

    # ---- iteration ------------------------------------------------------------------------
    @property
    def by_tokens(self) -> bool:
        """Whether the schedule counts tokens (``start_tokens``): then only a packing stage
        over this mixture knows the progress, and hands it to ``positioned`` as ``clock``."""
        return getattr(self.schedule, "unit", "samples") == "tokens"

    def positioned(self, spec: IterationSpec, stream: int, start, clock=None,
                   tally: bool = True) -> Iterator[tuple[dict, list]]:
        """Stream ``stream``'s samples from position ``start`` (0, or a position this method
        yielded), each with the position after it. ``clock``: a ``schedule.TokenClock``, for
        a schedule by tokens (its stage in force at each draw). ``tally=False``: positions
        without the documents drawn per source (a packing stage counts its own)."""
        if self.by_tokens and clock is None:
            raise InputError("Mix: a schedule by tokens ('start_tokens') needs PackedSequences "
                             "over the mixture (it counts the tokens delivered)")
        yield from MixStream(self, spec, stream, start, clock, tally).samples()

    def advance(self, position, epoch: int, world: int, workers: int, stream: int,
                history: Sequence[HistorySegment], stage: int | None = None) -> list | None:
        """The position one draw after ``position`` of stream ``stream``, computed without
        reading (for a packing stage's cut, ``wdstream.stages.cut``); None when it cannot be
        told: a source that is not a ``StreamingDataset`` or that restarts at that draw.
        ``stage``: by tokens, the stage in force at that draw."""
        if self.by_tokens and stage is None:
            return None
        passes = self.source_histories(history)
        if position == 0:
            position = [0] + [v for base, _ in passes for v in (base, 0)]
            position += [stage, 0] if self.by_tokens else []
        draws = self._parse(position)[0]
        if self.by_tokens:
            current, start = position[-2:]
            start = start if stage == current else draws  # a new stage from this draw
            block, first = divmod(draws - start, BLOCK)
            choices = block_choices(self.schedule.weights[stage], self.options.seed, epoch,
                                    stream, block, len(history), stage)
        else:
            block, first = divmod(draws, BLOCK)
            weights = self._block_weights(epoch, world, workers, history)(block)
            choices = block_choices(weights, self.options.seed, epoch, stream, block,
                                    len(history))
        index = int(choices[first])
        source = self.datasets[index]
        cycle, consumed = position[1 + 2 * index], position[2 + 2 * index]
        if not hasattr(source, "shards") or not isinstance(consumed, int):
            return None
        base, segments = passes[index]
        size = source.plan(cycle_epoch(epoch, cycle), world, workers,
                           segments if cycle == base else ()).stream_samples[stream]
        if consumed >= size:
            return None  # the source restarts at this draw
        after = list(position)
        after[0] += 1
        after[2 + 2 * index] += 1
        if len(after) > 1 + 2 * len(self.datasets) + 2 * self.by_tokens:  # documents drawn
            after[1 + 2 * len(self.datasets) + index] += 1
        if self.by_tokens:
            after[-2:] = [stage, start]
        return after

    def _parse(self, start) -> tuple[int, list[int], list]:
        """(draws, cycle of each source, position of each source)."""
        if start == 0:
            count = len(self.datasets)
            return 0, [0] * count, [0] * count
        count = len(self.datasets)
        lengths: tuple[int, ...] = (1 + 2 * count, 1 + 3 * count)  # without, with documents drawn
        if self.by_tokens:  # and the stage in force and its first draw
            lengths = tuple(n + 2 for n in lengths)
        valid = (isinstance(start, list) and len(start) in lengths
                 and all(is_count(v)
                         for v in [start[0], *start[1:1 + 2 * count:2], *start[1 + 2 * count:]])
                 and (not self.by_tokens or start[-2] < len(self.schedule.starts)))
        if not valid:
            raise StateError(f"not a position of this mixture: {start!r:.200}")
        return start[0], start[1:1 + 2 * count:2], start[2:1 + 2 * count:2]

    def check_own(self, position) -> None:
        """A position of this mixture, with one each source can start from."""
        _draws, _cycles, positions = self._parse(position)
        for dataset, inner in zip(self.datasets, positions, strict=True):
            check_inner(dataset, inner)

    def documents(self, position) -> list[int]:
        """Documents drawn from each source in a stream's segment, from its position (0 for
        positions that do not count them, ``tally=False``)."""
        count = len(self.datasets)
        if position == 0 or len(position) == 1 + 2 * count + 2 * self.by_tokens:
            return [0] * count
        return list(position[1 + 2 * count:1 + 3 * count])

    def accounting(self, positions, history, rank: int) -> dict:
        """Per source, this rank's documents drawn in the epoch (on earlier layouts: what
        the rank of the same number drew) and the pass in progress (1 and up: the source
        restarted, an epoch boundary of the source)."""
        totals = [0] * len(self.datasets)
        passes = [0] * len(self.datasets)
        for segment in history:
            for value in segment.consumed:
                position = rank_entry(value, rank)
                for i, n in enumerate(self.documents(position) if position else []):
                    totals[i] += n
        for position in positions:
            position = rank_entry(position, rank)
            if not position or position == STREAM_END:
                continue
            _draws, cycles, _ = self._parse(position)
            for i, n in enumerate(self.documents(position)):
                totals[i] += n
                passes[i] = max(passes[i], cycles[i])
        return {name: {"documents": totals[i], "pass": passes[i]}
                for i, name in enumerate(self.names)}
