"""The reader's lists: the tar parser's member lists, samples grouped a list at a time, the
span reader's lists of samples, the lists after the shuffle window and the trail of positions
that runs ahead of the items handed out. Each must give exactly what one-by-one reading gives:
the same samples, positions, errors (after the items before them), retries and skips."""

from __future__ import annotations

import io
import random

import pytest

import wdstream
from tests.support.shard_data import sample_key, shard_bytes, write_dataset
from wdstream.errors import ShardError, StreamError, WdstreamError
from wdstream.shards import tar_buffer
from wdstream.shards.samples import iter_samples, sample_batches
from wdstream.shards.tar_reader import iter_members
from wdstream.stream.load.contract import IterationSpec
from wdstream.stream.plan.epoch import Span
from wdstream.stream.plan.window import chunk_size, chunks_of
from wdstream.stream.read import shard_reader as read
from wdstream.stream.read.decode import build_decoders
from wdstream.stream.read.shard_reader import ReadOptions, ReadStats, ShardTable, SpanReader
from wdstream.stream.transfer.deferred import DEFER_MAX, DeferringDecoder


class CountingStream(io.BytesIO):
    """A stream that counts its reads and gives at most ``chunk`` bytes per read."""

    def __init__(self, data: bytes, chunk: int):
        super().__init__(data)
        self.reads, self.chunk = 0, chunk

    def read(self, n=-1):
        self.reads += 1
        return super().read(self.chunk if n is None or n < 0 else min(n, self.chunk))

    read1 = read


def _outcome(iterator):
    """The items an iterator gives, and the error that ends it (type and message), if any."""
    items = []
    try:
        for item in iterator:
            items.append(item)
    except WdstreamError as error:
        return items, (type(error), str(error))
    return items, None


def _flat(batches):
    for batch in batches:
        assert batch, "no empty list is handed over"
        yield from batch


def test_member_lists_are_what_the_buffer_held_and_read_nothing_ahead(monkeypatch):
    monkeypatch.setattr(tar_buffer, "READ_SIZE", 4096)
    data = shard_bytes(0, 40)  # 80 members of ~1 KiB each with headers
    stream = CountingStream(data, 4096)
    batches = iter_members(stream, "x").batches()
    first = next(batches)
    assert stream.reads == 1  # the list holds the members of the first read, no more
    assert 1 <= len(first) <= 4
    rest = [member for batch in batches for member in batch]
    assert first + rest == list(iter_members(io.BytesIO(data), "x"))


