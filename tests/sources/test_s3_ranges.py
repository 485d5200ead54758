"""The S3 reader's GETs: presigned URLs over urllib3, and what still goes through botocore (a
region to follow, a refused signature, a proxy), through the moto server."""

from __future__ import annotations

import http.server
import os
import socket

import pytest

from tests.support.servers import environ, http_server
from wdstream.errors import StreamError
from wdstream.sources import ranged, s3_ranges
from wdstream.sources.bodies import ReadAheadBody
from wdstream.sources.clients import s3_client
from wdstream.sources.ranged import Link, RangedS3Source

PART = 64 << 10
TIMEOUT = 10.0


def put(s3, bucket: str, key: str, data: bytes) -> str:
    s3.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def read_in_parts(url: str, size: int, **args) -> tuple[bytes, RangedS3Source]:
    """The object read as the loader reads a shard: its size known, in parts of ``PART``
    (never larger, whatever the link's timing)."""
    source = RangedS3Source(url, 0, TIMEOUT, size=size, part_size=PART, max_part_size=PART,
                            link=Link(), **args)
    with ReadAheadBody(url, source, TIMEOUT) as reader:
        return reader.read(), source


@pytest.fixture
def counted(monkeypatch):
    """Counts of the process's botocore client's ``get_object`` calls and presignings."""
    client = s3_client(TIMEOUT)
    counts = {"get_object": 0, "presign": 0}
    get_object, presign = client.get_object, client.generate_presigned_url

    def counting_get_object(**request):
        counts["get_object"] += 1
        return get_object(**request)

    def counting_presign(*args, **kwargs):
        counts["presign"] += 1
        return presign(*args, **kwargs)

    monkeypatch.setattr(client, "get_object", counting_get_object)
    monkeypatch.setattr(client, "generate_presigned_url", counting_presign)
    return counts


class _Refusal:
    """A response as urllib3 gives it, with an S3 error status and body."""

    def __init__(self, status: int, body: bytes):
        self.status, self._body, self.headers = status, body, {}

    def read(self, amount=None):
        return self._body[:amount]

    def close(self):
        pass


def refuse_first(monkeypatch, statuses: list[int]) -> list[int]:
    """The presigned pool answers its first requests with ``statuses``, then as the server
    does; returns the statuses it is still to give."""
    pool = s3_ranges.direct_pool(TIMEOUT)
    left = list(statuses)

    class Refusing:
        def connection_from_url(self, url):
            return RefusingConnections(pool.connection_from_url(url))

    class RefusingConnections:
        def __init__(self, connections):
            self.connections = connections

        def urlopen(self, *args, **kwargs):
            if left:
                return _Refusal(left.pop(0), b"<Error><Code>Refused</Code></Error>")
            return self.connections.urlopen(*args, **kwargs)

    monkeypatch.setattr(s3_ranges, "direct_pool", lambda timeout: Refusing())
    return left


@pytest.fixture
def slow_link(monkeypatch):
    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1e15)  # parts pay on this link


def test_parts_are_presigned_gets_not_botocore_requests(s3, s3_bucket, counted, slow_link):
    data = os.urandom(10 * PART + 17)
    url = put(s3, s3_bucket, "parts.bin", data)
    got, source = read_in_parts(url, len(data))
    assert got == data
    assert source.requests == 11
    assert counted == {"get_object": 0, "presign": 1}


@pytest.mark.parametrize("status", [301, 307, 400])
def test_a_region_to_follow_sends_the_objects_gets_through_botocore(
        s3, s3_bucket, counted, slow_link, monkeypatch, status):
    data = os.urandom(6 * PART)
    url = put(s3, s3_bucket, "moved.bin", data)
    refuse_first(monkeypatch, [status])
    got, source = read_in_parts(url, len(data), start_parts=1, max_parts=1,
                                initial_parts=1)
    assert got == data
    # the refused part and every one after it went through botocore
    assert counted["get_object"] == source.requests == 6


def test_a_refused_signature_is_asked_through_botocore_then_signed_anew(
        s3, s3_bucket, counted, slow_link, monkeypatch):
    data = os.urandom(4 * PART)
    url = put(s3, s3_bucket, "expired.bin", data)
    refuse_first(monkeypatch, [403])
    got, source = read_in_parts(url, len(data), start_parts=1, max_parts=1,
                                initial_parts=1)
    assert got == data
    assert counted == {"get_object": 1, "presign": 2}
    assert source.requests == 4


def test_a_proxy_in_the_environment_sends_every_get_through_botocore(s3, s3_bucket):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unused.getsockname()[1]}"
    url = put(s3, s3_bucket, "proxied.bin", os.urandom(PART))
    with environ({"HTTP_PROXY": dead, "http_proxy": dead, "NO_PROXY": "", "no_proxy": "",
                  "AWS_MAX_ATTEMPTS": "1"}):
        assert s3_ranges.direct_pool(TIMEOUT) is None
        source = RangedS3Source(url, 0, TIMEOUT, size=PART, retries=0, link=Link())
        with pytest.raises(StreamError, match="proxied.bin") as caught, \
                ReadAheadBody(url, source, TIMEOUT) as reader:
            reader.read()  # botocore went to the proxy, which is not there
        assert caught.value.transient
    with environ({"HTTP_PROXY": dead, "http_proxy": dead, "NO_PROXY": "127.0.0.1",
                  "no_proxy": "127.0.0.1"}):
        assert s3_ranges.direct_pool(TIMEOUT) is not None


def test_a_hostile_error_body_is_cut_short_and_escaped(monkeypatch):
    sent = {"bytes": 0}

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(503)
            self.send_header("Content-Length", str(64 << 20))
            self.end_headers()
            self.wfile.write(b"<Error><Code>Slow\x1b[2JDown</Code><Message>"
                             + b"\r\n forged line" + b"</Message></Error>")
            try:
                for _ in range(64):
                    self.wfile.write(b"\0" * (1 << 20))
                    sent["bytes"] += 1 << 20
            except OSError:
                pass  # the reader went away

        def log_message(self, *args):
            pass

    with http_server(Failing) as endpoint, environ({
            "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}):
        url = "s3://bucket/failing.bin"
        source = RangedS3Source(url, 0, TIMEOUT, size=PART, retries=0, link=Link())
        with pytest.raises(StreamError) as caught, ReadAheadBody(url, source, TIMEOUT) as reader:
            reader.read()
    message = str(caught.value)
    assert caught.value.transient
    assert "failing.bin" in message and "503" in message
    assert "Slow\\x1b[2JDown" in message and "\x1b" not in message
    assert "\\r\\n forged line" in message and "\n" not in message
    assert sent["bytes"] < 64 << 20  # the reader did not take the whole body


@pytest.mark.parametrize("key", ["dir/../other.bin", "./other.bin", "dir/./../other.bin"])
def test_a_key_with_dot_segments_reads_that_object_not_another(s3, s3_bucket, counted, key):
    put(s3, s3_bucket, "other.bin", b"the other object")
    data = os.urandom(3 * PART)
    url = put(s3, s3_bucket, key, data)
    got, _source = read_in_parts(url, len(data))
    assert got == data
    assert counted["get_object"] == 0
