"""The S3 reader's concurrent ranged parts, through the moto server and the shaped proxy of the
benchmarks (a capped, delayed link that can also cut responses)."""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.shaped_link import ShapedProxy
from tests.support.servers import environ
from tests.support.shard_data import all_keys, write_dataset
from wdstream.errors import StreamError
from wdstream.sources import bodies, ranged
from wdstream.sources.bodies import (
    CHUNK_SIZE,
    READ_AHEAD,
    BodySource,
    BufferPool,
    ReadAheadBody,
)
from wdstream.sources.openers import open_read
from wdstream.sources.ranged import Link, RangedS3Source

KiB = 1 << 10
PART = 64 * KiB


@pytest.fixture
def proxied(s3, s3_bucket):
    """(bucket, make_proxy): a proxy in front of moto whose endpoint the client uses."""
    proxies = []

    def make(rate=200e6, delay=0.0, cut=None, drop_range=False):
        proxy = ShapedProxy(s3.port, rate, delay, cut=cut, drop_range=drop_range).start()
        proxies.append(proxy)
        return proxy

    yield s3_bucket, make
    for proxy in proxies:
        proxy.stop()


def put(s3, bucket: str, key: str, data: bytes) -> str:
    s3.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def stream(url: str, source_args: dict | None = None, start: int = 0):
    source = RangedS3Source(url, start, 10.0, part_size=PART, **(source_args or {}))
    return ReadAheadBody(url, source, 10.0), source


def slow_link(monkeypatch) -> None:
    """Every part is slower than one GET that needs no parts: the link wants parts."""
    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1e15)


def sized(url: str, size: int, link: Link | None = None, **args):
    """A stream that knows the object's size beforehand, as the loader does from a manifest."""
    args.setdefault("part_size", PART)
    source = RangedS3Source(url, 0, 10.0, size=size, link=link, **args)
    return ReadAheadBody(url, source, 10.0), source


def test_parts_come_back_in_order_over_a_delayed_link(s3, proxied):
    bucket, make = proxied
    data = os.urandom(20 * PART + 123)
    url = put(s3, bucket, "ordered.bin", data)
    proxy = make(rate=20e6, delay=0.01)
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = stream(url, {"max_parts": 6, "initial_parts": 2})
        with reader:
            assert reader.read() == data
    # the first GET was cut short once the link proved the slower side; parts followed
    assert 2 < proxy.requests <= 21
    assert 2 < source.peak_parts <= 6  # it widened: the link was the slower side


@pytest.mark.slow
def test_the_default_sdk_opener_reads_through_parts(s3, proxied):
    bucket, make = proxied
    data = os.urandom(3 * (8 << 20) + 5)  # 4 parts of the default size
    url = put(s3, bucket, "default.bin", data)
    proxy = make()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        with open_read(url) as reader:
            assert reader.read() == data
        with open_read(url, start=(8 << 20) + 7) as reader:
            assert reader.read() == data[(8 << 20) + 7:]
    assert 2 <= proxy.requests <= 4 + 2


def test_a_cut_part_is_asked_again_for_its_remaining_bytes(s3, proxied):
    bucket, make = proxied
    data = os.urandom(12 * PART)
    url = put(s3, bucket, "cut.bin", data)
    # the 1st request and the 6th lose their connection 10 KiB into the body
    proxy = make(rate=5e6, cut={1: 10 * KiB, 6: 10 * KiB})
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = stream(url, {"backoff": 0.01})
        with reader:
            assert reader.read() == data
    assert source.peak_parts > 1 and proxy.requests > 6


def test_a_part_that_keeps_failing_fails_the_body(s3, proxied):
    bucket, make = proxied
    data = os.urandom(4 * PART)
    url = put(s3, bucket, "broken.bin", data)
    proxy = make(cut={n: 1000 for n in range(1, 40)})  # every request
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, _source = stream(url, {"retries": 2, "backoff": 0.01})
        with pytest.raises(StreamError) as caught, reader:
            reader.read()
    assert caught.value.transient
    assert "broken.bin" in str(caught.value)


def test_a_response_shorter_than_its_range_is_an_error_not_data(s3, proxied):
    bucket, make = proxied
    data = os.urandom(2 * PART)
    url = put(s3, bucket, "short.bin", data)
    proxy = make(cut={1: 300, 2: 300})  # the only part, and its one retry, end early
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, _source = stream(url, {"retries": 1, "backoff": 0.01, "max_parts": 1,
                                       "initial_parts": 1})
        with pytest.raises(StreamError), reader:
            reader.read()


