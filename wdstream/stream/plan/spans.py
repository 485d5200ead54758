"""Sample ranges of shards, one by one (``Span``) or as arrays (``SpanArray``: three int64
arrays, a ``Span`` made when one is asked for), so the plan hands a worker its stream of a
million-shard epoch without a Python object per shard (docs/decisions.md), and the
reader walks its runs of one shard (``visits``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from wdstream.errors import OptionError

OPEN = -1  # a SpanArray's stop for "to the shard's end" (a Span's stop None)
_CHUNK = 4096  # spans turned into Python ints at a time while iterating


@dataclass(frozen=True)
class Span:
    """Samples ``[start, stop)`` of shard number ``shard``; ``stop`` None means "to the end"
    (used when sample counts are unknown)."""

    shard: int
    start: int
    stop: int | None

    @property
    def length(self) -> int:
        if self.stop is None:
            raise OptionError("the length of an open-ended span is unknown")
        return self.stop - self.start


class SpanArray(Sequence):
    """Spans as the int64 arrays ``shard``, ``start`` and ``stop`` (``OPEN``: to the end); a
    read-only ``Sequence[Span]`` equal to the list of the same spans."""

    def __init__(self, shard, start, stop):
        self.shard = np.asarray(shard, dtype=np.int64)
        self.start = np.asarray(start, dtype=np.int64)
        self.stop = np.asarray(stop, dtype=np.int64)

    @classmethod
    def of(cls, spans: Sequence[Span]) -> SpanArray:
        if isinstance(spans, SpanArray):
            return spans
        return cls([s.shard for s in spans], [s.start for s in spans],
                   [OPEN if s.stop is None else s.stop for s in spans])

    def __len__(self) -> int:
        return len(self.shard)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SpanArray(self.shard[index], self.start[index], self.stop[index])
        stop = int(self.stop[index])  # IndexError past the end, as a list
        return Span(int(self.shard[index]), int(self.start[index]), None if stop == OPEN else stop)

    def __iter__(self) -> Iterator[Span]:
        for at in range(0, len(self), _CHUNK):
            part = slice(at, at + _CHUNK)
            for shard, start, stop in zip(self.shard[part].tolist(), self.start[part].tolist(),
                                          self.stop[part].tolist(), strict=True):
                yield Span(shard, start, None if stop == OPEN else stop)

    def __eq__(self, other) -> bool:
        if isinstance(other, SpanArray):
            return (np.array_equal(self.shard, other.shard)
                    and np.array_equal(self.start, other.start)
                    and np.array_equal(self.stop, other.stop))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    # __eq__ without __hash__: Python makes instances unhashable

    def __repr__(self) -> str:
        return f"SpanArray({len(self)} spans)"

    def lengths(self) -> np.ndarray:
        if (self.stop == OPEN).any():
            raise OptionError("the length of an open-ended span is unknown")
        return self.stop - self.start

    def drop_first(self, count: int) -> SpanArray:
        """The spans left after skipping ``count`` positions (known lengths only); empty
        spans are left out, as ``plan.drop_first`` always did."""
        lengths = self.lengths()
        ends = np.cumsum(lengths)
        first = int(np.searchsorted(ends, count, side="right"))
        start = self.start[first:].copy()
        if len(start):
            start[0] += count - (int(ends[first - 1]) if first else 0)
        keep = self.stop[first:] > start
        return SpanArray(self.shard[first:][keep], start[keep], self.stop[first:][keep])

    def visits(self) -> Visits:
        return Visits(self)


class Visits(Sequence):
    """The runs of consecutive spans of one shard in increasing order, which the reader reads
    in one pass (after an elastic resume a shuffle window's leftovers are many short spans of
    a few shards); each run is a short ``list[Span]`` made when asked for."""

    def __init__(self, spans: SpanArray):
        self.spans = spans
        shard, start, stop = spans.shard, spans.start, spans.stop
        joins = ((shard[1:] == shard[:-1]) & (stop[:-1] != OPEN) & (stop[1:] != OPEN)
                 & (start[1:] >= stop[:-1]))
        self.heads = np.flatnonzero(np.concatenate(([len(spans) > 0], ~joins)))

    def __len__(self) -> int:
        return len(self.heads)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]  # IndexError past the end, as a list
        end = int(self.heads[index + 1]) if index + 1 < len(self) else len(self.spans)
        return list(self.spans[int(self.heads[index]):end])

    def shard(self, index: int) -> int:
        """The shard visit ``index`` reads."""
        return int(self.spans.shard[self.heads[index]])
