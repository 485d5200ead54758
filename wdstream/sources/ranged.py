"""Concurrent ranged reads of one S3 object, handed over in order.

One GET streams at one connection's share of the link; on a cloud link that share is a
fraction of what the link carries (a cap per connection, a delay before the first byte). So
the "sdk" reader starts with one GET of the rest of the object (its response gives the size
and ETag) and, once the stream has waited for that GET's bytes ``SWITCH_WAITS`` times, longer
in all than the consumer took, and the GET runs under ``ONE_GET_ENOUGH`` bytes/s, cuts it short
a part past what it delivered and fetches the rest as parts of ``PART_SIZE`` bytes, several in
flight, each on its own thread and connection, handing their bytes over in order: the part
being read is handed over as its chunks arrive, the parts after it are held until their turn.
A fast single stream (loopback, a fast in-region link) stays one GET.

How many parts are in flight follows the link, not the number of DataLoader workers: it starts
at ``INITIAL_PARTS`` and grows by one each time the stream had to wait for a part, up to
``MAX_PARTS``; a stream whose consumer is the slower side stays small. The bytes one stream
holds are bounded by ``MAX_PARTS * PART_SIZE`` (parts fetched but not yet handed over); the
first GET holds at most a part's size ahead of the stream.

The parts ask for the first response's ETag (``If-Match``), so an object replaced during the
read fails instead of mixing two versions. A part that fails with a transient error (reset,
timeout, short body, 5xx) is asked again for its remaining bytes, up to ``PART_RETRIES`` times;
then, or on a permanent error, the stream fails with that part's error. A part that ends short
of its range is a transient error; a server that ignores ``Range`` (status 200) is read as one
plain stream.
"""

from __future__ import annotations

import collections
import re
import threading
import time

from wdstream.errors import StreamError
from wdstream.sources import urls
from wdstream.sources.clients import s3_client
from wdstream.sources.failures import stream_error
from wdstream.sources.streams import CHUNK_SIZE, ChunkSource

PART_SIZE = 8 << 20
INITIAL_PARTS = 2
MAX_PARTS = 8
PART_RETRIES = 3
RETRY_BACKOFF = 0.2  # seconds before a part's first retry; doubled on each further one

SWITCH_WAITS = 4  # waits for the first GET's bytes before parts may start
ONE_GET_ENOUGH = 120e6  # bytes/s: a first GET this fast is left alone (no parts)
_OPEN_END = 1 << 62  # the first GET's end until the object's size is known
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class _Part:
    """One byte range ``[begin, end)``; its thread appends chunks, the stream takes them."""

    def __init__(self, begin: int, end: int):
        self.begin, self.end = begin, end
        self.chunks: collections.deque[bytes] = collections.deque()
        self.received = 0  # bytes appended so far
        self.pending = 0  # bytes appended and not yet taken
        self.first_byte_at: float | None = None  # time.monotonic() of its first chunk
        self.done = False
        self.error: BaseException | None = None

    @property
    def size(self) -> int:
        return self.end - self.begin