@pytest.mark.parametrize("known_size", [False, True])
def test_an_object_replaced_during_the_read_fails(s3, proxied, known_size):
    bucket, make = proxied
    url = put(s3, bucket, "replaced.bin", os.urandom(16 * PART))
    proxy = make(rate=2e6)  # slow: it is replaced before the parts after the first ones start
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        if known_size:
            reader, _source = sized(url, 16 * PART, max_parts=2, start_parts=2)
        else:
            reader, _source = stream(url, {"max_parts": 1, "initial_parts": 1})
        with pytest.raises(StreamError, match="changed while it was being read"), reader:
            reader.read(1000)
            put(s3, bucket, "replaced.bin", os.urandom(16 * PART))
            reader.read()


def test_empty_objects_and_reads_from_the_end(s3, proxied):
    bucket, make = proxied
    empty = put(s3, bucket, "empty.bin", b"")
    data = os.urandom(PART + 1)
    full = put(s3, bucket, "full.bin", data)
    proxy = make()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        for url, start, expected in ((empty, 0, b""), (full, len(data), b""),
                                     (full, len(data) - 1, data[-1:])):
            reader, _source = stream(url, start=start)
            with reader:
                assert reader.read() == expected


def test_memory_stays_bounded_by_the_parts_in_flight(s3, proxied):
    bucket, make = proxied
    data = os.urandom(40 * PART)
    url = put(s3, bucket, "bounded.bin", data)
    proxy = make()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = stream(url, {"max_parts": 3, "initial_parts": 3})
        got = []
        with reader:
            while piece := reader.read(PART // 2):
                got.append(piece)
                time.sleep(0.002)  # a slow consumer: parts pile up to their bound, no more
        assert b"".join(got) == data
    assert source.peak_held <= 3 * PART
    assert source.peak_parts <= 3


def test_a_missing_object_is_a_permanent_error(s3, proxied):
    bucket, make = proxied
    proxy = make()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, _source = stream(f"s3://{bucket}/nope.bin")
        with pytest.raises(StreamError) as caught, reader:
            reader.read()
    assert not caught.value.transient
    assert proxy.requests == 1


def test_a_server_that_ignores_range_is_read_as_one_bounded_body(s3, proxied):
    bucket, make = proxied
    data = os.urandom(10 * PART + 3)
    url = put(s3, bucket, "norange.bin", data)
    proxy = make(drop_range=True)
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        for start in (0, 3 * PART + 1):
            reader, source = stream(url, start=start)
            with reader:
                assert reader.read() == data[start:]
            assert source.peak_parts == 1
    assert proxy.requests == 2


# --------------------------------------------------------------------------- sizes and links


def test_a_known_size_asks_for_several_parts_at_once(s3, proxied):
    bucket, make = proxied
    data = os.urandom(12 * PART + 5)
    url = put(s3, bucket, "known.bin", data)
    proxy = make(rate=10e6, delay=0.05)
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = sized(url, len(data), start_parts=4)
        with reader:
            first = reader.read(PART + 1)
            # all of them were on their way before the first was read
            assert source.requests >= 4 and source.peak_parts >= 4
            assert first + reader.read() == data
        # without the size: one GET first, parts only once it proved slow
        reader, source = stream(url)
        with reader:
            reader.read(1)
            assert source.requests == 1
            assert reader.read() == data[1:]


def test_a_body_starts_with_smaller_parts_until_the_link_is_known(s3, proxied,
                                                                    monkeypatch):
    """On a link not known yet, the first parts of a stream of known size are of the start's
    size (its first bytes come at twice a part's pace), the link is learned from them, and the
    parts after them, and those of the next stream, are of the usual size."""
    slow_link(monkeypatch)
    bucket, make = proxied
    part = 4 * PART  # long enough for a rate to measure
    data = os.urandom(8 * part + 5)
    url = put(s3, bucket, "start.bin", data)
    # slow enough that the first part is still coming when the others are asked (once its
    # response is in): what a part teaches sizes only the parts asked after it is in
    proxy = make(rate=4e5, delay=0.02)
    link = Link()
    asked = [[], []]  # the sizes of the parts each stream asked for
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        for sizes in asked:
            reader, source = sized(url, len(data), link, start_parts=4, part_size=part,
                                   start_part_size=part // 2)
            launch = source._launch
            monkeypatch.setattr(source, "_launch",
                                lambda each, launch=launch, sizes=sizes: sizes.append(each.size)
                                or launch(each))
            with reader:
                assert reader.read() == data
            assert link.parallel is True
    first, second = asked
    assert first[:4] == [part // 2] * 4 and len(first) > 5
    assert set(first[4:-1]) <= {part, 2 * part}  # then the usual size (the last: what is left)
    assert part // 2 not in second[:-1]  # the link is known: no start parts


def test_the_start_parts_carry_the_first_bytes_together(s3, proxied, monkeypatch):
    """The bytes the consumer wants first (a first batch) are spread over the start's parts,
    all asked at once, not one after another's response."""
    slow_link(monkeypatch)
    bucket, make = proxied
    data = os.urandom(32 * PART)
    url = put(s3, bucket, "first-bytes.bin", data)
    proxy = make(rate=2e6, delay=0.05)
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = sized(url, len(data), Link(), start_parts=4, part_size=8 * PART,
                               first_bytes=16 * PART)
        parts = []
        launch = source._launch
        monkeypatch.setattr(source, "_launch",
                            lambda part: parts.append(part) or launch(part))
        with reader:
            assert reader.read() == data
    start = parts[:4]
    assert [part.size for part in start] == [ranged.MIN_START_PART_SIZE] * 4  # 1 MiB / 4
    # the fourth was asked before the first one's response, 50 ms on its way, came in
    assert start[3].asked_at < start[0].responded_at
    assert [part.size for part in parts[4:-1]] == [8 * PART] * (len(parts) - 5)


def test_a_loader_tells_the_first_shards_reader_its_first_batchs_bytes(tmp_path, monkeypatch):
    """The first batch's bytes, from the manifest's sizes and counts, reach the first shard's
    reader only."""
    import wdstream
    from wdstream.stream.read import shard_reader as read

    folder = tmp_path / "data"
    write_dataset(folder, [24, 24], payload=40_000)
    asked = []
    opener = read.open_read
    monkeypatch.setattr(read, "open_read", lambda url, **options: asked.append(
        (Path(url).name, options["size"], options["first_bytes"])) or opener(url, **options))
    dataset = wdstream.StreamingDataset(str(folder), shuffle=False)
    loader = wdstream.DataLoader(dataset, batch_size=8, num_workers=0)
    assert sum(len(batch["__key__"]) for batch in loader) == 48
    (first, size, first_bytes), *others = asked
    assert first_bytes == -(-size * 8 // 24)  # 8 of its 24 samples
    assert [each[2] for each in others] == [None]


@pytest.mark.slow
def test_a_body_kept_waiting_with_its_whole_window_teaches_it(s3, proxied,
                                                                monkeypatch):
    """A first stream that, past its start, was kept waiting with all the parts it may have
    in flight tells the link so: the next streams start with that window, not the initial
    one."""
    slow_link(monkeypatch)
    bucket, make = proxied
    part = 4 * PART
    data = os.urandom(12 * part)
    url = put(s3, bucket, "whole-window.bin", data)
    proxy = make(rate=2e6, delay=0.02)
    link = Link()
    assert link.window == ranged.INITIAL_PARTS < 4
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = sized(url, len(data), link, start_parts=4, max_parts=4, part_size=part)
        with reader:
            assert reader.read() == data
    assert link.parallel is True and link.window == 4 and source.peak_parts == 4


def test_a_part_shorter_than_the_start_size_tells_nothing_of_the_link():
    """A small part (a first batch's) whose bytes were all in when its headers were read
    looks like a fast link; it must not make the process read everything as one GET."""
    source = RangedS3Source("s3://bucket/key", 0, 10.0, size=64 << 20, link=Link(),
                            first_bytes=1 << 20)
    assert source.start_part_size == ranged.MIN_START_PART_SIZE
    part = ranged._Part(0, source.start_part_size)
    part.received = part.size
    part.asked_at, part.responded_at, part.done_at = 0.0, 0.03, 0.0301  # 26 GB/s
    source._observe(part)
    assert source.link.parallel is None
    part = ranged._Part(0, ranged.START_PART_SIZE)
    part.received = part.size
    part.asked_at, part.responded_at, part.done_at = 0.0, 0.03, 0.0301
    source._observe(part)
    assert source.link.parallel is False  # a part of the start's size does tell


@pytest.mark.parametrize("planned", [3 * PART, 20 * PART + 17])
def test_a_wrong_size_beforehand_is_only_a_plan(s3, proxied, planned):
    """A manifest may be wrong or the object replaced: the bytes read are the object's."""
    bucket, make = proxied
    data = os.urandom(9 * PART + 1)
    url = put(s3, bucket, "planned.bin", data)
    proxy = make(rate=50e6, delay=0.01)
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, _source = sized(url, planned, start_parts=4)
        with reader:
            assert reader.read() == data


def test_what_a_body_learns_the_next_one_starts_with(s3, proxied, monkeypatch):
    """The next shard, opened while the current one is read (which has asked for all its
    parts: the object fits its read-ahead), fetches parts at once, of the size and as many as
    the link proved to need."""
    slow_link(monkeypatch)
    bucket, make = proxied
    part = 4 * PART  # long enough for a rate to measure
    data = os.urandom(16 * part)
    current, following = (put(s3, bucket, name, data) for name in ("current.bin", "next.bin"))
    proxy = make(rate=10e6, delay=0.05)
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        # a bytes bound of 16 parts: twice as large ones leave room for the window
        reader, source = sized(current, len(data), link, start_parts=2, max_parts=16,
                               part_size=part)
        with reader:
            assert reader.read(len(data) // 2) == data[: len(data) // 2]
            assert link.parallel is True and 2 < link.window <= 8
            # 9 first-byte waits of 50 ms at the measured rate is well past the largest part
            assert link.part_size == 2 * part
            ahead, ahead_source = sized(following, len(data), link, max_parts=6, part_size=part)
            deadline = time.monotonic() + 5
            while ahead_source.peak_parts < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            with ahead_source._cond:  # nobody reads it yet: its parts are all still there
                requests = [each.size for each in ahead_source._parts]
            # read ahead, several parts (of the larger size) in flight, before anything was
            # asked of it
            assert ahead_source.peak_parts == 3 and requests[:1] == [2 * part]
            assert reader.read() == data[len(data) // 2:]
        with ahead:
            assert ahead.read() == data
        assert ahead_source.peak_parts <= 6  # the bytes bound, in parts of either size
        assert ahead_source.peak_held <= 6 * part


def test_a_fast_link_reads_the_rest_as_one_get(s3, proxied, monkeypatch):
    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1.0)  # every part counts as fast
    bucket, make = proxied
    data = os.urandom(30 * PART)
    url = put(s3, bucket, "fast.bin", data)
    proxy = make()
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = sized(url, len(data), link, start_parts=2)
        with reader:
            assert reader.read() == data
        assert link.parallel is False
        assert source.requests <= 2 + 1  # the first parts, then the rest in one GET
        # the next stream of this link: one GET from the start, size known or not
        reader, source = sized(url, len(data), link)
        with reader:
            assert reader.read() == data
        assert source.requests == 1


@pytest.mark.slow
def test_the_loader_asks_for_parts_from_the_manifests_sizes(s3, proxied, tmp_path,
                                                            monkeypatch):
    """The default loader path: the manifest's shard sizes reach the S3 reader, which asks
    for several parts at once (here the link then proves fast: the rest is one GET)."""
    import wdstream

    monkeypatch.setattr(ranged, "ONE_GET_ENOUGH", 1.0)
    bucket, make = proxied
    folder = tmp_path / "data"
    write_dataset(folder, [24, 24], payload=400_000)  # ~9.6 MB shards: 2 parts of 8 MiB
    client = s3.client()
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), bucket, f"parts/{path.name}")
    proxy = make()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        dataset = wdstream.StreamingDataset(f"s3://{bucket}/parts/", shuffle=False,
                                            decode=False)
        keys = [sample["__key__"] for sample in dataset]
    assert keys == sorted(all_keys([24, 24]))
    # the manifest, then both parts of the first shard at once; the second shard's
    assert proxy.requests >= 1 + 2 + 1


# --------------------------------------------------------------------------- streams of a link


def _wait_for(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


@pytest.mark.slow
def test_a_body_opened_ahead_waits_with_one_part_for_the_one_before(s3, proxied,
                                                                monkeypatch):
    """The shard being read has the link first: the next one, opened ahead, keeps one part in
    flight until the current one has asked for its last part, then as many as the link needs."""
    from wdstream.sources import bodies

    slow_link(monkeypatch)
    bucket, make = proxied
    part = 4 * PART
    current_data, ahead_data = os.urandom(16 * part), os.urandom(32 * part)
    current_url = put(s3, bucket, "current.bin", current_data)
    ahead_url = put(s3, bucket, "ahead.bin", ahead_data)
    proxy = make(rate=10e6, delay=0.05)
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        monkeypatch.setattr(bodies, "READ_AHEAD", part)  # the current one waits for its reader
        current, current_source = sized(current_url, len(current_data), link, start_parts=2,
                                        max_parts=4, part_size=part)
        with current:
            assert current.read(part) == current_data[:part]
            monkeypatch.setattr(bodies, "READ_AHEAD", 64 * part)  # the next one does not
            ahead, ahead_source = sized(ahead_url, len(ahead_data), link, max_parts=4,
                                        part_size=part)
            assert _wait_for(lambda: ahead_source.requests >= 3)
            assert ahead_source.peak_parts == 1  # one after the other, while current asks
            assert current.read() == current_data[part:]
        # the current one asked for its last part: the next one widens, unread
        assert _wait_for(lambda: ahead_source.peak_parts > 1)
        with ahead:
            assert ahead.read() == ahead_data
        assert current_source.peak_parts > 1


def test_once_a_body_asked_all_its_parts_bodies_opened_ahead_are_not_held(
        s3, proxied, monkeypatch):
    """Holding a stream opened ahead to one part is for the start (up to the first batch):
    once a stream of the link has asked for all its parts, the next ones opened ahead keep
    as many parts in flight as the link needs, while the current one is still read."""
    from wdstream.sources import bodies

    slow_link(monkeypatch)
    bucket, make = proxied
    part = 4 * PART
    first_data, current_data = os.urandom(2 * part), os.urandom(16 * part)
    ahead_data = os.urandom(32 * part)
    first_url = put(s3, bucket, "first.bin", first_data)
    current_url = put(s3, bucket, "current.bin", current_data)
    ahead_url = put(s3, bucket, "ahead.bin", ahead_data)
    proxy = make(rate=10e6, delay=0.05)
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        first, _ = sized(first_url, len(first_data), link, max_parts=4, part_size=part)
        with first:
            assert first.read() == first_data
        assert link.started
        monkeypatch.setattr(bodies, "READ_AHEAD", part)  # the current one waits for its reader
        current, _ = sized(current_url, len(current_data), link, start_parts=2, max_parts=4,
                           part_size=part)
        with current:
            assert current.read(part) == current_data[:part]
            monkeypatch.setattr(bodies, "READ_AHEAD", 64 * part)
            ahead, ahead_source = sized(ahead_url, len(ahead_data), link, max_parts=4,
                                        part_size=part)
            assert _wait_for(lambda: ahead_source.peak_parts > 1)  # the current one still asks
            assert current.read() == current_data[part:]
        with ahead:
            assert ahead.read() == ahead_data


def test_a_body_being_read_is_not_held_back_by_an_earlier_one(s3, proxied, monkeypatch):
    """Two streams read in turns (a mix of datasets): each has as many parts as it needs; and
    closing a stream early lets the next one widen."""
    from wdstream.sources import bodies

    slow_link(monkeypatch)
    monkeypatch.setattr(bodies, "READ_AHEAD", 4 * PART)
    bucket, make = proxied
    part = 4 * PART
    data = os.urandom(24 * part)
    first_url, second_url, third_url = (put(s3, bucket, f"turns-{n}.bin", data)
                                        for n in range(3))
    proxy = make(rate=10e6, delay=0.05)
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        first, _ = sized(first_url, len(data), link, start_parts=2, max_parts=4, part_size=part)
        second, second_source = sized(second_url, len(data), link, start_parts=2, max_parts=4,
                                      part_size=part)
        got = {first: b"", second: b""}
        with first, second:
            for _ in range(6):
                for reader in (first, second):
                    got[reader] += reader.read(part)
            assert second_source.peak_parts > 1
            monkeypatch.setattr(bodies, "READ_AHEAD", 64 * part)  # not waiting for its reader
            third, third_source = sized(third_url, len(data), link, max_parts=4,
                                        part_size=part)
            with third:
                assert _wait_for(lambda: third_source.requests >= 1)
                time.sleep(0.3)
                assert third_source.peak_parts == 1
                first.close()
                second.close()  # closed early, parts left unasked: the link is the third's
                assert _wait_for(lambda: third_source.peak_parts > 1)
                assert third.read() == data
        assert got[first] == got[second] == data[:6 * part]


def test_the_window_grows_only_once_a_part_came_in(s3, proxied, monkeypatch):
    """Waiting for the first parts' first bytes shows the link's delay, not that more parts
    would help: no part beyond the first ones until one is in."""
    slow_link(monkeypatch)
    bucket, make = proxied
    part = 2 << 20  # two reads of the part thread: the first one is handed over alone
    data = os.urandom(6 * part)
    url = put(s3, bucket, "growing.bin", data)
    proxy = make(rate=10e6, delay=0.1)  # a part takes ~0.2 s once its first byte came
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        reader, source = sized(url, len(data), link, start_parts=2, max_parts=6,
                               part_size=part)
        with reader:
            reader.read(1)
            time.sleep(0.03)
            assert link.parallel is None and source.peak_parts == 2
            assert reader.read() == data[1:]
        assert link.parallel is True and source.peak_parts > 2


@pytest.mark.slow
def test_a_manifests_version_on_s3_is_one_head_with_the_readers_client(s3, proxied):
    """What the shared manifest asks of S3 before reading (``object_version``) takes the
    reader's botocore client, in a fresh process: one HEAD through the link, no second SDK."""
    import json
    import subprocess

    bucket, make = proxied
    url = put(s3, bucket, "versioned/index.json", b"{}" * 100)
    proxy = make(delay=0.01)
    code = ("import json, sys\n"
            "from wdstream.shards.shared import object_version\n"
            f"version = object_version({url!r})\n"
            "print(json.dumps([version, 's3fs' in sys.modules, 'aiobotocore' in sys.modules]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint))
    assert run.returncode == 0, run.stderr
    version, s3fs_loaded, aiobotocore_loaded = json.loads(run.stdout)
    etag = s3.client().head_object(Bucket=bucket, Key="versioned/index.json")["ETag"]
    assert version == {"size": 200, "ETag": etag}
    assert not s3fs_loaded and not aiobotocore_loaded
    assert proxy.requests == 1


@pytest.mark.slow
def test_a_small_manifest_on_s3_is_read_with_its_version_in_one_request(s3, proxied, tmp_path):
    """Loading a manifest too small to share takes one request through the link: the GET
    that asks its version reads it whole (a HEAD and then a GET took two). A larger one is
    asked the same way, then shared as before; a server that ignores the range gives the same
    manifest."""
    import json
    import subprocess

    from wdstream.shards import compact
    from wdstream.shards.manifest import Manifest, ShardInfo

    bucket, make = proxied
    small = Manifest([ShardInfo(f"shard-{i:06d}.tar", 3, 10_240) for i in range(20)])
    large = Manifest([ShardInfo(f"shard-{i:06d}.tar", 3, 10_240)
                      for i in range(compact.SMALL + 5)])
    put(s3, bucket, "small/index.json", small.to_json().encode())
    put(s3, bucket, "large/index.json", large.to_json().encode())
    code = ("import json, sys\n"
            "from wdstream.shards.manifest import load_manifest\n"
            "got = load_manifest(sys.argv[1], share=sys.argv[2])\n"
            "print(json.dumps(got.to_json()))\n")

    def load(proxy, prefix: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", code, f"s3://{bucket}/{prefix}/", str(tmp_path / "shared")],
            capture_output=True, text=True, timeout=60,
            env=dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint))
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)

    proxy = make(delay=0.01)
    assert load(proxy, "small") == small.to_json()
    assert proxy.requests == 1
    assert load(proxy, "large") == large.to_json()  # parsed, and published on this node
    asked = proxy.requests
    assert load(proxy, "large") == large.to_json()  # mapped from the node's copy
    assert proxy.requests == asked + 1  # its version asked, nothing read
    assert load(make(drop_range=True), "small") == small.to_json()


class LendingSource(BodySource):
    """Lends views of its own buffers in pieces of ``sizes`` (in turn), as the ranged reader
    does. A buffer given back is overwritten at once: a byte taken from it afterwards shows."""

    def __init__(self, data: bytes, sizes: list[int]):
        self.data, self.sizes = data, sizes
        self.pool = BufferPool(size=max(sizes))
        self.lent = self.returned = 0

    def run(self, put):
        at = 0
        for size in itertools.cycle(self.sizes):
            if at >= len(self.data):
                return
            piece = self.data[at : at + size]
            buffer = self.pool.take()
            buffer[: len(piece)] = piece
            self.lent += 1
            if not put(memoryview(buffer)[: len(piece)]):
                return
            at += len(piece)

    def recycle(self, chunk):
        chunk.obj[:] = b"\xff" * len(chunk.obj)
        self.returned += 1
        self.pool.give(chunk)


def _read_all(reader, how: str) -> bytes:
    if how == "read":
        return reader.read()
    got = []
    if how == "readinto":
        buffer = bytearray(3000)
        while count := reader.readinto(buffer):
            got.append(bytes(buffer[:count]))
    else:
        read = reader.read1 if how == "read1" else reader.read
        while piece := read(2500):  # pieces that span chunks, and chunks that span pieces
            assert type(piece) is bytes
            got.append(piece)
    return b"".join(got)


@pytest.mark.parametrize("how", ["read", "read(n)", "read1", "readinto"])
def test_lent_chunks_are_copied_out_before_they_go_back(how, monkeypatch):
    monkeypatch.setattr(bodies, "READ_AHEAD", 4096)  # the source stays a few chunks ahead
    data = os.urandom(50_000)
    source = LendingSource(data, [1000, 700, 4096, 1])
    with ReadAheadBody("lent://x", source, 10.0) as reader:
        assert _read_all(reader, how) == data
    if how == "read":  # a whole object read at once: its chunks go to the allocator
        assert source.returned == 0
    else:
        assert source.returned >= source.lent - 1  # all but the chunk read at the end
        assert source.pool.allocated < source.lent // 4


def test_a_pool_keeps_as_many_buffers_as_were_out_at_once():
    """Buffers given back wait for the next takes up to the most that were out at once (and
    ``keep``): a second round of as many takes makes none, and no more wait than that."""
    pool = BufferPool(size=4096, keep=5)
    first = [pool.take() for _ in range(3)]
    for buffer in first:
        memoryview(buffer)[:] = b"\x01" * 4096  # writable, its whole size
        pool.give(memoryview(buffer)[:10])  # given back through a view of it, as chunks are
    again = [pool.take() for _ in range(3)]
    assert pool.allocated == 3 and {id(b) for b in again} == {id(b) for b in first}
    more = [pool.take() for _ in range(4)]  # 7 out at once: the peak, above keep
    assert pool.allocated == 7
    for buffer in again + more:
        pool.give(buffer)
    assert len(pool._free) == 5  # keep bounds what waits
    pool.give(bytearray(100))  # not one of its buffers: left alone
    pool.give(memoryview(bytes(100)))
    assert len(pool._free) == 5
    [pool.take() for _ in range(5)]
    assert pool.allocated == 7


def test_the_parts_are_read_into_buffers_the_body_gives_back(s3, proxied):
    """A stream's parts are read into its link's buffers, each given back once the consumer
    took its bytes: three objects read one after the other over one link take about one
    object's worth of buffers (those in flight at once), not three."""
    bucket, make = proxied
    chunk = CHUNK_SIZE
    data = os.urandom(12 * chunk + 5)
    url = put(s3, bucket, "buffers.bin", data)
    proxy = make()
    link = Link()
    with environ({"AWS_ENDPOINT_URL": proxy.endpoint}):
        for how in ("readinto", "read(n)", "read1"):
            reader, _source = sized(url, len(data), link, part_size=chunk, max_parts=3,
                                    start_parts=3, start_part_size=chunk)
            with reader:
                assert _read_all(reader, how) == data
    # out at once, at most: 3 parts of one buffer, the stream's read-ahead (8) and the
    # chunks on their way (the one being put, the consumer's, one a read(n) spans)
    assert link.buffers.allocated <= 3 + READ_AHEAD // chunk + 6 < 3 * 13
