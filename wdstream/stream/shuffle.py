"""The window shuffle: buffer ``window`` consecutive samples of a stream and yield them in the
plan's order for that window. The order of a window depends only on the plan, so a stream can
restart at any window boundary and skip into the window exactly where it stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import numpy as np


def window_shuffle(samples: Iterable[dict], window: int, order: Callable[[int, int], np.ndarray],
                   first_window: int = 0, skip: int = 0) -> Iterator[dict]:
    """Yield ``samples`` window by window, each in ``order(window_index, size)``.

    ``samples`` must start at the first sample of window ``first_window``; the first ``skip``
    picks of that window are not yielded again (they were consumed before a resume).
    """
    if window == 1:  # no shuffling (shuffle=False): pass samples through, no per-sample work
        yield from samples
        return
    iterator = iter(samples)
    index = first_window
    while True:
        buffer = list(islice(iterator, window))
        if not buffer:
            return
        # Python ints rather than numpy's, and no Python loop per sample
        yield from map(buffer.__getitem__, order(index, len(buffer))[skip:].tolist())
        # let the samples go before the next window is read: flat memory
        buffer.clear()
        skip = 0
        index += 1
