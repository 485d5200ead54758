"""The gs:// reader's concurrent ranged parts (the scheduler of ``ranged.py`` over the GCS
fetcher of ``gcs_ranges.py``), through the GCS emulator and the shaped proxy of the
benchmarks in front of it (a capped, delayed link that can also cut responses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse

import pytest

from benchmarks.shaped_link import ShapedProxy
from tests.support.servers import environ
from tests.support.shard_data import all_keys, write_dataset
from wdstream.errors import AccessError, StreamError
from wdstream.sources import ranged
from wdstream.sources.bodies import ReadAheadBody
from wdstream.sources.failures import stream_error
from wdstream.sources.gcs_ranges import object_path
from wdstream.sources.openers import open_read
from wdstream.sources.range_fetchers import HttpStatusError
from wdstream.sources.ranged import Link, RangedGcsSource

KiB = 1 << 10
PART = 64 * KiB


def upload(gcs, name: str, data: bytes) -> str:
    """Put ``data`` as object ``name`` straight into the emulator; its gs:// URL."""
    import urllib3

    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    response = urllib3.PoolManager().request(
        "POST", f"{gcs.endpoint}/upload/storage/v1/b/{gcs.bucket}/o?{query}", body=data)
    assert response.status == 200, response.data
    assert json.loads(response.data)["name"] == name
    return f"gs://{gcs.bucket}/{name}"


@pytest.fixture
def proxied(gcs):
    """make_proxy(...): a shaped proxy in front of the emulator, which the reader then uses."""
    proxies = []

    def make(rate=200e6, delay=0.0, cut=None, drop_range=False):
        proxy = ShapedProxy(gcs.port, rate, delay, cut=cut, drop_range=drop_range).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


def through(proxy):
    return environ({"STORAGE_EMULATOR_HOST": proxy.endpoint})


def sized(url: str, size: int | None, link: Link | None = None, **args):
    args.setdefault("part_size", PART)
    source = RangedGcsSource(url, 0, 10.0, size=size, link=link, **args)
    return ReadAheadBody(url, source, 10.0), source


def test_the_default_opener_reads_gs_through_parts(gcs, proxied):
    data = os.urandom(3 * (8 << 20) + 5)  # 4 parts of the default size
    url = upload(gcs, "default.bin", data)
    proxy = proxied()
    with through(proxy):
        with open_read(url) as reader:
            assert reader.read() == data
        with open_read(url, start=(8 << 20) + 7, size=len(data)) as reader:
            assert reader.read() == data[(8 << 20) + 7:]
        with open_read(url, start=len(data) - 1) as reader:
            assert reader.read() == data[-1:]
    assert proxy.requests >= 3


def test_parts_come_back_in_order_over_a_delayed_link(gcs, proxied, monkeypatch):
    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1e15)  # every part is slow: parts pay
    data = os.urandom(20 * PART + 123)
    url = upload(gcs, "ordered.bin", data)
    proxy = proxied(rate=20e6, delay=0.01)
    with through(proxy):
        reader, source = sized(url, len(data), max_parts=6, start_parts=3)
        with reader:
            assert reader.read() == data
    # the metadata (an emulator: its generation) before and after; parts of 1-2 x PART
    assert source.requests >= 11 and proxy.requests == source.requests + 2
    assert source.peak_parts > 1


def test_reads_from_the_end(gcs, proxied):
    """(The emulator takes no empty uploads.)"""
    data = os.urandom(PART + 1)
    full = upload(gcs, "full.bin", data)
    with through(proxied()):
        for url, start, expected in ((full, len(data), b""), (full, len(data) - 1, data[-1:]),
                                     (full, 0, data)):
            source = RangedGcsSource(url, start, 10.0, part_size=PART)
            with ReadAheadBody(url, source, 10.0) as reader:
                assert reader.read() == expected


@pytest.mark.parametrize("known_size", [False, True])
def test_an_object_replaced_during_the_read_fails(gcs, proxied, known_size):
    url = upload(gcs, "replaced.bin", os.urandom(16 * PART))
    proxy = proxied(rate=2e6)  # slow: it is replaced while its parts are still read
    with through(proxy):
        if known_size:
            reader, _ = sized(url, 16 * PART, max_parts=2, start_parts=2)
        else:
            reader, _ = sized(url, None, max_parts=1, initial_parts=1)
        with pytest.raises(StreamError, match="changed while it was being read"), reader:
            reader.read(1000)
            upload(gcs, "replaced.bin", os.urandom(16 * PART))
            reader.read()


def test_a_missing_object_is_a_permanent_error_naming_the_url(gcs, proxied):
    proxy = proxied()
    url = f"gs://{gcs.bucket}/no/such object.bin"
    with through(proxy):
        with pytest.raises(StreamError) as caught, open_read(url) as reader:
            reader.read()
    assert not caught.value.transient and "not found" in str(caught.value)
    assert str(caught.value).startswith(url)
    assert proxy.requests == 1  # not retried


def test_a_cut_part_is_asked_again_for_its_remaining_bytes(gcs, proxied, monkeypatch):
    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1e15)
    data = os.urandom(12 * PART)
    url = upload(gcs, "cut.bin", data)
    # request 1 is the metadata; the 2nd (the first part) and the 6th lose their connection
    proxy = proxied(rate=5e6, cut={2: 10 * KiB, 6: 10 * KiB})
    with through(proxy):
        reader, source = sized(url, len(data), backoff=0.01, start_parts=3)
        with reader:
            assert reader.read() == data
    assert source.requests >= 6 + 2 and proxy.requests == source.requests + 2  # and retries


