"""The reading stage: sample ranges of shards in, raw samples out, and no silent failure. Each
shard is opened (the next one already downloading), its samples yielded, and its end checked
against the manifest (end marker, counts, bytes, digest if asked, the body's exit status).
A transient failure is retried from the last sample delivered; when retries run out,
``on_error`` raises or skips the rest of the shard and records it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import cast

from wdstream.errors import AccessError, ShardError, ShardMismatchError, StreamError, WdstreamError
from wdstream.limits import Limits
from wdstream.options import CHOICES, choice
from wdstream.printable import redact
from wdstream.shards.compression import DecompressingBody, open_tar, stored_bytes
from wdstream.shards.identity import head_check
from wdstream.shards.samples import StrayCount, sample_batches
from wdstream.shards.tar_reader import iter_members
from wdstream.sources.cache import ShardCache
from wdstream.sources.hashing import HashingReader
from wdstream.sources.openers import open_read
from wdstream.stream.plan.epoch import Span
from wdstream.stream.plan.spans import SpanArray

log = logging.getLogger(__name__)

ERROR_POLICIES = CHOICES["on_error"]
_NOTHING = object()


@dataclass(frozen=True)
class ShardTable:
    """What the reader knows of the shards: URLs, and from a manifest their sample counts,
    bytes, digests and identity keys (None where unknown; see wdstream.shards.identity)."""

    urls: Sequence[str]
    samples: Sequence[int] | None = None
    bytes: Sequence[int] | None = None
    sha256: Sequence[str | None] | None = None
    heads: Sequence[str | None] | None = None
    last_keys: Sequence[str | None] | None = None

    def get(self, column: str, shard: int):
        values = getattr(self, column)
        return values[shard] if values is not None else None


@dataclass(frozen=True)
class ReadOptions:
    opener: str | None = None  # None: WDSTREAM_OPENER, else the default for the URL's scheme
    timeout: float = 60.0  # seconds without data before a read is a stall
    retries: int = 3
    backoff: float = 0.5  # first retry delay in seconds, doubled each attempt
    on_error: str = "raise"
    verify_digest: bool = False
    cache_dir: str | None = None  # local shard cache (wdstream.sources.cache); None: none
    cache_limit: int | str | None = None  # its size bound; None: cache.DEFAULT_LIMIT
    limits: Limits = field(default_factory=Limits)  # what shards may expand to

    def __post_init__(self):
        choice("ReadOptions", "on_error", self.on_error)


@dataclass
class ReadStats:
    """Counters of one reader; DataLoader workers send theirs to the loader with each batch."""

    retries: int = 0
    skipped_shards: list[str] = field(default_factory=list)
    skipped_samples: int = 0
    # members of no sample, skipped: counted by the stream that reads a shard to its end
    strays: StrayCount = field(default_factory=StrayCount)

    def take(self) -> dict:
        """Return the counts since the last call and reset them."""
        delta = {"retries": self.retries, "skipped_shards": list(self.skipped_shards),
                 "skipped_samples": self.skipped_samples, "stray_members": self.strays.count}
        self.retries, self.skipped_shards, self.skipped_samples = 0, [], 0
        self.strays = StrayCount()
        return delta


def is_data_failure(error: WdstreamError) -> bool:
    """What ``on_error="skip"`` may skip: a shard that is corrupt, short, missing or cannot
    be fetched. A configuration, credentials or permission problem (``InputError``,
    ``AccessError``) is never the data's fault and always raises."""
    return isinstance(error, ShardError) or (
        isinstance(error, StreamError) and not isinstance(error, AccessError))


def is_transient(error: WdstreamError) -> bool:
    # A shard that ends early or parses badly may be a connection cut short; retrying a truly
    # corrupt shard costs a few seconds and then fails with the same clear error. A shard that
    # is not the one the manifest describes is not retried (ShardMismatchError).
    return getattr(error, "transient", isinstance(error, ShardError))


def wait_to_retry(error: WdstreamError, attempt: int, options: ReadOptions,
                  stats: ReadStats) -> None:
    """Count retry number ``attempt`` of a read that failed with ``error``, say so, and wait
    its backoff (``options.backoff``, doubled each attempt)."""
    stats.retries += 1
    delay = options.backoff * 2 ** (attempt - 1)
    log.warning("%s; retry %d of %d in %.1f s", error, attempt, options.retries, delay)
    time.sleep(delay)


