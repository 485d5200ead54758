"""The window shuffle: buffer one window of consecutive samples of a stream and yield it in
the plan's order for that window. Windows follow the stream's ``WindowSchedule`` (small at
the start of a stream, then full size), and the order of a window depends only on the plan,
so a stream can restart at any window's start and skip into it exactly where it stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import numpy as np

from wdstream.stream.window import WindowSchedule


def window_shuffle(samples: Iterable[dict], schedule: WindowSchedule | int,
                   order: Callable[[int, int], np.ndarray], first_window: int = 0,
                   skip: int = 0) -> Iterator[dict]:
    """Yield ``samples`` window by window, window ``i`` holding ``schedule.size(i)`` samples,
    each in ``order(window_index, size)``. An int ``schedule``: windows all of that size.

    ``samples`` must start at the first sample of window ``first_window``; the first ``skip``
    picks of that window are not yielded again (they were consumed before a resume).
    """
    if isinstance(schedule, int):
        schedule = WindowSchedule.of(schedule, None)
    if schedule.window == 1:  # no shuffling (shuffle=False): no per-sample work
        yield from samples
        return
    iterator = iter(samples)
    index = first_window
    while True:
        buffer = list(islice(iterator, schedule.size(index)))
        if not buffer:
            return
        # Python ints rather than numpy's, and no Python loop per sample
        yield from map(buffer.__getitem__, order(index, len(buffer))[skip:].tolist())
        # let the samples go before the next window is read: flat memory
        buffer.clear()
        skip = 0
        index += 1
