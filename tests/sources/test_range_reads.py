"""``read_at``: a small range is one request (pread, one GET through the moto server and the
GCS emulator, one fsspec read) without a read stream; transient failures are asked again as
the ranged reader's parts are, others raised at once, naming the URL without its signature;
a large range goes through the stream."""

from __future__ import annotations

import os

import pytest

from tests.sources.test_s3_ranges import put
from wdstream.errors import StreamError
from wdstream.sources import range_reads, s3_ranges

TIMEOUT = 10.0
DATA = os.urandom(300_000)


@pytest.fixture(name="gets")
def gets_fixture(monkeypatch) -> list[tuple[str, int]]:
    """(Range header, status) of each presigned GET of a ``.bin`` or ``.parquet`` object; the
    stream may not be opened."""
    real_pool = s3_ranges.direct_pool
    seen: list[tuple[str, int]] = []

    class Pool:
        def __init__(self, timeout):
            self.pool = real_pool(timeout)

        def connection_from_url(self, url):
            return Connections(self.pool.connection_from_url(url))

    class Connections:
        def __init__(self, connections):
            self.connections = connections

        def urlopen(self, method, target, headers, **kwargs):
            response = self.connections.urlopen(method, target, headers=headers, **kwargs)
            if target.split("?")[0].endswith((".bin", ".parquet")):
                seen.append((headers["Range"], response.status))
            return response

    def no_stream(*args, **kwargs):
        raise AssertionError("a small range was read through a stream")

    monkeypatch.setattr(s3_ranges, "direct_pool", Pool)
    monkeypatch.setattr(range_reads, "open_read", no_stream)
    monkeypatch.setattr(range_reads, "RETRY_BACKOFF", 0.0)
    return seen


def test_a_small_s3_range_is_one_get_of_that_range(s3, s3_bucket, gets):
    url = put(s3, s3_bucket, "tail.bin", DATA)
    assert range_reads.read_at(url, 250_000, 50_000, timeout=TIMEOUT) == DATA[250_000:]
    assert gets == [("bytes=250000-299999", 206)]


def test_past_the_end_the_range_is_short(s3, s3_bucket, gets):
    url = put(s3, s3_bucket, "short.bin", DATA)
    assert range_reads.read_at(url, 299_000, 5000, timeout=TIMEOUT) == DATA[299_000:]
    assert range_reads.read_at(url, 400_000, 10, timeout=TIMEOUT) == b""
    assert [status for _, status in gets] == [206, 416]


def test_a_missing_object_is_not_asked_again(s3, s3_bucket, gets):
    url = f"s3://{s3_bucket}/gone.parquet"
    with pytest.raises(StreamError, match=r"gone.parquet: not found") as caught:
        range_reads.read_at(url, 0, 100, timeout=TIMEOUT)
    assert not caught.value.transient and gets == [("bytes=0-99", 404)]


class _Failing:
    """A response as urllib3 gives it: a 503 whose message echoes the signed URL."""

    status, headers = 503, {}

    def __init__(self, target: str):
        self.body = f"<Error><Code>SlowDown</Code><Message>{target}</Message></Error>".encode()

    def read(self, amount=None):
        return self.body[:amount]

    def close(self):
        pass


def test_transient_failures_are_retried_then_named_without_the_signature(
        s3, s3_bucket, monkeypatch):
    url = put(s3, s3_bucket, "busy.bin", DATA)
    asked = []

    class Refusing:
        def connection_from_url(self, signed):
            return self

        def urlopen(self, method, target, **kwargs):
            asked.append(target)
            return _Failing(target)

    monkeypatch.setattr(s3_ranges, "direct_pool", lambda timeout: Refusing())
    monkeypatch.setattr(range_reads, "RETRY_BACKOFF", 0.0)
    with pytest.raises(StreamError, match=r"busy.bin: HTTP status 503") as caught:
        range_reads.read_at(url, 0, 100, timeout=TIMEOUT)
    assert len(asked) == 1 + range_reads.PART_RETRIES
    secret = asked[0].split("Signature=")[1].split("&")[0]
    assert secret and secret not in str(caught.value)
    assert caught.value.transient


def test_a_gcs_range_is_one_download(gcs):
    from tests.sources.test_gcs_ranged import upload

    url = upload(gcs, "range-reads/tail.bin", DATA)
    assert range_reads.read_at(url, 299_990, 10, timeout=TIMEOUT) == DATA[-10:]


def test_local_and_fsspec_ranges(tmp_path, monkeypatch):
    import fsspec

    path = tmp_path / "x.bin"
    path.write_bytes(DATA)
    fs = fsspec.filesystem("memory")
    fs.pipe("/range-reads/x.bin", DATA)
    monkeypatch.setattr(range_reads, "open_read", None)  # no stream for a small range
    for url in (str(path), "memory://range-reads/x.bin"):
        assert range_reads.read_at(url, 10, 1000) == DATA[10:1010]
        assert range_reads.read_at(url, 299_900, 1000) == DATA[299_900:]
    with pytest.raises(StreamError, match="missing.bin: not found"):
        range_reads.read_at(str(tmp_path / "missing.bin"), 0, 10)


def test_a_large_range_is_read_from_the_body(tmp_path, monkeypatch):
    path = tmp_path / "x.bin"
    path.write_bytes(DATA)
    monkeypatch.setattr(range_reads, "ONE_REQUEST_BYTES", 1000)
    monkeypatch.setattr(range_reads, "_ONE_REQUEST", {})
    assert range_reads.read_at(str(path), 5, 200_000) == DATA[5:200_005]


def test_a_fifo_is_an_error_not_a_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(range_reads, "RETRY_BACKOFF", 0.0)
    path = tmp_path / "pipe.parquet"
    os.mkfifo(path)
    with pytest.raises(StreamError, match="pipe.parquet"):
        range_reads.read_at(str(path), 0, 10)
