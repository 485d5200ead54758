"""Cutting the samples into shards, by count and by real tar size (headers
included), at the same boundaries whoever writes the shards."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from wdstream.errors import InputError
from wdstream.shards.tar_writer import END_SIZE
from wdstream.sizes import format_size
from wdstream.write.jobs import SampleBatch, ShardPiece


class Sharder:
    """Cuts the samples into shards by count and by real tar size (headers included)."""

    def __init__(self, max_count: int | None, max_size: int | None, check_duplicates: bool):
        self.max_count = max_count
        self.max_size = max_size
        self.check_duplicates = check_duplicates
        self._start_shard()

    def _start_shard(self) -> None:
        self._pieces: list[ShardPiece] = []
        self._count = 0
        self._size: int | None = END_SIZE  # None: not known until the texts are tokenized
        self._keys: dict[str, str] = {}  # key -> where it was used, for the duplicate check

    def add(self, samples: SampleBatch) -> Iterator[tuple[list[ShardPiece], int, int | None]]:
        """Add a batch of samples; yield each shard it completes as (pieces, samples, size).

        A shard is closed when the next sample would exceed a limit. Cut points are found
        with running sums and bisection, so the cost is per shard rather than per sample.
        """
        max_count, max_size = self.max_count, self.max_size
        sizes = samples.sizes  # None (texts not tokenized yet) only without max_size
        count = usable = len(samples.keys)  # usable: samples before one too big for any shard
        if max_size is not None and sizes is not None and max(sizes) + END_SIZE > max_size:
            usable = next(i for i, size in enumerate(sizes) if size + END_SIZE > max_size)
        # ends[j] = sum(sizes[:j])
        ends = None if sizes is None else list(itertools.accumulate(sizes, initial=0))
        i = 0
        while i < usable:
            stop = usable if max_count is None else min(usable, i + max_count - self._count)
            if max_size is not None and ends is not None and self._size is not None:
                room = ends[i] + max_size - self._size
                stop = min(stop, bisect.bisect_right(ends, room, i, usable + 1) - 1)
            if stop == i:  # the next sample does not fit: the shard is complete
                finished = self.finish()
                if finished is not None:  # it holds a sample: it is not empty
                    yield finished
                continue
            if self.check_duplicates:
                self._check_keys(samples, i, stop)
            self._pieces.append(_piece(samples, i, stop))
            self._count += stop - i
            if ends is None or self._size is None:
                self._size = None
            else:
                self._size += ends[stop] - ends[i]
            i = stop
        if usable < count and sizes is not None and max_size is not None:
            size = sizes[usable] + END_SIZE
            raise InputError(
                f"{samples.batch.where(usable)}: sample {samples.keys[usable]!r} takes {size} "
                f"bytes as a tar, more than the maximum shard size {max_size} "
                f"({format_size(max_size)})"
            )

    def _check_keys(self, samples: SampleBatch, start: int, stop: int) -> None:
        seen = self._keys
        for i in range(start, stop):
            key = samples.keys[i]
            if key in seen:
                raise InputError(
                    f"{samples.batch.where(i)}: key {key!r} is already used in this shard by "
                    f"{seen[key]}"
                )
            seen[key] = samples.batch.where(i)

    def finish(self) -> tuple[list[ShardPiece], int, int | None] | None:
        """The shard in progress as (pieces, samples, tar size or None if not known yet), None
        if empty; then a new one."""
        finished = (self._pieces, self._count, self._size) if self._count else None
        self._start_shard()
        return finished


def _piece(samples: SampleBatch, start: int, stop: int) -> ShardPiece:
    batch = samples.batch
    return ShardPiece(
        samples.keys[start:stop],
        samples.exts,
        tuple(column[start:stop] for column in samples.columns),
        (batch.source, batch.numbers[start:stop]) if samples.unparsed_json else None,
        samples.tokenize,
        (batch.source, batch.offsets[start], batch.offsets[stop], batch.identity)
        if samples.unparsed_json and batch.offsets is not None else None,
    )

