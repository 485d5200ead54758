"""The streams of a ``Mix``'s sources: one worker stream of each, restartable for a new pass
of the source, with one sample of look-ahead for the ``cycle`` rule."""

from __future__ import annotations

from wdstream.stages.base import cycle_epoch
from wdstream.stream.contract import IterationSpec

END = object()


class SourceStreams:
    """The streams of the sources, each restartable for a new pass, with one sample of
    look-ahead so that the ``cycle`` rule can tell when a source has just been read to its
    end. Plain lists, read by ``Mix.positioned``'s loop directly: it runs once per sample."""

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

    def at_end(self, index: int) -> bool:
        if self.ahead[index] is None:
            self.ahead[index] = next(self.iterators[index], END)
        return self.ahead[index] is END

    def restart(self, index: int) -> None:
        self.cycles[index] += 1
        self.iterators[index] = self._open(index, 0)
        self.ahead[index] = None
