"""The window shuffle: buffer one window of consecutive samples of a stream and yield it in
the plan's order for that window. Windows follow the stream's ``WindowSchedule`` (small at
the start of a stream, then full size), and the order of a window depends only on the plan,
so a stream can restart at any window's start and skip into it exactly where it stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import TypeVar

import numpy as np

from wdstream.stream.plan.chunks import chunks_of
from wdstream.stream.plan.window import WindowSchedule

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