def _skip(spans: list[Span], count: int) -> list[Span]:
    """``spans`` without their first ``count`` samples (those a failed attempt delivered)."""
    kept = []
    for span in spans:
        if span.stop is None:
            kept.append(Span(span.shard, span.start + count, None))
            count = 0
        elif count >= span.length:
            count -= span.length
        else:
            kept.append(Span(span.shard, span.start + count, span.stop))
            count = 0
    return kept


class SpanReader:
    """Reads a list of spans in order; iterate it for samples (None for each sample skipped
    under ``on_error="skip"``). Keeps one shard opened ahead. ``first_samples``: how many
    samples the consumer wants before it can go on (a first batch, a first shuffle window);
    with the shards' sizes and counts, the first shard's reader is told their bytes."""

    def __init__(self, spans: Sequence[Span], shards: ShardTable, options: ReadOptions,
                 stats: ReadStats | None = None, payload_target=None, first_samples: int = 0):
        self.visits = SpanArray.of(spans).visits()  # runs read in one pass, as arrays
        self.first_samples = first_samples
        self.payload_target = payload_target  # see wdstream.shards.tar_reader.iter_members
        self.shards = shards
        self.options = options
        self.stats = stats if stats is not None else ReadStats()
        self._ahead: dict[int, object] = {}  # visit index -> body opened early
        self._delivered = 0  # samples of the current visit yielded so far
        self._last: tuple[int, str] | None = None  # and the last one's position and key
        self._cache = ShardCache(options.cache_dir, options.cache_limit) \
            if options.cache_dir else None

    def __iter__(self) -> Iterator[dict]:
        return chain.from_iterable(self.chunks())  # samples one by one, in C

    def chunks(self) -> Iterator[list]:
        """The samples as lists: those of one read of a shard, or the Nones of a skipped
        one. A failure is handled (retried, skipped or raised) once the lists before it
        are used."""
        try:
            for index, visit in enumerate(self.visits):
                yield from self._read_visit(index, visit)
        finally:
            for body in self._ahead.values():
                _close_quietly(body)
            self._ahead.clear()

    def _open(self, index: int, retry: bool = False):
        body = self._ahead.pop(index, None)
        if body is None:
            body = self._open_shard(self.visits.shard(index), retry,
                                      self._first_bytes() if index == 0 else None)
        return body

    def _first_bytes(self) -> int | None:
        """The bytes of the first shard up to its ``first_samples``-th sample read (from the
        shard's start: a shard's body is read from its first byte), at its mean sample."""
        shard = self.visits.shard(0)
        samples, size = self.shards.get("samples", shard), self.shards.get("bytes", shard)
        if not self.first_samples or not samples or not size:
            return None
        wanted = int(self.visits.spans.start[0]) + self.first_samples
        return min(size, -(-size * wanted // samples))

    def _open_ahead(self, index: int) -> None:
        if index < len(self.visits) and index not in self._ahead:
            try:
                self._ahead[index] = self._open_shard(self.visits.shard(index))
            except WdstreamError:
                pass  # reported, with retries, when the span is actually read

    def _open_shard(self, shard: int, retry: bool = False, first_bytes: int | None = None):
        """The shard's body, through the cache if there is one (a retry drops its copy)."""
        url = self.shards.urls[shard]
        size = self.shards.bytes[shard] if self.shards.bytes is not None else None

        def source():
            return open_read(url, opener=self.options.opener, timeout=self.options.timeout,
                             size=size or None, first_bytes=first_bytes)

        if self._cache is None:
            return source()
        sha256 = self.shards.sha256[shard] if self.shards.sha256 is not None else None
        if retry:
            self._cache.forget(url, size, sha256)
        return self._cache.open(url, source, size=size, sha256=sha256,
                                verify_digest=self.options.verify_digest,
                                head=self.shards.get("heads", shard))

    def _read_visit(self, index: int, visit: list[Span]) -> Iterator[list]:
        url = self.shards.urls[visit[0].shard]
        delivered = 0
        attempt = 0
        self._last = None  # (shard position, key) of the last sample yielded
        while True:
            try:
                body = self._open(index, retry=attempt > 0)
                self._delivered = delivered  # _samples counts what it yields
                samples = self._samples(body, visit, _skip(visit, delivered), self._last)
                # Open the next shard once this one flows: its first bytes do not then share
                # the link (or the server) with the next shard's start.
                first = next(samples, _NOTHING)
                self._open_ahead(index + 1)
                if first is not _NOTHING:
                    yield cast(list, first)  # a chunk, not the sentinel
                    yield from samples
                return
            except WdstreamError as error:
                delivered = self._delivered
                if not is_transient(error) or attempt >= self.options.retries:
                    yield from self._give_up(url, visit, delivered, error, attempt)
                    return
                attempt += 1
                wait_to_retry(error, attempt, self.options, self.stats)

    def _give_up(self, url, visit, delivered, error, attempts) -> Iterator[list]:
        """Raise, or (``on_error="skip"``) record the shard and yield one None per sample
        not delivered, so stream positions stay exact for resume. A shard found not to be the
        manifest's after some of its samples were delivered always raises: those samples
        were wrong, and skipping the rest would hide it."""
        if self.options.on_error == "raise" or not is_data_failure(error) or (
                isinstance(error, ShardMismatchError) and delivered):
            raise error
        known = all(span.stop is not None for span in visit)
        missing = sum(span.length for span in visit) - delivered if known else 0
        log.error("%s: skipped after %d retries (%d samples lost): %s", redact(url), attempts,
                  missing, error)  # a manifest may name presigned URLs (external shards)
        self.stats.skipped_shards.append(url)
        self.stats.skipped_samples += missing
        if missing:
            yield [None] * missing

    def _samples(self, body, visit: list[Span], wanted: list[Span],
                 last: tuple[int, str] | None = None) -> Iterator[list[dict]]:
        """The ``wanted`` samples of one shard (ranges in increasing order), in lists. Reads up
        to the visit's last sample; checks the shard's end when the visit reaches it (or when the
        shard ends before the visit does). ``last``: the position and key of the last sample
        an earlier attempt delivered, which this attempt must find again."""
        shard = visit[0].shard
        url = self.shards.urls[shard]
        limit, hashing = self._extent(shard, visit)
        source = HashingReader(body) if hashing else body
        ranges = [(span.start, span.stop) for span in wanted]
        count = 0
        key = None
        try:
            # a compressed shard is decompressed here, in the reading process; closing the
            # closing the tar closes ``body``
            body = self._open_tar(body, shard, url, source if hashing else None)
            members = self._members(body, shard, url)
            current = 0  # the range the next sample may fall in
            strays = StrayCount()  # counted once the shard was read to its end, cleanly
            for batch in sample_batches(members.batches(), url, strays,
                                        self.options.limits.sample_bytes):
                batch, end = _cut_batch(batch, count, limit, last, url)
                key = batch[-1]["__key__"]
                chosen, position, current = _wanted(batch, count, end, ranges, current)
                if chosen:
                    self._delivered += len(chosen)
                    self._last = (position, chosen[-1]["__key__"])
                    yield chosen
                count = end
                if count == limit:
                    _close_quietly(body)
                    return
        except ShardMismatchError:  # the content is wrong, however the body ends
            _close_quietly(body)
            raise
        except ShardError:
            _raise_body_failure_first(body)
            raise
        except BaseException:  # a stall, or the consumer closing the generator
            _close_quietly(body)
            raise
        body.close()  # a pipe's exit status, a fetch that failed after the last byte
        self._check_end(shard, url, count, key, members, source if hashing else None,
                        stored_bytes(body, members))
        self.stats.strays.merge(strays)

    def _extent(self, shard: int, visit: list[Span]) -> tuple[int | None, bool]:
        """Where a visit's read stops (None: the shard's end; else where the rest belongs to
        another stream), and whether the shard's digest is checked on the way."""
        table = self.shards
        expected = table.get("samples", shard)
        last_stop = visit[-1].stop
        to_end = last_stop is None or (expected is not None and last_stop >= expected)
        hashing = self.options.verify_digest and to_end and bool(table.get("sha256", shard))
        return (None if to_end else last_stop), hashing

    def _open_tar(self, body, shard: int, url: str, hashing):
        """The shard's tar: ``body`` itself, or ``body`` decompressed."""
        return open_tar(body, url, source=hashing,
                        stored_limit=self.shards.get("bytes", shard) or None,
                        limits=self.options.limits)

    def _members(self, body, shard: int, url: str):
        """The members of a shard's tar. The manifest's bytes bound a plain tar as it
        is parsed; a compressed one is bounded by its decompressor, and ``head`` is of the
        tar bytes either way."""
        table = self.shards
        head = table.get("heads", shard)
        plain = not isinstance(body, DecompressingBody)
        return iter_members(body, url, self.payload_target,
                            limit=(table.get("bytes", shard) or None) if plain else None,
                            on_head=head_check(url, head) if head else None,
                            member_limit=self.options.limits.sample_bytes)

    def _check_end(self, shard: int, url: str, count: int, key, members, hashing,
                   nbytes: int) -> None:
        """The end of a complete tar that differs from the manifest is a ShardMismatchError:
        the samples delivered came from another shard than the one described."""
        table = self.shards
        if not members.complete:
            raise ShardError(f"{url}: ended without the tar end-of-archive marker after "
                             f"{count} samples (truncated)")
        if table.samples is not None and count != table.samples[shard]:
            raise ShardMismatchError(f"{url}: ended after {count} samples; the manifest says "
                                     f"{table.samples[shard]} (truncated or replaced shard)")
        if table.bytes is not None and table.bytes[shard] and nbytes != table.bytes[shard]:
            raise ShardMismatchError(f"{url}: {nbytes} bytes read; {table.bytes[shard]} "
                                     f"recorded for it (manifest or listing)")
        last_key = table.get("last_keys", shard)
        if last_key is not None and key != last_key:
            raise ShardMismatchError(f"{url}: the last sample is {key!r}; the manifest says "
                                     f"{last_key!r} (replaced shard)")
        if hashing is not None:
            expected = table.get("sha256", shard)
            if expected and hashing.sha256.hexdigest() != expected:
                raise ShardMismatchError(f"{url}: sha256 {hashing.sha256.hexdigest()} does "
                                         f"not match the manifest's {expected}")


def _cut_batch(batch: list[dict], count: int, limit: int | None, last, url: str
               ) -> tuple[list[dict], int]:
    """A batch of the shard's samples ``count`` on, cut at ``limit``, and the position after
    it; ``last`` (an earlier attempt's last sample: position, key) must be found again."""
    end = count + len(batch)
    if limit is not None and end > limit:
        batch = batch[: limit - count]
        end = limit
    if last is not None and count <= last[0] < end and \
            batch[last[0] - count]["__key__"] != last[1]:
        raise ShardMismatchError(
            f"{url}: sample {last[0]} is {batch[last[0] - count]['__key__']!r} on "
            f"this attempt, {last[1]!r} on the one before: the shard changed "
            f"between reads")
    return batch, end


def _wanted(batch: list, count: int, end: int, ranges: list, current: int
            ) -> tuple[list, int, int]:
    """The samples of ``batch`` (at shard positions ``count`` to ``end - 1``) that fall in
    ``ranges`` (``(start, stop)``, increasing, from range ``current`` on), the position of the
    last of them, and the range the next batch starts in."""
    parts = []
    last = -1
    while current < len(ranges):
        start, stop = ranges[current]
        if stop is not None and stop <= count:
            current += 1
            continue
        first = max(start, count)
        after = end if stop is None else min(stop, end)
        if first >= after:  # the range starts after this batch
            break
        parts.append(batch if first == count and after == end
                     else batch[first - count : after - count])
        last = after - 1
        if stop is not None and stop <= end:
            current += 1
            continue
        break
    if len(parts) == 1:
        return parts[0], last, current
    return [sample for part in parts for sample in part], last, current


def _raise_body_failure_first(body) -> None:
    """A parse error on a body whose source failed is the source's failure: report that."""
    try:
        body.close()
    except StreamError:
        raise
    except Exception:  # the parse error is the one to report then
        pass


def _close_quietly(body) -> None:
    try:
        body.close()
    except Exception:  # an early close is not an error
        pass
