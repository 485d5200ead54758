"""The reading stage for raw files: spans of units (Parquet row groups, Arrow record
batches, JSON Lines ranges) in, samples out, as ``SpanReader`` does for shards.

A unit is read whole (its chosen columns only), its file checked unchanged since the plan.
Remote units are read ahead in background threads: one, and one more each time the next unit
was not there yet when its turn came, as many as fit in ``AHEAD_BYTES`` at the mean size of
the units read (at most ``UNITS_AHEAD``), so that small units on a link with a long first
byte are not read one round trip at a time. A local file has no first byte to wait for: its
next unit is read ahead in a thread only where each reading process of the node (the
DataLoader workers, or this process without them) has a second CPU for that thread
(``local_ahead``); without one, the thread only takes turns with the process's own. A transient
failure is retried with backoff before any of the unit's samples are handed out, so nothing
is lost or repeated; when retries run out ``on_error`` decides, as for shards.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain

from wdstream.errors import WdstreamError
from wdstream.sources import urls
from wdstream.stream.plan.epoch import Span
from wdstream.stream.plan.spans import SpanArray
from wdstream.stream.read.shard_reader import (
    ReadOptions,
    ReadStats,
    is_data_failure,
    is_transient,
    wait_to_retry,
)
from wdstream.tables.reads import Access
from wdstream.tables.unit_processes import rank_cpus
from wdstream.tables.units import UnitTable

log = logging.getLogger(__name__)

ROWS_PER_LIST = 256  # samples made from a unit's columns at a time
UNITS_AHEAD = 8  # units read ahead at most: small ones, on a link with a long first byte
AHEAD_BYTES = 16 << 20  # what the units read ahead may hold, at the mean size so far


def local_ahead() -> int:
    """Units of local files to read ahead in a thread: 1 where the node's CPUs (this rank's
    share, ``rank_cpus``) give each reading process two, else 0."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:  # no DataLoader, so no workers
        info = None
    else:
        info = get_worker_info()
    readers = info.num_workers if info is not None else 1
    return int(rank_cpus() >= 2 * readers)


class UnitReader:
    """Reads a list of spans of a ``UnitTable``'s units in order; iterate it for samples
    (None for each sample skipped under ``on_error="skip"``). The arguments are
    ``SpanReader``'s; ``payload_target`` and ``first_samples`` concern tar members only."""

    def __init__(self, spans: Sequence[Span], units: UnitTable, options: ReadOptions,
                 stats: ReadStats | None = None, payload_target=None, first_samples: int = 0):
        self.visits = SpanArray.of(spans).visits()
        self.units = units
        self.options = options
        self.access = Access(options.opener, options.timeout, options.limits)
        self.stats = stats if stats is not None else ReadStats()
        self._read_units = self._read_bytes = 0  # the units read, measured (``_ahead``)
        self._waited = 0  # times a unit read ahead was not there yet when its turn came
        self._most_ahead = local_ahead() if all(urls.to_local_path(f.url) is not None
                                                for f in units.files) else UNITS_AHEAD

    def __iter__(self) -> Iterator[dict]:
        return chain.from_iterable(self.chunks())

    def chunks(self) -> Iterator[list]:
        """The samples as lists of at most ``ROWS_PER_LIST``; the first unit read here, the
        next ones in threads meanwhile (``_ahead`` of them)."""
        pending: collections.deque[Future] = collections.deque()
        with ThreadPoolExecutor(UNITS_AHEAD, thread_name_prefix="wdstream-units") as pool:
            try:
                for index, visit in enumerate(self.visits):
                    if pending:
                        self._waited += not pending[0].done()
                        rows = pending.popleft().result()
                    else:
                        rows = self._fetch(visit)
                    self._measure(rows)
                    asked = index + 1 + len(pending)  # the first visit not asked for yet
                    while asked < len(self.visits) and len(pending) < self._ahead():
                        pending.append(pool.submit(self._fetch, self.visits[asked]))
                        asked += 1
                    yield from self._samples(visit, rows)
            finally:
                for future in pending:
                    future.cancel()

    def _measure(self, rows) -> None:
        size = getattr(rows, "nbytes", None)  # None: skipped, or a compressed file's body
        if size is not None:
            self._read_bytes += size
            self._read_units += 1

    def _ahead(self) -> int:
        """Units to have read ahead: one, and one more each time a unit was not there yet
        when its turn came, as many as fit in ``AHEAD_BYTES`` at the mean size of the units
        read, at most ``_most_ahead`` (see the module docstring)."""
        if not self._read_units or self._most_ahead <= 1:
            return min(1, self._most_ahead)
        mean = max(1, self._read_bytes // self._read_units)
        return max(1, min(1 + self._waited, self._most_ahead, AHEAD_BYTES // mean))

    def _samples(self, visit: list[Span], rows) -> Iterator[list]:
        """The visit's samples; a row that cannot be made (a JSON Lines row that is not
        JSON, or nests too deeply) under ``on_error="skip"`` skips the rest of the visit."""
        unit = visit[0].shard
        for number, span in enumerate(visit):
            stop = self._stop(span)
            if rows is None:  # skipped by on_error="skip"
                yield [None] * (stop - span.start)
                continue
            for start in range(span.start, stop, ROWS_PER_LIST):
                try:
                    samples = self.units.samples_of(unit, rows, start,
                                                    min(stop, start + ROWS_PER_LIST))
                except WdstreamError as error:
                    if self.options.on_error == "raise" or not is_data_failure(error):
                        raise
                    lost = [stop - start] + [self._stop(s) - s.start for s in visit[number + 1:]]
                    self._skipped(unit, sum(lost), error)
                    yield from ([None] * count for count in lost)
                    return
                yield samples

    def _stop(self, span: Span) -> int:
        return span.stop if span.stop is not None else int(self.units.samples[span.shard])

    def _skipped(self, unit: int, missing: int, error: WdstreamError) -> None:
        url = self.units.unit(unit)[0].url
        log.error("%s: skipped (%d samples lost): %s", url, missing, error)
        self.stats.skipped_shards.append(url)
        self.stats.skipped_samples += missing

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
                self._skipped(unit, sum(span.length for span in visit), error)
                return None
