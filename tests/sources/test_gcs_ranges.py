"""The gs:// reader (``gcs_ranges.py`` under the scheduler of ``ranged.py``) against a small
fake GCS of this module: the JSON API's media download, object metadata and listing, behaving
as real GCS does where gcp-storage-emulator (``tests/sources/test_gcs_ranged.py``) does not:
every download says its generation, ``ifGenerationMatch`` answers 412, gzip-encoded objects,
empty objects, expired tokens, hostile names, listings in pages.

The reader counts any ``STORAGE_EMULATOR_HOST`` as an emulator (no credentials, metadata
asked before and after the read); the ``fake_gcs`` fixture also makes the fake server the
reader's ``GCS_ENDPOINT``, so that it is read as real GCS is.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from wdstream.errors import AccessError, StreamError
from wdstream.sources import clients, gcs_ranges, ranged
from wdstream.sources.bodies import ReadAheadBody
from wdstream.sources.openers import open_read
from wdstream.sources.ranged import Link, RangedGcsSource

KiB = 1 << 10
PART = 64 * KiB
BUCKET = "fake-bucket"
MEDIA = "/download/storage/v1/b/"
METADATA = "/storage/v1/b/"


# ------------------------------------------------------------------------------- the fake GCS


@dataclass
class Stored:
    data: bytes
    generation: int
    encoding: str = "identity"  # the object's Content-Encoding metadata


@dataclass
class Seen:
    """One request as the server received it: the raw path, query and headers."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    status: int = 0

    @property
    def media(self) -> bool:
        return self.path.startswith(MEDIA)


