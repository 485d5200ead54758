"""A range of a raw source's rows, ``START:STOP``, as Hugging Face ``datasets`` reads a split's
slice (``train[:20%]``, ``train[100:200]``, ``train[-5%:]``): each bound a row number or a
percentage of the rows (rounded to the closest row), negative from the end, empty for the
first or last. Rows are numbered over the source's files in their order; only the units that
hold rows of the range are read."""

from __future__ import annotations

import re
from dataclasses import dataclass

from wdstream.errors import OptionError
from wdstream.printable import printable

BOUND = re.compile(r"-?\d+%?\Z")  # whole rows or percents


@dataclass(frozen=True)
class RowRange:
    """``start`` and ``stop`` as written (``""``: the first row / past the last)."""

    start: str
    stop: str

    @classmethod
    def parse(cls, text: str, owner: str = "StreamingDataset") -> RowRange:
        """``"START:STOP"`` checked; OptionError naming ``owner`` and the accepted forms."""
        start, colon, stop = text.partition(":") if isinstance(text, str) else ("", "", "")
        start, stop = start.strip(), stop.strip()
        if not colon or any(b and not BOUND.match(b) for b in (start, stop)) or \
                len(text) > 64:
            raise OptionError(f"{owner}: rows must be 'START:STOP', each bound a row number or a "
                              "percentage, negative from the end ('100:200', ':20%', '-5%:'), "
                              f"got {printable(repr(text))[:80]}")
        return cls(start, stop)

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"

    def rows(self, total: int) -> tuple[int, int]:
        """The first row and the row past the last, of ``total`` rows (an empty range: equal
        numbers)."""
        start, stop = bound(self.start, total, 0), bound(self.stop, total, total)
        return start, max(start, stop)


def bound(text: str, rows: int, default: int) -> int:
    """A bound as ``datasets`` reads it: rows or a percentage (the closest row), negative from
    the end, within ``rows``."""
    if not text:
        return default
    value = int(round(int(text[:-1]) * rows / 100.0)) if text.endswith("%") else int(text)
    if value < 0:
        value = max(rows + value, 0)
    return min(value, rows)
