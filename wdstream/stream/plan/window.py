"""The shuffle windows of a stream: their bound in bytes (a sample count derived from the
manifest) and their schedule (windows that grow at the start of a stream), both functions of
the manifest, the options and the position alone, so the plan (and so resume) stays one.

The window shuffle buffers one window of consecutive samples of a stream and yields it in the
plan's order for that window, so a stream can restart at any window's start and skip into it
exactly where it stopped. The stages after it take its items a list at a time, so that a
sample costs no Python step of theirs where nothing is to be done to it
(``StreamingDataset.positioned_chunks``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import TypeVar

import numpy as np

from wdstream.errors import InputError, OptionError
from wdstream.sizes import parse_size

DEFAULT_SHUFFLE_BYTES = 256 << 20


def bounded_window(window: int, shuffle_bytes, manifest) -> int:
    """``window`` samples, or fewer: at most ``shuffle_bytes`` over the manifest's mean sample
    size (at least 1). Without a manifest, or with ``shuffle_bytes=None``, ``window``."""
    if shuffle_bytes is None:
        return window
    limit = parse_size(shuffle_bytes)  # InputError naming the text
    if limit <= 0:
        raise InputError(f"shuffle_bytes must be positive, got {shuffle_bytes!r}")
    if manifest is None or not manifest.samples:
        return window
    mean = manifest.bytes / manifest.samples
    return max(1, min(window, int(limit // mean)))


DEFAULT_SHUFFLE_START = 32  # samples in a stream's first shuffle window


@dataclass(frozen=True)
class WindowSchedule:
    """Where a stream's shuffle windows begin and end: a pure function of the position.

    A stream's windows grow from ``start`` samples, doubling (``start``, ``2 start``,
    ``4 start``...), while they are smaller than ``window``; every later window holds
    ``window`` samples. So a worker yields its first sample once ``start`` samples are read,
    not a whole window. ``start >= window`` (or ``window == 1``): every window is ``window``.
    """

    window: int
    start: int

    @classmethod
    def of(cls, window: int, start: int | None) -> WindowSchedule:
        """``start`` None: no growth (every window ``window`` samples)."""
        return cls(window, window if start is None else min(start, window))

    def __post_init__(self):
        if self.window < 1 or not 1 <= self.start <= self.window:
            raise OptionError(f"shuffle windows of {self.window} samples cannot start at "
                              f"{self.start}")

    @property
    def growing(self) -> bool:
        return self.start < self.window

    @property
    def growth_windows(self) -> int:
        """How many windows are smaller than ``window``."""
        count, size = 0, self.start
        while size < self.window:
            count, size = count + 1, size * 2
        return count

    @property
    def growth_samples(self) -> int:
        """Positions in the growing windows: ``start * (2**growth_windows - 1)``."""
        return self.start * ((1 << self.growth_windows) - 1)

    def size(self, index: int) -> int:
        """Samples in window ``index`` (a stream's last window may hold fewer)."""
        if index < self.growth_windows:
            return self.start << index
        return self.window

    def begin(self, index: int) -> int:
        """The position of window ``index``'s first sample."""
        grown = self.growth_windows
        if index < grown:
            return self.start * ((1 << index) - 1)
        return self.growth_samples + (index - grown) * self.window

    def locate(self, position: int) -> tuple[int, int]:
        """The window holding ``position``: (its index, its first position)."""
        if position < 0:
            raise OptionError(f"a stream position is at least 0, not {position}")
        grown = self.growth_samples
        if position < grown:
            index = (position // self.start + 1).bit_length() - 1
        else:
            index = self.growth_windows + (position - grown) // self.window
        return index, self.begin(index)


T = TypeVar("T")


def window_shuffle(samples: Iterable[dict], schedule: WindowSchedule | int,
                   order: Callable[[int, int], np.ndarray], first_window: int = 0,
                   skip: int = 0) -> Iterator[dict]:
    """Yield ``samples`` window by window, window ``i`` holding ``schedule.size(i)`` samples,
    each in ``order(window_index, size)``. An int ``schedule``: windows all of that size.

    ``samples`` must start at the first sample of window ``first_window``; the first ``skip``
    picks of that window are not yielded again (they were consumed before a resume).
    """
    return chain.from_iterable(window_chunks(samples, schedule, order, first_window, skip))


def window_chunks(samples: Iterable[T], schedule: WindowSchedule | int,
                  order: Callable[[int, int], np.ndarray], first_window: int = 0,
                  skip: int = 0, size: int | None = None) -> Iterator[list[T]]:
    """``window_shuffle`` as lists of at most ``size`` samples (None: a window's), none
    holding samples of two windows: a list never asks the reader for samples past the window
    it comes from, so a stream's first list waits for its first window only."""
    if isinstance(schedule, int):
        schedule = WindowSchedule.of(schedule, None)
    if schedule.window == 1:  # no shuffling (shuffle=False): no per-sample work
        yield from chunks_of(samples, size or 1)
        return
    iterator = iter(samples)
    index = first_window
    while True:
        buffer = list(islice(iterator, schedule.size(index)))
        if not buffer:
            return
        # Python ints rather than numpy's, and no Python loop per sample
        picks = order(index, len(buffer))[skip:].tolist()
        step = size or len(picks) or 1
        for begin in range(0, len(picks), step):
            yield list(map(buffer.__getitem__, picks[begin:begin + step]))
        # let the samples go before the next window is read: flat memory
        buffer.clear()
        skip = 0
        index += 1


CHUNK = 64  # items per list at most
CHUNK_BYTES = 1 << 20  # and about this many bytes of samples: what the tar reader reads at once


def chunk_size(samples: int | None, nbytes: int | None) -> int:
    """Items per list for a dataset of ``samples`` in ``nbytes`` (a manifest's totals): a
    list may read that far ahead of the items handed out, so about ``CHUNK_BYTES`` of them;
    1 (no read ahead) when the sizes are unknown."""
    if not samples or not nbytes:
        return 1
    return max(1, min(CHUNK, CHUNK_BYTES * samples // nbytes))


def chunks_of(items: Iterable, size: int) -> Iterator[list]:
    """Lists of up to ``size`` consecutive items of ``items``. An error of ``items`` comes
    after the items before it: the list they make is given first, and the error is raised on
    the next request."""
    iterator = iter(items)
    while True:
        chunk: list = []
        try:
            chunk.extend(islice(iterator, size))  # what was taken stays if it raises
        except Exception:
            if chunk:
                yield chunk
            raise
        if chunk:
            yield chunk
        if len(chunk) < size:
            return