class RangedS3Source(ChunkSource):
    """A ``ChunkSource`` for ``ByteStream``: the object from ``start`` on, in parts (see above).

    ``peak_held`` is the most bytes fetched but not yet handed over at any time, ``peak_parts``
    the most parts in flight (for tests and benchmarks)."""

    def __init__(self, url: str, start: int, timeout: float, *, part_size: int = PART_SIZE,
                 max_parts: int = MAX_PARTS, initial_parts: int = INITIAL_PARTS,
                 retries: int | None = None, backoff: float = RETRY_BACKOFF):
        retries = PART_RETRIES if retries is None else retries
        if part_size <= 0 or max_parts < 1 or not 1 <= initial_parts <= max_parts:
            raise ValueError("part_size must be positive and 1 <= initial_parts <= max_parts")
        self.url, self.start, self.timeout = url, start, timeout
        self.bucket, self.key = urls.bucket_key(url)
        self.part_size, self.max_parts, self.initial_parts = part_size, max_parts, initial_parts
        self.retries, self.backoff = retries, backoff
        self._cond = threading.Condition()
        self._stopped = False
        self._size: int | None = None  # the object's size, from the first response
        self._etag: str | None = None
        self._whole = False  # the server ignored Range: part 0 is the whole object
        self._held = 0
        self.peak_held = 0
        self.peak_parts = 0

    # the consumer side (ByteStream's reader thread) ---------------------------------------

    def run(self, put):
        client = s3_client(self.timeout)
        first = _Part(self.start, _OPEN_END)  # the rest of the object, in one GET
        parts = collections.deque([first])
        self._launch(client, first)
        with self._cond:
            while self._size is None and not first.done and not self._stopped:
                self._cond.wait()
        if self._size is None:  # part 0 failed before its headers, or the stream was closed
            self._finish(first)
            return
        window = self.initial_parts
        following = first.end
        network = consumer = 0.0  # seconds waiting for the first GET's bytes / in put()
        waits = 0
        while parts or following < self._size:
            if (parts and first is parts[0] and following == first.end and not self._whole
                    and waits >= SWITCH_WAITS and network > consumer
                    and self._rate(first) < ONE_GET_ENOUGH):
                following = self._cut(first)  # the link is the slower side: go parallel
            while len(parts) < window and following < self._size and following >= first.end:
                part = _Part(following, min(following + self.part_size, self._size))
                following = part.end
                parts.append(part)
                self._launch(client, part)
            self.peak_parts = max(self.peak_parts, len(parts))
            head = parts[0]
            with self._cond:
                waited = False
                began = time.monotonic()
                while not head.chunks and not head.done and not self._stopped:
                    waited = True
                    self._cond.wait()
                if self._stopped:
                    return
                if waited and head is first:
                    waits += 1
                    network += time.monotonic() - began
                chunks = list(head.chunks)
                head.chunks.clear()
                head.pending = 0
                finished = head.done
                self._cond.notify_all()  # a part waiting for room (see _fetch_once) goes on
            if waited and head is not first and window < self.max_parts:
                window += 1  # the network was the slower side: one more part in flight
            began = time.monotonic()
            for chunk in chunks:
                with self._cond:
                    self._held -= len(chunk)
                if not put(chunk):
                    self.stop()
                    return
            consumer += time.monotonic() - began
            if finished and not head.chunks:
                self._finish(head)
                parts.popleft()

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
            first.end = min(first.end, first.begin + first.received + self.part_size)
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

    # the part threads ---------------------------------------------------------------------

    def _launch(self, client, part: _Part) -> None:
        thread = threading.Thread(target=self._fetch, args=(client, part), daemon=True,
                                  name=f"wdstream-part {part.begin} {self.url[:60]}")
        thread.start()

    def _fetch(self, client, part: _Part) -> None:
        attempt = 0
        while True:
            try:
                self._fetch_once(client, part)
                error = None
            except BaseException as exc:  # classified, retried or handed over
                error = stream_error(self.url, exc)
            with self._cond:
                stopped = self._stopped
            if error is None or stopped:
                break
            if not error.transient or attempt >= self.retries:
                break
            attempt += 1
            time.sleep(self.backoff * 2 ** (attempt - 1))
        with self._cond:
            part.error = error if not self._stopped else None
            part.done = True
            self._cond.notify_all()

    def _fetch_once(self, client, part: _Part) -> None:
        from botocore.exceptions import ClientError

        begin = part.begin + part.received
        if begin >= part.end and self._size is not None:
            return
        last = "" if part.end == _OPEN_END else part.end - 1
        request = {"Bucket": self.bucket, "Key": self.key, "Range": f"bytes={begin}-{last}"}
        if self._etag is not None:
            request["IfMatch"] = self._etag
        try:
            response = client.get_object(**request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code")
            if (code == "InvalidRange" and self._size is None
                    and error.get("ActualObjectSize") == str(begin)):
                self._learn(part, size=begin, etag=None, whole=False)  # starting at the end
                return
            if code == "PreconditionFailed":
                raise StreamError(self.url, "the object changed while it was being read "
                                  f"(its ETag is no longer {self._etag})") from exc
            raise
        body = response["Body"]
        try:
            if self._size is None:
                self._headers(part, response)
            skip = begin if self._whole else 0  # Range ignored: the body starts at byte 0
            while True:
                room = part.end - part.begin - part.received  # the end may move (_cut)
                if room <= 0:
                    break
                step = min(CHUNK_SIZE, self.part_size)
                chunk = body.read(step if skip else min(step, room))
                if not chunk:
                    break
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                    if not chunk:
                        continue
                with self._cond:
                    # a part longer than PART_SIZE (the first GET, a whole object) holds at
                    # most a part's size that the stream has not taken
                    while (part.size > self.part_size and part.pending >= self.part_size
                           and not self._stopped):
                        self._cond.wait()
                    if self._stopped:
                        return
                    chunk = chunk[:part.end - part.begin - part.received]
                    if not chunk:
                        break
                    if part.first_byte_at is None:
                        part.first_byte_at = time.monotonic()
                    part.chunks.append(chunk)
                    part.pending += len(chunk)
                    part.received += len(chunk)
                    self._held += len(chunk)
                    self.peak_held = max(self.peak_held, self._held)
                    self._cond.notify_all()
        finally:
            body.close()
        if part.received < part.size:
            raise StreamError(self.url, f"bytes {part.begin}-{part.end - 1}: the response "
                              f"ended after {part.received} of {part.size}", transient=True)

    def _headers(self, part: _Part, response: dict) -> None:
        """The object's size and ETag from the first response (206, or 200: Range ignored)."""
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        match = _CONTENT_RANGE.fullmatch(str(response.get("ContentRange") or ""))
        etag = response.get("ETag")
        if status == 206 and match:
            first, _last, size = (int(g) for g in match.groups())
            if first != part.begin:
                raise StreamError(self.url, f"asked for bytes from {part.begin}, got "
                                  f"{response.get('ContentRange')}")
            self._learn(part, size=size, etag=etag, whole=False)
        else:
            self._learn(part, size=int(response["ContentLength"]), etag=etag, whole=True)

    def _learn(self, part: _Part, *, size: int, etag: str | None, whole: bool) -> None:
        with self._cond:
            self._size, self._etag, self._whole = size, etag, whole
            part.end = size if whole else min(part.end, size)
            if part.end < part.begin:
                part.end = part.begin  # starting past the end: nothing to read
            self._cond.notify_all()