@dataclass
class FakeGcs:
    endpoint: str = ""
    objects: dict[tuple[str, str], Stored] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    tokens: set[str] | None = None  # bearer tokens taken (None: no authorization asked)
    replace_after: int | None = None  # media downloads served before the object is replaced
    replacement: bytes = b""
    ignore_range: bool = False  # answer 200 with the whole stored object
    drop_accept_encoding: bool = False  # a middlebox: GCS never sees Accept-Encoding: gzip
    range_on_416: bool = True  # a 416 says ``Content-Range: bytes */SIZE``
    failure: tuple[int, bytes] | None = None  # every download answered: status, body's start
    failure_sent: int = 0  # bytes of those bodies written, of 64 MiB each
    listing_body: bytes | None = None  # every listing answered with this body


    def put(self, name: str, data: bytes, encoding: str = "identity") -> str:
        self.objects[BUCKET, name] = Stored(data, 1, encoding)
        return f"gs://{BUCKET}/{name}"

    def media(self) -> list[Seen]:
        return [seen for seen in self.seen if seen.media]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        fake = self.server.fake
        path, _, query = self.path.partition("?")
        seen = Seen(path, dict(urllib.parse.parse_qsl(query, keep_blank_values=True)),
                    {k.lower(): v for k, v in self.headers.items()})
        with fake.lock:
            fake.seen.append(seen)
        try:
            self._answer(fake, seen)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the reader stopped reading a part: as it may

    def _answer(self, fake: FakeGcs, seen: Seen) -> None:
        if fake.tokens is not None and \
                seen.headers.get("authorization", "").removeprefix("Bearer ") not in fake.tokens:
            return self._error(seen, 401, "Invalid Credentials")
        if seen.media and seen.query.get("alt") == "media":
            prefix = MEDIA
        elif seen.path.startswith(METADATA) and not seen.media:
            prefix = METADATA
        else:
            return self._error(seen, 404, "Not Found")
        segments = seen.path[len(prefix):].split("/")
        if prefix == METADATA and len(segments) == 2 and segments[1] == "o":
            return self._list(fake, seen, urllib.parse.unquote(segments[0]))
        if len(segments) != 3 or segments[1] != "o":
            return self._error(seen, 404, "Not Found")
        key = (urllib.parse.unquote(segments[0]), urllib.parse.unquote(segments[2]))
        if fake.failure is not None and prefix == MEDIA:
            return self._fail_at_length(fake, seen)
        with fake.lock:
            stored = fake.objects.get(key)
            if stored is not None and prefix == MEDIA:
                if fake.replace_after is not None:
                    fake.replace_after -= 1
                    if fake.replace_after == 0:  # this one reads the old version, no later one
                        fake.objects[key] = Stored(fake.replacement, stored.generation + 1)
                now = fake.objects[key]
        if stored is None:
            return self._error(seen, 404, "No such object")
        if prefix == METADATA:
            body = json.dumps({"bucket": key[0], "name": key[1], "size": str(len(stored.data)),
                               "generation": str(stored.generation)}).encode()
            return self._send(seen, 200, body, {"Content-Type": "application/json"})
        match = seen.query.get("ifGenerationMatch")
        if match is not None and match != str(now.generation):
            return self._error(seen, 412, "Precondition Failed")
        self._media(fake, seen, stored)

    def _list(self, fake: FakeGcs, seen: Seen, bucket: str) -> None:
        """A page of the objects under ``prefix`` (a bucket with no object is missing): at
        most ``maxResults`` objects from the offset ``pageToken``, the subfolders a
        ``delimiter`` makes on the first page."""
        if fake.listing_body is not None:
            return self._send(seen, 200, fake.listing_body, {"Content-Type": "application/json"})
        with fake.lock:
            stored = {name: value for (where, name), value in fake.objects.items()
                      if where == bucket}
        if not stored:
            return self._error(seen, 404, "The specified bucket does not exist.")
        prefix, delimiter = seen.query.get("prefix", ""), seen.query.get("delimiter")
        names, folders = [], []
        for name in sorted(n for n in stored if n.startswith(prefix)):
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                folder = prefix + rest.split(delimiter)[0] + delimiter
                folders += [] if folder in folders else [folder]
            else:
                names.append(name)
        start, size = int(seen.query.get("pageToken", "0")), int(seen.query["maxResults"])
        page: dict = {"kind": "storage#objects", "items": [
            {"name": name, "size": str(len(stored[name].data)),
             "generation": str(stored[name].generation)} for name in names[start:start + size]]}
        if start == 0 and folders:
            page["prefixes"] = folders
        if start + size < len(names):
            page["nextPageToken"] = str(start + size)
        self._send(seen, 200, json.dumps(page).encode(), {"Content-Type": "application/json"})

    def _media(self, fake: FakeGcs, seen: Seen, stored: Stored) -> None:
        data, size = stored.data, len(stored.data)
        headers = {"x-goog-generation": str(stored.generation), "x-goog-metageneration": "1",
                   "x-goog-stored-content-length": str(size),
                   "x-goog-stored-content-encoding": stored.encoding,
                   "Content-Type": "application/octet-stream"}
        accepts_gzip = "gzip" in seen.headers.get("accept-encoding", "") \
            and not fake.drop_accept_encoding
        if stored.encoding == "gzip" and not accepts_gzip:
            # decompressive transcoding: Range ignored, no Content-Length nor Content-Encoding
            seen.status = 200
            self.send_response(200)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(gzip.decompress(data))
            self.close_connection = True
            return
        if stored.encoding == "gzip":
            headers["Content-Encoding"] = "gzip"  # served as stored
        asked = seen.headers.get("range", "")
        if fake.ignore_range or not asked.startswith("bytes="):
            return self._send(seen, 200, data, headers)
        first_text, _, last_text = asked[len("bytes="):].partition("-")
        first = int(first_text)
        if first >= size:
            extra = {"Content-Range": f"bytes */{size}"} if fake.range_on_416 else {}
            return self._error(seen, 416, "Requested range not satisfiable", extra)
        last = min(int(last_text), size - 1) if last_text else size - 1
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        self._send(seen, 206, data[first:last + 1], headers)

    def _error(self, seen: Seen, status: int, message: str, headers=None) -> None:
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        self._send(seen, status, body, {"Content-Type": "application/json", **(headers or {})})

    def _fail_at_length(self, fake: FakeGcs, seen: Seen) -> None:
        """The failure's status and body, then spaces up to 64 MiB, as long as they are read."""
        status, body = fake.failure
        seen.status = status
        self.send_response(status)
        self.send_header("Content-Length", str(64 << 20))
        self.end_headers()
        self.wfile.write(body)
        for _ in range(64):
            self.wfile.write(b" " * (1 << 20))
            with fake.lock:
                fake.failure_sent += 1 << 20

    def _send(self, seen: Seen, status: int, body: bytes, headers: dict[str, str]) -> None:
        seen.status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeGcs

    def handle_error(self, request, client_address) -> None:  # quiet
        pass


