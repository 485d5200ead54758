"""One worker stream of a ``Mix``: the streams of its sources (each restartable for a new pass,
with one sample of look-ahead for the ``cycle`` rule) and the draws from them, block by block
of source choices, each sample with the mixture's position after it."""

from __future__ import annotations

import math
from collections.abc import Iterator

from wdstream.errors import InputError
from wdstream.stages.base import cycle_epoch, fixed_plan
from wdstream.stages.choices import BLOCK, block_choices
from wdstream.stream.load.contract import IterationSpec
from wdstream.stream.load.ranks import rank_position

END = object()


class SourceStreams:
    """The streams of the sources, each restartable for a new pass, with one sample of
    look-ahead so that the ``cycle`` rule can tell when a source has just been read to its
    end."""

    def __init__(self, datasets, spec: IterationSpec, stream: int, cycles: list[int], positions,
                 histories):
        self.datasets, self.spec, self.stream = datasets, spec, stream
        self.cycles = list(cycles)
        self.histories = histories  # per source: (pass, segments of it to leave out)
        self.iterators = [self._open(i, positions[i]) for i in range(len(datasets))]
        self.ahead: list = [None] * len(datasets)  # a looked-ahead (sample, position) or END

    def _open(self, index: int, position):
        spec = self.spec
        cycle = self.cycles[index]
        base, history = self.histories[index]
        inner = IterationSpec(cycle_epoch(spec.epoch, cycle), spec.rank, spec.world,
                              spec.workers, history=history if cycle == base else (),
                              batch_size=spec.batch_size, context=spec.context)
        return self.datasets[index].positioned(inner, self.stream, position)

    def take(self, index: int):
        """The next ``(sample, position)`` of source ``index``, or END."""
        item = self.ahead[index]
        if item is None:
            return next(self.iterators[index], END)
        self.ahead[index] = None
        return item

    def at_end(self, index: int) -> bool:
        if self.ahead[index] is None:
            self.ahead[index] = next(self.iterators[index], END)
        return self.ahead[index] is END

    def restart(self, index: int) -> None:
        self.cycles[index] += 1
        self.iterators[index] = self._open(index, 0)
        self.ahead[index] = None


class MixStream:
    """Stream ``stream`` of ``mix`` from position ``start``: ``samples()`` yields each drawn
    sample with the position after it.

    The position, updated in place and copied for each sample, is ``[draws, cycle_0,
    position_0, cycle_1, position_1, ...]``, then (``tally``) the documents drawn from each
    source in this segment, then (a ``clock``, a schedule by tokens) the stage in force and
    its first draw."""

    def __init__(self, mix, spec: IterationSpec, stream: int, start, clock, tally: bool):
        self.mix, self.spec, self.stream, self.clock = mix, spec, stream, clock
        histories = mix.source_histories(spec.history)
        start = rank_position(start, spec.rank)
        draws, cycles, positions = mix._parse(start)
        if start == 0:  # a segment starts every source at its pass in progress
            cycles = [base for base, _ in histories]
        self.segment = len(spec.history)
        self.block_weights = mix._block_weights(spec.epoch, spec.world, spec.workers,
                                                spec.history)
        self.sources = SourceStreams(mix.datasets, spec, stream, cycles, positions, histories)
        self.state = [draws] + [v for pair in zip(cycles, positions, strict=True) for v in pair]
        self.documents = len(self.state) if tally else None
        if tally:
            self.state += mix.documents(start)
        self.stage = self.stage_start = None
        if clock is not None:
            self.stage, self.stage_start = start[-2:] if start != 0 else (clock.stage, 0)
            self.state += [self.stage, self.stage_start]
        self.limit = math.inf
        if mix.stop == "fixed":
            self.limit = fixed_plan(mix._quota(spec.history), spec.world,
                                    spec.workers).stream_samples[stream]
        # cycle: the sources not yet read to their end in this epoch; done when none is left
        self.pending = {i for i in range(len(mix.datasets)) if mix.weights[i] > 0
                        and cycles[i] == 0 and not self.sources.at_end(i)} \
            if mix.stop == "cycle" else None

    def samples(self) -> Iterator[tuple[dict, list]]:
        while self.state[0] < self.limit and not self._all_cycled():
            choices, first = self._block()
            for index in choices[first:].tolist():
                if self.clock is not None and self.clock.stage != self.stage:
                    break  # a new stage from this draw on
                item = self._take(index)
                if item is END:
                    return
                yield self._drawn(index, item)
                if self._ends_after(index):
                    return

    def _all_cycled(self) -> bool:
        return self.pending is not None and not self.pending

    def _block(self):
        """The source choices of the block of the next draw, and that draw's index in it;
        by tokens, blocks count from the first draw of the stage the clock decides."""
        mix, spec, draws = self.mix, self.spec, self.state[0]
        if self.clock is None:
            block, first = divmod(draws, BLOCK)
            return block_choices(self.block_weights(block), mix.options.seed, spec.epoch,
                                 self.stream, block, self.segment), first
        if self.clock.stage != self.stage:
            self.stage, self.stage_start = self.clock.stage, draws
            self.state[-2:] = [self.stage, self.stage_start]
        block, first = divmod(draws - self.stage_start, BLOCK)
        return block_choices(mix.schedule.weights[self.stage], mix.options.seed, spec.epoch,
                             self.stream, block, self.segment, self.stage), first

    def _take(self, index: int):
        """Source ``index``'s next item, restarting the source at its end (END under
        ``first_exhausted``)."""
        sources = self.sources
        item = sources.take(index)
        if item is not END or self.mix.stop == "first_exhausted":
            return item
        sources.restart(index)
        self.state[1 + 2 * index] = sources.cycles[index]
        item = sources.take(index)
        if item is END:
            spec = self.spec
            raise InputError(
                f"Mix: source {self.mix.names[index]!r} has no samples for stream "
                f"{self.stream} of rank {spec.rank} ({spec.world} ranks x {spec.workers} "
                "workers), so it cannot be cycled")
        return item

    def _drawn(self, index: int, item) -> tuple[dict, list]:
        """The drawn sample, tagged with its source, and the position after it."""
        state = self.state
        sample, state[2 + 2 * index] = item
        if not isinstance(sample, dict):
            raise InputError(f"Mix: source {self.mix.names[index]!r} yields "
                             f"{type(sample).__name__}; Mix tags dict samples")
        sample["__source__"] = self.mix.names[index]
        state[0] += 1
        if self.documents is not None:
            state[self.documents + index] += 1
        return sample, state.copy()

    def _ends_after(self, index: int) -> bool:
        """Whether the stream ends after a draw from source ``index``."""
        if self.state[0] >= self.limit:
            return True
        pending = self.pending
        if pending is not None and index in pending and self.sources.at_end(index):
            pending.discard(index)
            return not pending
        return False
