"""Items taken from an iterator a list at a time: the stages after the shuffle window work on
such lists, so that a sample costs no Python step of theirs where nothing is to be done to it
(``StreamingDataset.positioned_chunks``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

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