@pytest.fixture
def fake_gcs(monkeypatch):
    """A fake GCS on 127.0.0.1 that the reader takes for real GCS: its endpoint is both
    ``STORAGE_EMULATOR_HOST`` and ``GCS_ENDPOINT`` (responses then say their generation, and
    credentials are asked: none here, unless a test gives some)."""
    fake = FakeGcs()
    server = _Server(("127.0.0.1", 0), Handler)
    server.fake = fake
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)
    monkeypatch.setattr(gcs_ranges, "GCS_ENDPOINT", fake.endpoint)
    monkeypatch.setattr(gcs_ranges, "_default_credentials", lambda: (None, "none in this test"))
    monkeypatch.setattr(clients, "_clients", {})  # a client and a link of this test's own
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(5)


def slow_link(monkeypatch) -> None:
    """Every part is slower than one GET that needs no parts: the link wants parts."""
    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1e15)


def sized(url: str, size: int | None, start: int = 0, **args):
    args.setdefault("part_size", PART)
    source = RangedGcsSource(url, start, 10.0, size=size, **args)
    return ReadAheadBody(url, source, 10.0), source


def read_until_error(reader) -> tuple[bytes, StreamError]:
    """The bytes handed over before the read failed, and its error."""
    got = bytearray()
    with pytest.raises(StreamError) as caught, reader:
        while chunk := reader.read1(PART):
            got += chunk
    return bytes(got), caught.value


# -------------------------------------------------------------------------------------- tests


def test_parts_after_the_first_response_send_its_generation(fake_gcs, monkeypatch):
    """The start's parts go at once; those asked once a response said the generation send
    ifGenerationMatch; the bytes are the object's; no metadata is asked (real GCS's responses
    say it)."""
    slow_link(monkeypatch)
    data = os.urandom(20 * PART + 123)
    url = fake_gcs.put("parts.bin", data)
    fake_gcs.objects[BUCKET, "parts.bin"].generation = 1712345678901234
    reader, source = sized(url, len(data), max_parts=4, start_parts=3)
    with reader:
        assert reader.read() == data
    media = fake_gcs.media()
    assert len(media) == source.requests >= 10 and source.peak_parts > 1
    assert len(fake_gcs.seen) == len(media)  # no metadata requests
    # in any order: start parts asked before a response came back without it (at most the 3
    # of the start), every other with it
    generations = [seen.query.get("ifGenerationMatch") for seen in media]
    assert 1 <= generations.count(None) <= 3
    assert set(generations) == {None, "1712345678901234"}
    assert all(seen.status == 206 for seen in media)


