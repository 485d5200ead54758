"""Bodies read with the socket's low-water mark raised (wdstream.sources.body_reads), through
the moto server: botocore's and urllib3's responses. ``socket_of`` is the one place that
reaches into urllib3's and http.client's objects; the first test fails when they change."""

from __future__ import annotations

import gzip
import http.server
import os
import socket
import time

import pytest
import urllib3

from tests.support.servers import http_server
from wdstream.sources.body_reads import LOW_WATER, LargeReads, socket_of


def mark(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


def test_a_large_body_is_read_with_the_mark_raised_then_lowered(s3, s3_bucket):
    client = s3.client()
    data = os.urandom(4 << 20)
    client.put_object(Bucket=s3_bucket, Key="large.bin", Body=data)
    body = client.get_object(Bucket=s3_bucket, Key="large.bin")["Body"]
    found = socket_of(body)
    assert found is not None, "botocore/urllib3/http.client changed: update socket_of"
    _http_response, sock = found
    reads = LargeReads(body)
    got = [reads.read(1 << 20)]
    assert mark(sock) == LOW_WATER
    while chunk := reads.read(1 << 20):
        got.append(chunk)
    assert b"".join(got) == data
    assert sock.fileno() == -1 or mark(sock) == 1  # pooled as it came
    reads.close()


@pytest.fixture
def keep_alive():
    """An HTTP/1.1 server on 127.0.0.1 that keeps connections open (as S3 and GCS do; moto
    closes each): GET /<n> answers n pseudo-random bytes (/gzip/<n>: gzip-encoded, /short/<n>:
    the first half, then the connection closes). Yields (base URL, bodies)."""
    bodies = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            kind, _, size = self.path.strip("/").rpartition("/")
            size = int(size)
            body = bodies.setdefault(size, os.urandom(size))
            if kind == "gzip":  # an encoded body, which urllib3 decodes when asked
                body = gzip.compress(body)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            if kind == "gzip":
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            if kind == "short":  # half the body, then the connection closes
                self.wfile.write(body[: size // 2])
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http_server(Handler) as base:
        yield base, bodies


def test_a_pooled_connection_reads_a_body_then_the_next_response(keep_alive):
    """Over one kept-alive connection, with a read timeout (reads wait in poll(), which
    honours the mark alone): a large body's tail and the next, tiny, response come at once;
    a mark above what is still to come would hold each until the timeout."""
    base, bodies = keep_alive
    pool = urllib3.PoolManager(maxsize=1, timeout=urllib3.Timeout(read=5.0))
    large = (3 << 20) + 4321
    started = time.monotonic()
    for _ in range(2):
        response = pool.request("GET", f"{base}/{large}", preload_content=False)
        assert socket_of(response) is not None, "urllib3/http.client changed: update socket_of"
        reads = LargeReads(response)
        got = b"".join(iter(lambda reads=reads: reads.read(1 << 20), b""))
        reads.close()
        response.release_conn()
        assert got == bodies[large]
        assert pool.request("GET", f"{base}/10").data == bodies[10]
    assert time.monotonic() - started < 3.0
    assert pool.pools  # one pool, one connection: every request after the first reused it
    (connections,) = [each.pool.qsize() for each in pool.pools._container.values()]
    assert connections == 1


def _connections(pool: urllib3.PoolManager) -> int:
    """Connections waiting in the pool's queue (urllib3 keeps one per reusable connection)."""
    return sum(each.pool.qsize() - list(each.pool.queue).count(None)
               for each in pool.pools._container.values())


def test_readinto_fills_the_callers_buffer_and_gives_the_connection_back(keep_alive):
    base, bodies = keep_alive
    pool = urllib3.PoolManager(maxsize=1, timeout=urllib3.Timeout(read=5.0))
    large = (3 << 20) + 4321
    buffer = memoryview(bytearray(1 << 20))
    for _ in range(2):
        response = pool.request("GET", f"{base}/{large}", preload_content=False,
                                decode_content=False)
        reads = LargeReads(response)
        got = []
        while count := reads.readinto(buffer):
            got.append(bytes(buffer[:count]))
        assert [len(each) for each in got[:3]] == [1 << 20] * 3  # full buffers until the end
        reads.close()
        assert b"".join(got) == bodies[large]
        assert _connections(pool) == 1  # back in the pool, and used again the second time
    assert pool.request("GET", f"{base}/10").data == bodies[10]


def test_readinto_of_a_body_cut_short_keeps_its_connection_out_of_the_pool(keep_alive):
    base, bodies = keep_alive
    pool = urllib3.PoolManager(maxsize=1, timeout=urllib3.Timeout(read=5.0))
    size = 1 << 20
    response = pool.request("GET", f"{base}/short/{size}", preload_content=False)
    reads = LargeReads(response)
    buffer = memoryview(bytearray(size))
    count = reads.readinto(buffer)
    assert count == size // 2 and bytes(buffer[:count]) == bodies[size][: size // 2]
    assert reads.readinto(buffer) == 0
    reads.close()
    assert _connections(pool) == 0
    assert pool.request("GET", f"{base}/10").data == bodies[10]  # a new connection


def test_readinto_of_a_body_urllib3_decodes_gives_the_decoded_bytes(keep_alive):
    base, bodies = keep_alive
    pool = urllib3.PoolManager(timeout=urllib3.Timeout(read=5.0))
    size = 300_000
    response = pool.request("GET", f"{base}/gzip/{size}", preload_content=False)
    reads = LargeReads(response)
    buffer = memoryview(bytearray(64 << 10))
    got = []
    while count := reads.readinto(buffer):
        got.append(bytes(buffer[:count]))
    reads.close()
    assert b"".join(got) == bodies[size]
