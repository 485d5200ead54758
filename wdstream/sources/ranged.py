"""Concurrent ranged reads of one S3 or GCS object, handed over in order.

``RangedSource`` schedules an object's parts (byte ranges, several in flight, each on its own
thread and connection) and hands their bytes over in order; ``Link`` is what a process
learned of its link to one endpoint, shared by its bodies. Each store's GET of a range is a
fetcher (``range_fetchers.py``); ``RangedS3Source`` and ``RangedGcsSource`` pair them with the
scheduler. How parts are started, sized, widened, bounded and checked: docs/internals.md,
"Ranged reads from S3 and GCS".
"""

from __future__ import annotations

import collections
import math
import threading
import time

from wdstream.errors import StreamError, WdstreamError
from wdstream.sources.bodies import CHUNK_SIZE, READ_AHEAD, BodySource, BufferPool
from wdstream.sources.clients import cached_client
from wdstream.sources.failures import stream_error
from wdstream.sources.gcs_ranges import GcsRanges
from wdstream.sources.range_fetchers import Fetcher, ObjectChanged, PastEnd, not_the_version
from wdstream.sources.s3_ranges import S3Ranges

PART_SIZE = 8 << 20
MAX_PART_SIZE = 16 << 20
START_PARTS = 8  # parts asked for at once when the size is known and the link is not yet,
START_PART_SIZE = 4 << 20  # of this size: a body's first bytes at twice a part's pace
MIN_START_PART_SIZE = 256 << 10  # the smallest, when the consumer wants few bytes first
INITIAL_PARTS = 2  # parts in flight after a first GET proved slow
AHEAD_PARTS = 1  # parts in flight of a body opened ahead, while the one before it asks
MAX_PARTS = 8
PART_RETRIES = 3
RETRY_BACKOFF = 0.2  # seconds before a part's first retry; doubled on each further one
WAIT_SHARE = 9  # a part is at least this many first-byte waits' worth of transfer

SWITCH_WAITS = 4  # waits for the first GET's bytes before parts may start
ONE_GET_ENOUGH = 120e6  # bytes/s: one connection this fast needs no parts
_OPEN_END = 1 << 62  # the first GET's end until the object's size is known