@pytest.mark.parametrize("known_size", [True, False])
def test_an_object_replaced_during_the_read_fails(fake_gcs, monkeypatch, known_size):
    """Replaced after the first download: the next parts' stale ifGenerationMatch gets 412,
    and the read fails naming the URL, having handed over only the old version's bytes."""
    slow_link(monkeypatch)
    old = os.urandom(12 * PART)
    url = fake_gcs.put("replaced.bin", old)
    fake_gcs.replace_after, fake_gcs.replacement = 1, os.urandom(12 * PART)
    if known_size:  # one part at the start: those after it are asked once it said its generation
        reader, _ = sized(url, len(old), link=Link(window=1), max_parts=2, start_parts=1)
    else:
        link = Link()
        link.parallel = True  # a link known to want parts: the first GET is cut at once
        reader, _ = sized(url, None, link=link, max_parts=2)
    got, error = read_until_error(reader)
    assert str(error).startswith(url + ": ") and "changed while it was being read" in str(error)
    assert old.startswith(got) and len(got) < len(old)
    assert any(seen.status == 412 and seen.query.get("ifGenerationMatch") == "1"
               for seen in fake_gcs.media())


def test_a_part_of_another_generation_fails(fake_gcs, monkeypatch):
    """A part that sent no ifGenerationMatch (as one asked before the first response would)
    and comes back with another generation fails the read: never mixed versions."""
    slow_link(monkeypatch)
    old, new = os.urandom(12 * PART), os.urandom(12 * PART)
    url = fake_gcs.put("mixed.bin", old)
    fake_gcs.replace_after, fake_gcs.replacement = 1, new
    get = gcs_ranges.GcsRanges.get
    monkeypatch.setattr(gcs_ranges.GcsRanges, "get",
                        lambda self, begin, last, version: get(self, begin, last, None))
    reader, _ = sized(url, len(old), max_parts=2, start_parts=2)
    got, error = read_until_error(reader)
    assert str(error).startswith(url + ": ") and "changed while it was being read" in str(error)
    # the start parts answer in any order: the read keeps to the version it heard first
    first = re.search(r"version (1, then 2|2, then 1)", str(error)).group(1)
    assert (old if first.startswith("1") else new).startswith(got) and len(got) < len(old)
    media = fake_gcs.media()
    assert all("ifGenerationMatch" not in seen.query for seen in media)
    assert any(seen.status == 206 for seen in media[1:])  # the new version's bytes came


def gzip_object() -> tuple[bytes, bytes]:
    """(stored gzip bytes of several parts, what they decompress to: twice as long)."""
    text = os.urandom(300 * KiB).hex().encode()
    return gzip.compress(text, mtime=0), text


@pytest.mark.parametrize("ignore_range", [False, True], ids=["ranges", "whole"])
def test_a_gzip_encoded_object_reads_as_its_stored_bytes(fake_gcs, monkeypatch, ignore_range):
    """A ``Content-Encoding: gzip`` object: the reader asks for it as stored (Accept-Encoding:
    gzip, so GCS does not transcode) and hands over the stored bytes, in ranged parts or from
    a 200 with the whole stored body, from any start."""
    slow_link(monkeypatch)
    stored, _text = gzip_object()
    url = fake_gcs.put("encoded.tar.gz", stored, encoding="gzip")
    fake_gcs.ignore_range = ignore_range
    for start in (0, PART + 17):
        reader, _ = sized(url, len(stored), start=start, start_parts=2)
        with reader:
            assert reader.read() == stored[start:]
    media = fake_gcs.media()
    assert all("gzip" in seen.headers.get("accept-encoding", "") for seen in media)
    assert {seen.status for seen in media} == ({200} if ignore_range else {206})
    with open_read(url) as reader:
        assert reader.read() == stored


@pytest.mark.parametrize("known_size", [True, False])
def test_a_decompressed_response_fails_naming_the_url(fake_gcs, monkeypatch, known_size):
    """A response transcoded anyway (Accept-Encoding dropped on the way: the decompressed
    text, whose length is not the stored one) fails the read: never decompressed bytes taken
    for the stored ones."""
    slow_link(monkeypatch)
    stored, text = gzip_object()
    url = fake_gcs.put("transcoded.tar.gz", stored, encoding="gzip")
    fake_gcs.drop_accept_encoding = True
    assert len(text) > len(stored)  # what the stored length would cut short, unnoticed
    reader, _ = sized(url, len(stored) if known_size else None, start_parts=2)
    got, error = read_until_error(reader)
    assert got == b""
    assert str(error).startswith(url + ": ") and "decompress" in str(error)
    assert not error.transient
    assert fake_gcs.media()[0].status == 200