def test_member_lists_give_the_members_before_an_error_first():
    data = bytearray(shard_bytes(0, 10))
    members = list(iter_members(io.BytesIO(bytes(data)), "x"))
    offset = 0
    for _name, payload in members[:7]:  # the header of the 8th member
        offset += 512 + -(-len(payload) // 512) * 512
    data[offset + 3] ^= 0x01
    expected = _outcome(iter_members(io.BytesIO(bytes(data)), "gs://b/s.tar"))
    assert [m[0] for m in expected[0]] == [m[0] for m in members[:7]]
    assert expected[1][0] is ShardError and "bad header checksum" in expected[1][1]
    batches = iter_members(io.BytesIO(bytes(data)), "gs://b/s.tar").batches()
    assert _outcome(_flat(batches)) == expected


@pytest.mark.parametrize("seed", range(40))
def test_member_lists_match_one_by_one_reading_on_damaged_shards(seed, monkeypatch):
    """Random damage (flipped bytes, cut streams) in shards read in small pieces: the lists
    give the same members and the same error as member-by-member reading."""
    monkeypatch.setattr(tar_buffer, "READ_SIZE", 2048)
    rng = random.Random(seed)
    data = bytearray(shard_bytes(seed, 12, payload=rng.choice((0, 300, 3000))))
    for _ in range(rng.randrange(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    if rng.random() < 0.3:
        del data[rng.randrange(len(data)):]
    chunk = rng.choice((512, 1000, 4096))
    one = _outcome(iter_members(CountingStream(bytes(data), chunk), "u"))
    listed = _outcome(_flat(iter_members(CountingStream(bytes(data), chunk), "u").batches()))
    assert listed == one
    grouped = _outcome(iter_samples(iter_members(CountingStream(bytes(data), chunk), "u"),
                                    "u"))
    by_one = _outcome(iter_samples(iter(iter_members(CountingStream(bytes(data), chunk), "u")),
                                   "u"))
    assert grouped == by_one


def test_sample_lists_group_across_member_lists_and_keep_errors_last():
    members = [("a.json", b"1"), ("a.txt", b"2"), ("b.json", b"3"), ("b.txt", b"4"),
               ("c.json", b"5")]
    lists = [members[:1], members[1:3], members[3:]]
    samples = [sample for batch in sample_batches(lists, "u") for sample in batch]
    assert [(s["__key__"], sorted(s)) for s in samples] == [
        ("a", ["__key__", "__url__", "json", "txt"]), ("b", ["__key__", "__url__", "json", "txt"]),
        ("c", ["__key__", "__url__", "json"])]
    duplicate = [[("a.json", b"1"), ("b.json", b"2"), ("b.json", b"3")]]
    items, error = _outcome(_flat(sample_batches(duplicate, "u")))
    assert [s["__key__"] for s in items] == ["a"] and "duplicate extension" in error[1]
    reserved = [[("a.json", b"1")], [("b.__key__", b"2")]]
    items, error = _outcome(_flat(sample_batches(reserved, "u")))
    assert [s["__key__"] for s in items] == ["a"] and "reserved extension" in error[1]


def _table(paths, counts):
    return ShardTable(urls=list(paths), samples=list(counts))


@pytest.mark.parametrize("ranges", [[(0, 50)], [(3, 17)], [(0, 1), (2, 3), (49, 50)],
                                    [(5, 9), (9, 40)], [(20, None)], [(48, 50)]])
@pytest.mark.parametrize("read_size", [1024, 8192, 1 << 20])  # lists of 1, ~3, 50 samples
def test_span_lists_hold_exactly_the_ranges(tmp_path, monkeypatch, ranges, read_size):
    monkeypatch.setattr(tar_buffer, "READ_SIZE", read_size)
    paths = write_dataset(tmp_path, [50], payload=700)
    spans = [Span(0, start, stop) for start, stop in ranges]
    reader = SpanReader(spans, _table(paths, [50]), ReadOptions())
    keys = [sample["__key__"] for sample in reader]
    assert keys == [sample_key(0, i) for start, stop in ranges for i in range(start, stop or 50)]


def test_a_retry_goes_on_after_the_last_sample_of_the_lists_delivered(tmp_path, monkeypatch):
    """The stream fails half-way through the shard on the first attempt: the second attempt
    delivers the rest, nothing twice, nothing lost."""
    monkeypatch.setattr(tar_buffer, "READ_SIZE", 2048)
    paths = write_dataset(tmp_path, [30, 30], payload=500)
    opened = []

    class Failing(CountingStream):
        def read(self, n=-1):
            if self.tell() > 9000:
                raise StreamError(self.url, "connection reset", transient=True)
            return super().read(n)

        read1 = read

    def open_read(url, **_kwargs):
        opened.append(url)
        data = open(url, "rb").read()
        stream = Failing(data, 2048) if len(opened) == 1 else io.BytesIO(data)
        stream.url = url
        return stream

    monkeypatch.setattr(read, "open_read", open_read)
    stats = ReadStats()
    reader = SpanReader([Span(0, 4, 30), Span(1, 0, 30)], _table(paths, [30, 30]),
                        ReadOptions(retries=2, backoff=0.0), stats)
    keys = [sample["__key__"] for sample in reader]
    assert keys == [sample_key(0, i) for i in range(4, 30)] + [sample_key(1, i)
                                                               for i in range(30)]
    assert stats.retries == 1 and opened.count(paths[0]) == 2


def _corrupt_sample(path, shard: int, index: int) -> None:
    """Flip a byte of the header of sample ``index``'s first member: a bad checksum."""
    data = bytearray(open(path, "rb").read())
    offset = 0
    for name, payload in iter_members(io.BytesIO(bytes(data)), path):
        if name.startswith(sample_key(shard, index)):
            break
        offset += 512 + -(-len(payload) // 512) * 512
    data[offset + 5] ^= 0x01
    open(path, "wb").write(bytes(data))


def test_skipped_samples_keep_every_position(tmp_path):
    """A shard that fails in the middle under on_error="skip": the samples it delivered
    before the failure keep their positions, the rest are counted, and the next shard's
    samples are at the positions they would have had."""
    counts = [10, 10, 10]
    paths = write_dataset(tmp_path, counts)
    _corrupt_sample(paths[1], 1, 6)
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False, on_error="skip", retries=0)
    spec = IterationSpec(0, 0, 1, 1)
    items = [(sample["__key__"], position) for sample, position in ds.positioned(spec, 0, 0)]
    delivered = [key for key, _ in items if key.startswith("s001")]
    assert delivered == [sample_key(1, i) for i in range(len(delivered))]
    assert 0 < len(delivered) < 6
    expected = [(sample_key(0, i), i + 1) for i in range(10)] + \
        [(sample_key(1, i), 11 + i) for i in range(len(delivered))] + \
        [(sample_key(2, i), 21 + i) for i in range(10)]
    assert items == expected
    # started after the failure: the same positions from there
    later = [(s["__key__"], p) for s, p in ds.positioned(spec, 0, 15)]
    assert later == expected[-10:]


def test_positions_of_every_batch_match_the_samples_received(tmp_path, single_rank):
    """The trail runs ahead of the items the workers' fetches take: the position each batch
    carries must still be the samples of its stream received with it."""
    counts = [23, 17, 31, 9]
    write_dataset(tmp_path, counts)
    for batch_size in (None, 5):
        ds = wdstream.StreamingDataset(str(tmp_path), shuffle=True, shuffle_window=7, seed=3)
        loader = wdstream.DataLoader(ds, batch_size=batch_size, num_workers=2)
        received = 0
        for batch in loader:
            received += 1 if batch_size is None else len(batch["__key__"])
            assert sum(loader.state_dict()["positions"]) == received
        assert received == sum(counts)


def test_resume_in_the_middle_of_a_list(tmp_path, single_rank):
    counts = [40, 40, 40]
    write_dataset(tmp_path, counts)

    def loader():
        ds = wdstream.StreamingDataset(str(tmp_path), shuffle=True, shuffle_window=11, seed=1)
        return wdstream.DataLoader(ds, batch_size=3, num_workers=2)

    whole = [tuple(b["__key__"]) for b in loader()]
    for stop in (1, 4, 13, 29):
        first = loader()
        taken = []
        for batch in first:
            taken.append(tuple(batch["__key__"]))
            if len(taken) == stop:
                break
        state = first.state_dict()
        second = loader()
        second.load_state_dict(state)
        assert taken + [tuple(b["__key__"]) for b in second] == whole


def test_chunks_give_the_items_before_an_error_first():
    def items():
        yield from range(5)
        raise ShardError("broken")

    chunks = chunks_of(items(), 3)
    assert next(chunks) == [0, 1, 2]
    assert next(chunks) == [3, 4]
    with pytest.raises(ShardError, match="broken"):
        next(chunks)
    assert list(chunks_of(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert chunk_size(None, None) == 1 and chunk_size(1000, 1000 << 20) == 1
    assert chunk_size(100_000, 100_000_000) == 64


def test_unchanged_tells_which_lists_need_no_decoding():
    names: set[str] = set()
    decoder = DeferringDecoder(build_decoders(None), names)

    def sample(**members):
        return {"__key__": "k", "__url__": "u", **members}

    assert decoder.unchanged([sample(json=b"{}"), sample(json=b"[1]")])
    assert names == {"json"}  # the collate wrapper learns the name either way
    assert not decoder.unchanged([sample(json=b"{}"), sample(json=b" " * DEFER_MAX)])
    assert not decoder.unchanged([sample(json=b"{}"), sample(txt=b"x")])
    assert not decoder.unchanged([sample(json=b"{}", txt=b"a")])  # txt decodes to str
    assert decoder.unchanged([sample(bin=b"\x00")])  # no decoder
    assert not decoder.unchanged([sample(json=b"{}"), sample(json=bytearray(b"{}"))])
    # samples of different members: what each has is checked
    assert decoder.unchanged([sample(bin=b"\x00"), sample(json=b"{}"), sample(dat=b"")])
    assert not decoder.unchanged([sample(bin=b"\x00"), sample(json=b" " * DEFER_MAX)])
    assert not decoder.unchanged([sample(bin=b"\x00"), sample(json=b"{}"), sample(txt=b"")])


def test_a_decoding_failure_comes_after_the_samples_before_it(tmp_path):
    write_dataset(tmp_path, [12])
    path = tmp_path / "shard-000000.tar"
    data = bytearray(path.read_bytes())
    start = data.index(b'{"shard": 0, "index": 7')
    data[start] = ord("[")  # no longer JSON, same size
    path.write_bytes(bytes(data))
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False)
    items, error = _outcome(s["__key__"] for s, _ in ds.positioned(IterationSpec(0, 0, 1, 1),
                                                                    0, 0))
    assert items == [sample_key(0, i) for i in range(7)]
    assert error[0] is ShardError and "cannot decode .json" in error[1]


def _usual_members(count: int) -> list[tuple[str, bytes]]:
    return [(f"{i:04d}.json", b"{}" * (i + 1)) for i in range(count)]


def _tar_with(members, edit) -> bytes:
    """A tar of ``members`` from tarfile (ustar), with ``edit(tarinfo, index)`` applied."""
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for index, (name, payload) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            edit(info, index)
            tar.addfile(info, io.BytesIO(payload) if info.isreg() else None)
    return out.getvalue()


def test_usual_headers_keep_every_check():
    """After a few headers alike, the reader takes a short path for the next ones: it still
    refuses a bad checksum, skips directory entries, reads a prefix, and refuses a member
    past the recorded length."""
    members = _usual_members(6)
    data = bytearray(_tar_with(members, lambda info, i: None))
    assert list(iter_members(io.BytesIO(bytes(data)), "u")) == members
    bad = bytearray(data)
    bad[4 * 1024 + 20] ^= 0x01  # a byte in the mode field of the 5th header
    items, error = _outcome(_flat(iter_members(io.BytesIO(bytes(bad)), "u").batches()))
    assert items == members[:4] and "bad header checksum" in error[1]

    def directory(info, index):
        if index == 3:
            info.name, info.type, info.size = "adir/", b"0", 0

    with_dir = _tar_with(members, directory)
    assert [m[0] for m in iter_members(io.BytesIO(with_dir), "u")] == \
        [m[0] for i, m in enumerate(members) if i != 3]
    long = [(f"{'p' * 120}/{i:04d}.json", payload) for i, (_n, payload) in enumerate(members)]
    assert list(iter_members(io.BytesIO(_tar_with(long, lambda info, i: None)), "u")) == long
    cut = sum(512 + -(-len(payload) // 512) * 512 for _n, payload in members[:5]) + 515
    with pytest.raises(ShardError, match="runs past"):
        list(iter_members(io.BytesIO(bytes(data[:cut])), "u", limit=cut))


def test_a_pax_path_after_usual_headers_names_the_member():
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for index in range(6):
            name = f"{index:04d}.json" if index != 4 else "é" * 120 + ".json"
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    names = [name for name, _ in iter_members(io.BytesIO(out.getvalue()), "u")]
    assert names == [f"{i:04d}.json" for i in range(4)] + ["é" * 120 + ".json", "0005.json"]