class Link:
    """What a process learned of its link to one endpoint (see the module docstring), and
    its bodies that still have parts to ask for, in the order they started."""

    def __init__(self, window: int = INITIAL_PARTS):
        self.lock = threading.Lock()
        self.parallel: bool | None = None  # True: parts pay; False: one GET is as fast
        self.window = window
        self.part_size: int | None = None  # None: the body's smallest
        self._asking: list[RangedSource] = []
        # what the part threads read into (see bodies.py): as many wait between shards as
        # were out at once, at most two bodies' bytes bound (the one read, the next opened
        # ahead) and the read-ahead
        self.buffers = BufferPool(CHUNK_SIZE, keep=(2 * MAX_PARTS * PART_SIZE + READ_AHEAD)
                                  // CHUNK_SIZE)
        # a body asked for all its parts: the start (worker start-up, the first batch) is
        # over, and bodies opened ahead take their whole window from then on
        self.started = False

    def enter(self, source: RangedSource) -> None:
        with self.lock:
            self._asking.append(source)

    def leave(self, source: RangedSource) -> None:
        """``source`` asked for its last part (or ended): the next one may use the link."""
        with self.lock:
            if source not in self._asking:
                return
            self._asking.remove(source)
            self.started = True
            following = list(self._asking)
        for other in following:
            other.nudge()

    def first_asking(self, source: RangedSource) -> bool:
        """Whether no body that started before ``source`` still has parts to ask for."""
        with self.lock:
            return not self._asking or self._asking[0] is source


def shared_link(timeout: float, scheme: str = "s3") -> Link:
    """The process's ``Link`` for the endpoint of the environment of ``scheme`` (s3, gs)."""
    return cached_client(f"{scheme}-link", scheme, timeout, Link)


class _Part:
    """One byte range ``[begin, end)``; its thread appends chunks, the body takes them."""

    def __init__(self, begin: int, end: int):
        self.begin, self.end = begin, end
        self.chunks: collections.deque[memoryview] = collections.deque()  # of lent buffers
        self.received = 0  # bytes appended so far
        self.pending = 0  # bytes appended and not yet taken
        self.asked_at: float | None = None  # time.monotonic() of its first request
        self.responded_at: float | None = None  # and of its response's headers
        self.first_byte_at: float | None = None  # and of its first chunk
        self.done_at: float | None = None
        self.done = False
        self.error: BaseException | None = None
        self.opening = False  # asked at the start of a body on a link not known yet

    @property
    def size(self) -> int:
        return self.end - self.begin


class RangedSource(BodySource):
    """A ``BodySource`` for ``ReadAheadBody``: the object of ``fetcher`` from ``start`` on, in
    parts (see above).

    ``size``: the object's size if known beforehand; ``first_bytes``: how many bytes the
    consumer wants before anything else (sizes the start's parts); ``link``: what the process
    learned of the link (None: a new one for this body alone); ``version``: the object's
    version expected (S3's ETag, GCS's generation, from a listing), sent with every part:
    when the store holds another, ``not_the_version``'s ShardMismatchError. ``peak_held`` is
    the most bytes fetched but not yet handed over at any time, ``peak_parts`` the most parts
    in flight, ``requests`` the GETs asked (for tests and benchmarks)."""

    def __init__(self, fetcher: Fetcher, start: int, timeout: float, *, size: int | None = None,
                 part_size: int = PART_SIZE, max_part_size: int | None = None,
                 max_parts: int = MAX_PARTS, initial_parts: int = INITIAL_PARTS,
                 start_parts: int = START_PARTS, start_part_size: int = START_PART_SIZE,
                 first_bytes: int | None = None, retries: int | None = None,
                 backoff: float = RETRY_BACKOFF, link: Link | None = None,
                 version: str | None = None):
        retries = PART_RETRIES if retries is None else retries
        max_part_size = part_size * MAX_PART_SIZE // PART_SIZE if max_part_size is None \
            else max_part_size
        if part_size <= 0 or max_part_size < part_size or max_parts < 1 \
                or not 1 <= initial_parts <= max_parts or start_parts < 1 \
                or start_part_size <= 0:
            raise ValueError("part sizes must be positive, max_part_size >= part_size, "
                             "1 <= initial_parts <= max_parts and start_parts >= 1")
        self.fetcher = fetcher
        self.url, self.start, self.timeout = fetcher.url, start, timeout
        self.part_size, self.max_part_size = part_size, max_part_size
        self.max_parts, self.initial_parts = max_parts, initial_parts
        self.start_parts = min(start_parts, max_parts)
        self.start_part_size = min(start_part_size, part_size)
        self._telling_size = self.start_part_size  # a part this long tells the link's rate
        if first_bytes is not None and first_bytes > 0:  # those bytes over all start parts
            self.start_part_size = min(self.start_part_size, max(
                MIN_START_PART_SIZE, -(-first_bytes // self.start_parts)))
        self._start_left = 0  # parts still to ask at the start's size
        self.retries, self.backoff = retries, backoff
        self.link = link if link is not None else Link(initial_parts)
        self._given_size = size if size is not None and size > start else None
        self._cond = threading.Condition()
        self._stopped = False
        self._size: int | None = None  # the object's size, from the first response
        self._version = version  # ETag, generation: given, or from the first response saying it
        self._expected = version
        self._whole = False  # the server ignored Range: the first part is the whole object
        self._parts: collections.deque[_Part] = collections.deque()
        self._following = start  # where the next part begins
        self._rest_as_one = False  # a fast link: the next part is the rest of the object
        self._part_size = part_size
        self._held = 0
        self._asked = False  # the consumer asked for data (ReadAheadBody's reading())
        self._nudged = False  # the window this body may use has changed
        self.peak_held = 0
        self.peak_parts = 0
        self.requests = 0

    # the consumer side (ReadAheadBody's reader thread) ---------------------------------------

    def run(self, put):
        self.link.enter(self)
        try:
            self._run(put)
        finally:
            self.link.leave(self)

    def reading(self) -> None:
        self._asked = True
        self.nudge()

    def nudge(self) -> None:
        """Wake the body to widen its window (another body left the link, or the
        consumer started reading); the first response's size does the same, so that the parts
        past a given size that fell short are asked as soon as it is in."""
        with self._cond:
            self._nudged = True
            self._cond.notify_all()

    def _allowed(self, window: int) -> int:
        """Parts this body may keep in flight: ``window``, or ``AHEAD_PARTS`` while a body
        that started before it still has parts to ask for and nobody reads this one yet."""
        if self._asked or self.link.started or self.link.first_asking(self):
            return window
        return min(window, AHEAD_PARTS)

    def _run(self, put):
        self.fetcher.connect()
        turns = _Turns(self, put)
        if not turns.start():
            return
        while self._parts or self._following < self._end():
            if not turns.step():
                return
        why = self.fetcher.check_end(self._version)
        if why is not None and not self._stopped:
            raise self._changed(why)

    def _adopt_link(self) -> tuple[bool | None, int]:
        """What the link learned: whether parts pay and its window; its part size is taken."""
        link = self.link
        with link.lock:
            if link.part_size is not None:
                self._part_size = min(max(link.part_size, self.part_size), self.max_part_size)
            return link.parallel, link.window

    def _end(self) -> int:
        """Where the object ends: its size once a response said it, else the size given when it was opened."""
        with self._cond:
            if self._size is not None:
                return self._size
            return self._given_size if self._given_size is not None else self.start

    def _launch_parts(self, window: int) -> None:
        """Parts up to ``window`` in flight, and as many as the bytes bound allows."""
        parts = self._parts
        room = max(1, self.max_parts * self.part_size // self._part_size)
        while len(parts) < min(window, room):
            end = self._end()
            with self._cond:
                begin = self._following
                if begin >= end or (parts and parts[-1].end > begin):
                    break  # nothing left, or the first GET still covers what follows
                size, opening = self._part_size, False
                if self._start_left and self.link.parallel is None:  # not learned yet
                    self._start_left -= 1
                    size, opening = self.start_part_size, True
                stop = end if self._rest_as_one else min(begin + size, end)
                part = _Part(begin, stop)
                part.opening = opening
                self._following = stop
                parts.append(part)
            self._launch(part)
        self.peak_parts = max(self.peak_parts, len(parts))

    def _observe(self, part: _Part) -> None:
        """Learn from a part as soon as it is in (before it is handed over, so that the parts
        asked next are sized by it): whether parts pay, and how large they should be."""
        if part.responded_at is None or part.done_at is None or part.asked_at is None \
                or part.received < self._telling_size or self._whole:
            return  # a small object, a short part or a short read says little of the link
        rate = part.received / max(part.done_at - part.responded_at, 1e-3)
        link = self.link
        with link.lock:
            if rate >= ONE_GET_ENOUGH:  # the latest verdict wins: a link may change
                link.parallel = False
                size = None
            elif part.end == _OPEN_END or part.size > self.max_part_size:
                return  # a single GET that the consumer kept slow says nothing of the link
            else:
                link.parallel = True
                wait = max(part.responded_at - part.asked_at, 0.0)
                wanted = math.ceil(WAIT_SHARE * wait * rate / self.part_size) * self.part_size
                # larger parts leave fewer in the bytes bound: never fewer than the link wants
                fits = max(1, self.max_parts // max(link.window, 1)) * self.part_size
                size = link.part_size = min(max(min(wanted, fits), self.part_size),
                                            self.max_part_size)
        with self._cond:
            if size is None:
                self._rest_as_one = True
            else:
                self._part_size = size

    @staticmethod
    def _rate(part: _Part) -> float:
        """Bytes/s the part has come at since its first byte."""
        if part.first_byte_at is None:
            return 0.0
        return part.received / max(time.monotonic() - part.first_byte_at, 1e-6)

    def _cut(self, first: _Part) -> int:
        """End the first GET a part's size past what it delivered; the parts after it follow
        from there. Returns where they start."""
        with self._cond:
            first.end = min(first.end, first.begin + first.received + self._part_size)
            self._cond.notify_all()
            return first.end

    def _finish(self, part: _Part) -> None:
        """Raise the part's error; a part without one must hold its whole range."""
        if part.error is not None:
            raise part.error
        if part.received != part.size and not self._stopped:
            raise StreamError(self.url, f"bytes {part.begin}-{part.end - 1}: got "
                              f"{part.received} of {part.size}", transient=True)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def recycle(self, chunk: memoryview) -> None:
        self.link.buffers.give(chunk)

    # the part threads ---------------------------------------------------------------------

    def _launch(self, part: _Part) -> None:
        thread = threading.Thread(target=self._fetch, args=(part,), daemon=True,
                                  name=f"wdstream-part {part.begin} {self.url[:60]}")
        thread.start()

    def _fetch(self, part: _Part) -> None:
        attempt = 0
        while True:
            try:
                self._fetch_once(part)
                error = None
            except BaseException as exc:  # classified, retried or handed over
                error = stream_error(self.url, exc)
            with self._cond:
                stopped = self._stopped
                if error is not None and part.received >= part.size:
                    error = None  # its range shrank to what it has (a smaller object)
            if error is None or stopped:
                break
            if not getattr(error, "transient", False) or attempt >= self.retries:
                break
            attempt += 1
            time.sleep(self.backoff * 2 ** (attempt - 1))
        with self._cond:
            part.error = error if not self._stopped else None
            part.done = True
            part.done_at = time.monotonic()
            self._cond.notify_all()
            learn = part.error is None and not self._stopped
        if learn:
            self._observe(part)

    def _fetch_once(self, part: _Part) -> None:
        begin = part.begin + part.received
        response = self._request(part, begin)
        if response is None:
            return
        try:
            if response.partial and response.first != begin:
                raise StreamError(self.url, f"asked for bytes from {begin}, got "
                                  f"{response.content_range}")
            self._learn(part, size=response.size, version=response.version,
                        whole=not response.partial)
            # Range ignored: the body starts at byte 0
            self._read_body(part, response.readinto, begin if self._whole else 0)
        finally:
            response.close()
        if part.received < part.size:
            raise StreamError(self.url, f"bytes {part.begin}-{part.end - 1}: the response "
                              f"ended after {part.received} of {part.size}", transient=True)

    def _request(self, part: _Part, begin: int):
        """The response to a GET of the part from ``begin``; None when there is nothing to
        read (the part is whole, or it begins past the object's end)."""
        with self._cond:
            if begin >= part.end and self._size is not None:
                return None
            last = None if part.end == _OPEN_END else part.end - 1
            version = self._version
            self.requests += 1
        if part.asked_at is None:
            part.asked_at = time.monotonic()
        try:
            response = self.fetcher.get(begin, last, version)
        except PastEnd as end:
            self._learn(part, size=end.size, version=None, whole=False)
            return None
        except ObjectChanged as exc:
            raise self._changed(str(exc)) from exc
        if part.responded_at is None:
            part.responded_at = time.monotonic()
        return response

    def _read_body(self, part: _Part, readinto, skip: int) -> None:
        """Read the response into lent buffers and append them to the part, dropping its
        first ``skip`` bytes, until the response or the part ends or the body stops (a stopped
        body's errors are dropped: ``_fetch``)."""
        buffers = self.link.buffers
        step = min(buffers.size, self.part_size)
        while True:
            room = part.end - part.begin - part.received  # the end may move (_cut)
            if room <= 0:
                return
            buffer = buffers.take()
            chunk = memoryview(buffer)[: step if skip else min(step, room)]
            count = readinto(chunk)
            if not count:
                buffers.give(buffer)
                return
            chunk = chunk[:count]
            if skip:
                dropped = min(skip, count)
                chunk, skip = chunk[dropped:], skip - dropped
                if not chunk:
                    buffers.give(buffer)
                    continue
            if not self._append(part, chunk):
                return

    def _append(self, part: _Part, chunk: memoryview) -> bool:
        """Hand a chunk to the body; False when the body stopped or the part's range is
        already full. A part longer than the largest part (the first GET, a
        whole object) holds at most a part's size that the body has not taken."""
        with self._cond:
            while (part.size > self.max_part_size and part.pending >= self.part_size
                   and not self._stopped):
                self._cond.wait()
            chunk = chunk[:part.end - part.begin - part.received]
            if self._stopped or not chunk:
                return False
            if part.first_byte_at is None:
                part.first_byte_at = time.monotonic()
            part.chunks.append(chunk)
            part.pending += len(chunk)
            part.received += len(chunk)
            self._held += len(chunk)
            self.peak_held = max(self.peak_held, self._held)
            self._cond.notify_all()
            return True

    def _changed(self, why: str) -> WdstreamError:
        if self._expected is not None:
            return not_the_version(self.url, self._expected)
        return StreamError(self.url, f"the object changed while it was being read ({why})")

    def _learn(self, part: _Part, *, size: int, version: str | None, whole: bool) -> None:
        with self._cond:
            if self._size is not None and size != self._size:
                raise self._changed(f"{self._size} bytes, then {size}")
            if self._version is not None and version is not None and version != self._version:
                raise self._changed(f"version {self._version}, then {version}")
            if self._size is None:
                self._nudged = True  # the first response: parts up to its size may be asked
            self._size = size
            self._version = self._version or version
            self._whole = self._whole or whole
            for each in (*self._parts, part):
                if self._whole:  # the first part reads everything, the others nothing
                    each.end = size if each.begin == self.start and each is self._parts[0] \
                        else each.begin
                else:
                    each.end = max(each.begin, min(each.end, size))
            if self._whole:
                self._following = size
            self._cond.notify_all()


class _Turns:
    """The consumer side of one ``RangedSource.run``: the single first GET while it may still
    be cut short (``first``), the parts this body may keep in flight (``window``), and the
    time it waited for the first GET's bytes against the time its consumer took. ``step``
    hands over what the first part in flight has."""

    def __init__(self, source: RangedSource, put):
        self.source, self.put = source, put
        self.first: _Part | None = None
        self.window = 0
        self.waits = 0  # waits for the first GET's bytes
        self.network = self.consumer = 0.0  # seconds waiting for them / in put()

    def start(self) -> bool:
        """Ask for the first parts; False when the body ended before any response."""
        source = self.source
        parallel, learned = source._adopt_link()
        given = source._given_size
        if given is None or parallel is False or given - source.start <= source._part_size:
            return self._start_one_get(parallel, learned)
        self.window = learned if parallel else max(source.start_parts, learned)
        if parallel is None:  # the link is not known yet: the first parts are smaller
            source._start_left = source.start_parts
        return True

    def _start_one_get(self, parallel: bool | None, learned: int) -> bool:
        """The rest of the object in one GET, cut short at once if the link wants parts."""
        source = self.source
        first = self.first = _Part(source.start, _OPEN_END)
        source._parts.append(first)
        source._launch(first)
        with source._cond:
            while source._size is None and not first.done and not source._stopped:
                source._cond.wait()
        if source._size is None:  # it failed before its headers, or the body was closed
            source._finish(first)
            return False
        source._following = first.end
        self.window = learned if parallel else source.initial_parts
        if parallel and not source._whole and first.size > source._part_size:
            source._following = source._cut(first)  # this link is known to want parts
            self.first = None
        return True

    def step(self) -> bool:
        """Ask for parts, wait for the first one's bytes and hand them over; False once the
        body stopped."""
        source = self.source
        self._switch_if_slow()
        allowed = self._ask(source._parts)
        head = source._parts[0]
        with source._cond:
            before_first_byte = head.first_byte_at is None
            waited = self._wait(head, allowed)
            if source._stopped:
                return False
            if not head.chunks and not head.done:
                return True  # its window widened: ask for more parts first
            if waited is not None and head is self.first:
                self.waits += 1
                self.network += waited
            chunks, finished = list(head.chunks), head.done
            head.chunks.clear()
            head.pending = 0
            source._cond.notify_all()  # a part waiting for room (see _append) goes on
        if waited is not None and head is not self.first:
            self._widen(head, allowed, before_first_byte)
        if not self._hand_over(chunks):
            return False
        if finished:
            source._finish(head)
            with source._cond:  # _learn goes through the parts from the part threads
                source._parts.popleft()
        return True

    def _switch_if_slow(self) -> None:
        """Cut the first GET short and go on in parts when the link is the slower side: the
        body waited for its bytes, longer than the consumer took, and it runs slow."""
        source, first = self.source, self.first
        if first is None or not source._parts or first is not source._parts[0] \
                or source._whole or source._following != first.end:
            return
        if self.waits < SWITCH_WAITS or self.network <= self.consumer \
                or source._rate(first) >= ONE_GET_ENOUGH:
            return
        source._following = source._cut(first)
        self.first = None
        with source.link.lock:
            source.link.parallel = True

    def _ask(self, parts: collections.deque[_Part]) -> int:
        """Launch the parts the body may have in flight now; returns how many that is."""
        source = self.source
        with source._cond:
            source._nudged = False  # a nudge from here on ends the wait in _wait
        allowed = source._allowed(self.window)
        source._launch_parts(allowed)
        if source._following >= source._end():
            source.link.leave(source)  # every part asked: the next body may use the link
        return allowed

    def _wait(self, head: _Part, allowed: int) -> float | None:
        """Wait (the condition held) until ``head`` has bytes or ends, the body stops, or a
        nudge lets it ask for more parts; the seconds waited, None if it did not wait."""
        source = self.source
        began = time.monotonic()
        waited = False
        while not (head.chunks or head.done or source._stopped or (
                source._nudged and (allowed < self.window or len(source._parts) < allowed))):
            waited = True
            source._cond.wait()
        return time.monotonic() - began if waited else None

    def _widen(self, head: _Part, allowed: int, before_first_byte: bool) -> None:
        """The network was the slower side: one more part in flight. Not before a part came
        in (waits for the first parts' first bytes only show the link's delay); at the most,
        the link learns that this body wanted them all (past its start, whose parts all
        began together: a wait for the first one says nothing of how many the link wants)."""
        source = self.source
        if allowed != self.window or not source.link.parallel:
            return
        if head.opening and (before_first_byte or self.window >= source.max_parts):
            return
        self.window = min(self.window + 1, source.max_parts)
        with source.link.lock:
            source.link.window = max(source.link.window, self.window)

    def _hand_over(self, chunks: list[memoryview]) -> bool:
        """Put the chunks to the consumer; False when it wants no more."""
        source = self.source
        began = time.monotonic()
        for chunk in chunks:
            with source._cond:
                source._held -= len(chunk)
            if not self.put(chunk):
                source.stop()
                return False
        self.consumer += time.monotonic() - began
        return True


class RangedS3Source(RangedSource):
    """An S3 object (``s3://bucket/key``) read in ranged parts, presigned by botocore."""

    def __init__(self, url: str, start: int, timeout: float, **options):
        super().__init__(S3Ranges(url, timeout), start, timeout, **options)


class RangedGcsSource(RangedSource):
    """A GCS object (``gs://bucket/name``) read in ranged parts over the JSON API."""

    def __init__(self, url: str, start: int, timeout: float, **options):
        super().__init__(GcsRanges(url, timeout), start, timeout, **options)