@pytest.mark.parametrize("answer", ["416", "416 without Content-Range", "200"])
def test_an_empty_object_reads_as_nothing(fake_gcs, answer):
    """A 0-byte object reads as b"", with a known size of 0 or none, whether GCS answers its
    range with 416 (saying the size, or not: the metadata says it) or with a 200."""
    url = fake_gcs.put("empty.bin", b"")
    fake_gcs.range_on_416 = answer == "416"
    fake_gcs.ignore_range = answer == "200"
    for size in (None, 0):
        reader, _ = sized(url, size)
        with reader:
            assert reader.read() == b""
        with open_read(url, size=size) as reader:
            assert reader.read() == b""
    statuses = {seen.status for seen in fake_gcs.seen}
    assert statuses == ({200} if answer == "200" else {416, 200} if "without" in answer
                        else {416})


class FakeCredentials:
    """google-auth credentials whose token is ``old`` until refreshed (then ``new``); they
    never expire by their own clock, as a token GCS refuses early (revoked, a skewed clock)."""

    def __init__(self):
        self.token = "old"
        self.refreshes = 0

    def before_request(self, request, method, url, headers) -> None:
        self.apply(headers)

    def apply(self, headers, token=None) -> None:
        headers["authorization"] = f"Bearer {token or self.token}"

    def refresh(self, request) -> None:
        self.refreshes += 1
        self.token = "new"