def test_a_part_that_keeps_failing_fails_the_body(gcs, proxied):
    data = os.urandom(4 * PART)
    url = upload(gcs, "broken.bin", data)
    proxy = proxied(cut={n: 1000 for n in range(2, 40)})  # every request after the metadata
    with through(proxy):
        reader, _ = sized(url, len(data), retries=2, backoff=0.01)
        with pytest.raises(StreamError) as caught, reader:
            reader.read()
    assert caught.value.transient and str(caught.value).startswith(url)


def test_a_server_that_ignores_range_is_read_as_one_body(gcs, proxied):
    data = os.urandom(10 * PART + 3)
    url = upload(gcs, "norange.bin", data)
    with through(proxied(drop_range=True)):
        for start in (0, 3 * PART + 1):
            source = RangedGcsSource(url, start, 10.0, part_size=PART)
            with ReadAheadBody(url, source, 10.0) as reader:
                assert reader.read() == data[start:]
            assert source.peak_parts == 1


HOSTILE = ["a b?c#d%e&f+g=h.bin", "dir/sub file.bin", "100%25.bin", "q?alt=json.bin",
           "x#fragment", "caf\u00e9/\u2603.bin", "semi;colon,comma'quote\".bin"]


def test_hostile_names_fetch_exactly_that_object(gcs, proxied):
    """A name from a manifest is one object's name: percent signs, ``?``, ``#``, spaces and
    dot segments never reach another object (or another bucket)."""
    objects = {name: os.urandom(PART + n) for n, name in enumerate(HOSTILE)}
    for name, data in objects.items():
        upload(gcs, name, data)
    other = upload(gcs, "other.bin", b"the other object")
    upload(gcs, "100%.bin", b"what 100%25 must not read")
    with through(proxied()):
        for name, data in objects.items():
            with open_read(f"gs://{gcs.bucket}/{name}") as reader:
                assert reader.read() == data, name
        for name in ("dir/../other.bin", "./other.bin", "..", ".", "dir/sub file.bin/..",
                     "other.bin?", "other.bin#", "%6Fther.bin"):
            with pytest.raises(StreamError) as caught, \
                    open_read(f"gs://{gcs.bucket}/{name}", timeout=5) as reader:
                reader.read()
            assert str(caught.value).startswith(f"gs://{gcs.bucket}/{name}")
    with open_read(other) as reader:
        assert reader.read() == b"the other object"
    assert object_path("b", "..") == "/b/b/o/%2E%2E"
    assert object_path("b", "a/../b?c") == "/b/b/o/a%2F..%2Fb%3Fc"


def test_failures_go_through_the_classifier():
    url = "gs://b/k"
    denied = stream_error(url, HttpStatusError(403, "forbidden"))
    assert isinstance(denied, AccessError) and not denied.transient
    assert not stream_error(url, HttpStatusError(404, "")).transient
    for status in (408, 429, 500, 503):
        assert stream_error(url, HttpStatusError(status, "")).transient
    import urllib3

    assert stream_error(url, urllib3.exceptions.ProtocolError("reset")).transient
    assert stream_error(url, urllib3.exceptions.ReadTimeoutError(None, url, "slow")).transient


def test_the_loader_reads_a_gs_dataset_in_parts(gcs, proxied, tmp_path, monkeypatch):
    """The default loader path over gs://: the manifest's sizes reach the reader, which asks
    for several parts of a shard at once; the samples are the local ones, in order."""
    import wdstream

    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1e15)
    monkeypatch.setattr(ranged, "PART_SIZE", 1 << 20)
    monkeypatch.setitem(ranged.RangedSource.__init__.__kwdefaults__, "part_size", 1 << 20)
    folder = tmp_path / "data"
    write_dataset(folder, [12, 12], payload=300_000)  # ~3.6 MB shards: 4 parts of 1 MiB
    for path in sorted(folder.iterdir()):
        upload(gcs, f"parts/{path.name}", path.read_bytes())
    proxy = proxied(rate=50e6, delay=0.005)
    with through(proxy):
        dataset = wdstream.StreamingDataset(f"gs://{gcs.bucket}/parts/", shuffle=False,
                                            decode=False)
        keys = [sample["__key__"] for sample in dataset]
    assert keys == sorted(all_keys([12, 12]))
    # the manifest's metadata and the download that reads it; each shard's metadata before
    # and after (an emulator's downloads do not say the generation), and at least 4 parts
    assert proxy.requests >= 2 + 2 * (1 + 4 + 1)


def test_reading_gs_loads_no_google_sdk_for_an_emulator(gcs, proxied):
    url = upload(gcs, "light.bin", b"x" * 1000)
    code = ("import json, sys\n"
            "from wdstream.sources.openers import open_read\n"
            f"with open_read({url!r}) as s:\n"
            "    data = s.read()\n"
            "print(json.dumps([len(data), sorted(m for m in sys.modules\n"
            "    if m.split('.')[0] in ('gcsfs', 'google', 'fsspec', 'requests'))]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [1000, []]
