"""The shuffle windows of a stream: their bound in bytes (a sample count derived from the
manifest) and their schedule (windows that grow at the start of a stream), both functions of
the manifest, the options and the position alone, so the plan (and so resume) stays one."""

from __future__ import annotations

from dataclasses import dataclass

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