def test_a_refused_token_is_refreshed_once_and_the_read_goes_on(fake_gcs, monkeypatch):
    """GCS answers 401 to a token it no longer takes: the credentials are refreshed once
    (however many parts and streams met the 401) and the requests asked again."""
    slow_link(monkeypatch)
    credentials = FakeCredentials()
    monkeypatch.setattr(gcs_ranges, "_default_credentials", lambda: (credentials, None))
    fake_gcs.tokens = {"new"}
    data = os.urandom(8 * PART + 5)
    url = fake_gcs.put("token.bin", data)
    results: list[bytes | Exception] = []

    def read_one() -> None:
        try:
            with open_read(url) as reader:
                results.append(reader.read())
        except Exception as exc:  # noqa: BLE001 - compared below
            results.append(exc)

    threads = [threading.Thread(target=read_one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == [data] * 3
    reader, _ = sized(url, len(data), start_parts=3)
    with reader:
        assert reader.read() == data
    assert credentials.refreshes == 1
    refused = [seen for seen in fake_gcs.seen if seen.status == 401]
    assert 1 <= len(refused) <= 3
    assert all(seen.headers["authorization"] == "Bearer old" for seen in refused)


def test_a_token_refused_after_its_refresh_is_access_denied(fake_gcs, monkeypatch):
    """A token refused again once refreshed is a permanent AccessError naming the URL, after
    one refresh and two requests (no loop)."""
    credentials = FakeCredentials()
    monkeypatch.setattr(gcs_ranges, "_default_credentials", lambda: (credentials, None))
    fake_gcs.tokens = {"never"}
    url = fake_gcs.put("denied.bin", b"secret")
    with pytest.raises(AccessError) as caught, open_read(url) as reader:
        reader.read()
    assert str(caught.value).startswith(url + ": ") and not caught.value.transient
    assert credentials.refreshes == 1
    assert [seen.headers["authorization"] for seen in fake_gcs.seen] == \
        ["Bearer old", "Bearer new"]


HOSTILE = {
    "../../other": "..%2F..%2Fother",
    "a?b#c": "a%3Fb%23c",
    "%2e%2e": "%252e%252e",
    "..": "%2E%2E",
    ".": "%2E",
    "dir/./x/../y": "dir%2F.%2Fx%2F..%2Fy",
    "q?alt=json&ifGenerationMatch=0": "q%3Falt%3Djson%26ifGenerationMatch%3D0",
    "a b+c;d,e'f\"g": "a%20b%2Bc%3Bd%2Ce%27f%22g",
    "caf\u00e9/\u2603": "caf%C3%A9%2F%E2%98%83",
}


def test_hostile_names_request_exactly_their_own_path(fake_gcs):
    """A name from a manifest is one percent-encoded path segment: the server sees exactly
    that path (no dot segments resolved, no query or fragment split off) and serves that
    object, never another."""
    fake_gcs.put("other", b"the other object")
    objects = {name: os.urandom(100 + n) for n, name in enumerate(HOSTILE)}
    for name, data in objects.items():
        url = fake_gcs.put(name, data)
        before = len(fake_gcs.seen)
        with open_read(url) as reader:
            assert reader.read() == data, name
        seen = fake_gcs.seen[before:]
        assert [s.path for s in seen] == [f"{MEDIA}{BUCKET}/o/{HOSTILE[name]}"], name
        assert seen[0].query == {"alt": "media"}, name


def test_a_manifest_on_gcs_is_asked_its_generation_with_the_readers_client(
        fake_gcs, tmp_path, monkeypatch):
    """A manifest too small to share takes one download, which says its generation and holds
    it whole; a larger one is asked the same way, read, and shared on the node, where the
    next load finds it by that one download. gcsfs is never loaded (an import of it fails
    here, and would leave no version: more requests)."""
    import sys

    from wdstream.shards import compact, shared
    from wdstream.shards.manifest import Manifest, ShardInfo, load_manifest

    monkeypatch.setitem(sys.modules, "gcsfs", None)
    small = Manifest([ShardInfo(f"shard-{i:06d}.tar", 3, 10_240) for i in range(20)])
    large = Manifest([ShardInfo(f"shard-{i:06d}.tar", 3, 10_240)
                      for i in range(compact.SMALL + 5)])
    fake_gcs.put("small/index.json", small.to_json().encode())
    fake_gcs.put("large/index.json", large.to_json().encode())
    folder = str(tmp_path / "shared")

    def load(prefix: str) -> tuple[str, list[Seen]]:
        fake_gcs.seen.clear()
        got = load_manifest(f"gs://{BUCKET}/{prefix}/", share=folder)
        return got.to_json(), list(fake_gcs.seen)

    probe = f"bytes=0-{compact.SMALL * shared._MIN_LINE - 1}"  # the download that asks
    got, seen = load("small")
    assert got == small.to_json()
    assert [(each.media, each.headers.get("range")) for each in seen] == [(True, probe)]
    got, seen = load("large")
    assert got == large.to_json()
    assert not any(each.media for each in seen[-1:])  # its generation asked again, once read
    assert os.listdir(folder)
    got, seen = load("large")  # mapped from the node's copy
    assert got == large.to_json()
    assert [(each.media, each.headers.get("range")) for each in seen] == [(True, probe)]


def test_a_hostile_error_body_is_cut_short_and_escaped(fake_gcs):
    url = fake_gcs.put("failing.bin", os.urandom(PART))
    fake_gcs.failure = (503, json.dumps({"error": {
        "message": "Back\x1b[2Joff\u202e now"}}).encode())
    reader, _ = sized(url, PART, retries=0)
    with pytest.raises(StreamError) as caught, reader:
        reader.read()
    message = str(caught.value)
    assert caught.value.transient and "failing.bin" in message and "503" in message
    assert "Back\\x1b[2Joff\\u202e now" in message
    assert "\x1b" not in message and "\u202e" not in message
    assert fake_gcs.failure_sent < 64 << 20  # the reader did not take the whole body
