"""The reading stage for raw files: spans of units (Parquet row groups, Arrow record
batches, JSON Lines ranges) in, samples out, as ``SpanReader`` does for shards.

A unit is read whole (its chosen columns only) once its file is found unchanged since the
plan; the next unit is read in a background thread meanwhile. A transient failure is retried
with backoff before any of the unit's samples are handed out, so nothing is lost or
repeated; when retries run out ``on_error`` decides, as for shards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain

from wdstream.errors import WdstreamError
from wdstream.stream.plan import Span
from wdstream.stream.read import (
    ReadOptions,
    ReadStats,
    is_data_failure,
    is_transient,
    wait_to_retry,
)
from wdstream.stream.spans import SpanArray
from wdstream.tables.reads import Access
from wdstream.tables.units import UnitTable

log = logging.getLogger(__name__)

ROWS_PER_LIST = 256  # samples made from a unit's columns at a time


class UnitReader:
    """Reads a list of spans of a ``UnitTable``'s units in order; iterate it for samples
    (None for each sample skipped under ``on_error="skip"``). The arguments are
    ``SpanReader``'s; ``payload_target`` and ``first_samples`` concern tar members only."""

    def __init__(self, spans: Sequence[Span], units: UnitTable, options: ReadOptions,
                 stats: ReadStats | None = None, payload_target=None, first_samples: int = 0):
        self.visits = SpanArray.of(spans).visits()
        self.units = units
        self.options = options
        self.access = Access(options.opener, options.timeout)
        self.stats = stats if stats is not None else ReadStats()

    def __iter__(self) -> Iterator[dict]:
        return chain.from_iterable(self.chunks())

    def chunks(self) -> Iterator[list]:
        """The samples as lists of at most ``ROWS_PER_LIST``."""
        with ThreadPoolExecutor(1, thread_name_prefix="wdstream-units") as ahead:
            pending: Future | None = None
            for index, visit in enumerate(self.visits):
                rows = pending.result() if pending is not None else self._fetch(visit)
                pending = ahead.submit(self._fetch, self.visits[index + 1]) \
                    if index + 1 < len(self.visits) else None
                yield from self._samples(visit, rows)
            if pending is not None:
                pending.cancel()

    def _samples(self, visit: list[Span], rows) -> Iterator[list]:
        unit = visit[0].shard
        for span in visit:
            stop = span.stop if span.stop is not None else int(self.units.samples[unit])
            if rows is None:  # skipped by on_error="skip"
                yield [None] * (stop - span.start)
                continue
            for start in range(span.start, stop, ROWS_PER_LIST):
                yield self.units.samples_of(unit, rows, start, min(stop, start + ROWS_PER_LIST))

    def _fetch(self, visit: list[Span]):
        """The visit's unit read (retried), or None when ``on_error="skip"`` gives it up."""
        unit = visit[0].shard
        attempt = 0
        while True:
            try:
                return self.units.read(unit, self.access)
            except WdstreamError as error:
                if is_transient(error) and attempt < self.options.retries:
                    attempt += 1
                    wait_to_retry(error, attempt, self.options, self.stats)
                    continue
                if self.options.on_error == "raise" or not is_data_failure(error):
                    raise
                missing = sum(span.length for span in visit)
                url = self.units.unit(unit)[0].url
                log.error("%s: skipped (%d samples lost): %s", url, missing, error)
                self.stats.skipped_shards.append(url)
                self.stats.skipped_samples += missing
                return None
