"""Large manifests parse into arrays (wdstream.shards.compact) with the same meaning as the
general parser: same shards, sums, fingerprint, plan; anything unusual goes the general way."""

from __future__ import annotations

import gc
import hashlib
import json

import numpy as np
import pytest

import wdstream
from wdstream.errors import ManifestError
from wdstream.shards import compact, scan, scan_lengths
from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.stream.plan.epoch import EpochPlan, PlanOptions

COUNT = compact.SMALL + 7


def infos(count: int = COUNT) -> list[ShardInfo]:
    return [ShardInfo(f"part-{i % 3}/shard-{i:06d}.tar", 10 + i % 5, 10_240 + i,
                      hashlib.sha256(str(i).encode()).hexdigest() if i % 4 else None)
            for i in range(count)]


def general(text: str) -> Manifest:
    """The general parser alone: the same text with the shards list on one line."""
    doc = json.loads(text)
    return Manifest.from_json(json.dumps(doc), base="s3://b/d/")


def test_a_large_manifest_parses_into_arrays_with_the_same_meaning():
    shards = infos()
    text = Manifest(shards, extensions=["json"], extra={"packer": {"x": 1}}).to_json()
    fast = Manifest.from_json(text, base="s3://b/d/")
    slow = general(text)
    assert isinstance(fast.shards, compact.ShardArrays)
    assert isinstance(slow.shards, list)
    assert len(fast.shards) == COUNT
    assert fast.shards[5] == shards[5] and fast.shards[-1] == shards[-1]
    assert list(fast.shards) == shards
    assert fast.samples == slow.samples and fast.bytes == slow.bytes
    assert fast.fingerprint() == slow.fingerprint()
    assert fast.extra == slow.extra and fast.extensions == ["json"]
    assert fast.shard_url(3) == "s3://b/d/part-0/shard-000003.tar"
    assert fast.to_json() == text  # still what people and older readers read


@pytest.mark.slow
def test_a_dataset_on_a_large_manifest_plans_as_before(tmp_path):
    text = Manifest(infos(), extensions=["bin"]).to_json()
    (tmp_path / "index.json").write_text(text)
    dataset = wdstream.StreamingDataset(str(tmp_path), shuffle=True, seed=3)
    assert isinstance(dataset.manifest.shards, compact.ShardArrays)
    assert dataset.shards.urls[2] == str(tmp_path / "part-2/shard-000002.tar")
    assert dataset.shards.sha256[4] == infos()[4].sha256 and dataset.shards.sha256[0] is None
    assert len(dataset) == general(text).samples
    counts = [s.samples for s in infos()]
    ours = EpochPlan(dataset.shards.samples, 1, 4, 3, PlanOptions(seed=3))
    reference = EpochPlan(counts, 1, 4, 3, PlanOptions(seed=3))
    for rank in range(4):
        for stream in range(3):
            assert ours.stream_spans(rank, stream) == reference.stream_spans(rank, stream)


@pytest.mark.parametrize("name", ["/abs/shard.tar", "../up.tar", "s3://other/x.tar",
                                  "a b.tar", "dir//x.tar", "caf\u00e9.tar", 'q"uote.tar'])
def test_unusual_names_go_the_general_way(name):
    shards = infos()
    shards[77] = ShardInfo(name, 1, 1024, None)
    text = Manifest(shards).to_json()
    assert compact.parse_manifest(text) is None
    assert Manifest.from_json(text).shards[77].url == name


@pytest.mark.parametrize("entry, message", [
    ('{"url": "x.tar", "samples": -1, "bytes": 2, "sha256": null}', "shards[5].samples"),
    ('{"url": "x.tar", "samples": true, "bytes": 2, "sha256": null}', "shards[5].samples"),
    ('{"url": "x.tar", "samples": 1, "bytes": 2.5, "sha256": null}', "shards[5].bytes"),
    ('{"url": "x.tar", "samples": 1, "bytes": 1024, "sha256": "ABC"}', "shards[5].sha256"),
    ('{"url": "", "samples": 1, "bytes": 2, "sha256": null}', "shards[5].url"),
    ('{"samples": 1, "bytes": 2, "sha256": null}', "shards[5].url"),
])
def test_bad_values_in_a_large_manifest_are_reported_by_the_general_parser(entry, message):
    lines = Manifest(infos()).to_json().split("\n")
    lines[6] = " " + entry + ","  # line 0 is the head: shards[5]
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Manifest.from_json("\n".join(lines), where="m.json")


def test_wrong_sums_are_caught():
    text = Manifest(infos()).to_json().replace('"samples": ', '"samples": 1', 1)
    with pytest.raises(ManifestError, match="'samples'"):
        Manifest.from_json(text)


def test_arrays_are_few_large_objects():
    fast = Manifest.from_json(Manifest(infos()).to_json())
    assert isinstance(fast.shards.samples, np.ndarray)
    assert fast.shards.samples.dtype == np.int64


def test_the_shuffle_window_is_bounded_in_bytes(tmp_path):
    from wdstream.errors import InputError

    big = [ShardInfo(f"s-{i}.tar", 100, 100 * (1 << 20), None) for i in range(4)]
    (tmp_path / "index.json").write_text(Manifest(big).to_json())
    assert wdstream.StreamingDataset(str(tmp_path)).options.window == 256
    assert wdstream.StreamingDataset(str(tmp_path), shuffle_bytes="64MiB").options.window == 64
    assert wdstream.StreamingDataset(str(tmp_path), shuffle_bytes=None).options.window == 1000
    assert wdstream.StreamingDataset(str(tmp_path), shuffle_bytes=1).options.window == 1
    small = [ShardInfo(f"s-{i}.tar", 100, 100 * 1024, None) for i in range(4)]
    (tmp_path / "index.json").write_text(Manifest(small).to_json())
    assert wdstream.StreamingDataset(str(tmp_path)).options.window == 1000
    with pytest.raises(InputError):
        wdstream.StreamingDataset(str(tmp_path), shuffle_bytes="lots")


def test_a_compact_manifest_streams_from_s3_through_workers_and_the_cache(
        s3, s3_bucket, tmp_path, monkeypatch):
    """The whole path on arrays: lazy URLs, sizes and digests reach the S3 reader, the shard
    cache and forked DataLoader workers; the epoch is the one the general parser gives."""
    from tests.support.shard_data import all_keys, write_dataset

    counts = [7, 5, 9, 6]
    folder = tmp_path / "data"
    write_dataset(folder, counts)
    client = s3.client()
    for path in sorted(folder.iterdir()):
        client.put_object(Bucket=s3_bucket, Key=f"d/{path.name}", Body=path.read_bytes())
    url = f"s3://{s3_bucket}/d/"

    def epoch(**options):
        dataset = wdstream.StreamingDataset(url, seed=5, verify_digest=True,
                                            cache_dir=str(tmp_path / "cache"), **options)
        loader = wdstream.DataLoader(dataset, batch_size=4, num_workers=2)
        return dataset, [k for batch in loader for k in batch["__key__"]]

    general_dataset, expected = epoch()
    assert isinstance(general_dataset.manifest.shards, list)
    monkeypatch.setattr(compact, "SMALL", 1)
    dataset, keys = epoch()
    assert isinstance(dataset.manifest.shards, compact.ShardArrays)
    assert keys == expected and set(keys) == all_keys(counts)
    assert dataset.fingerprint() == general_dataset.fingerprint()


def with_identity(shards: list[ShardInfo]) -> list[ShardInfo]:
    """The shards as pack and index write them: a head and the last key on most of them."""
    return [ShardInfo(s.url, s.samples, s.bytes, s.sha256,
                      None if i % 5 == 0 else hashlib.md5(str(i).encode()).hexdigest(),
                      None if i % 7 == 0 else f"key-{i:09d}") for i, s in enumerate(shards)]


def test_identity_keys_parse_into_arrays_too(tmp_path):
    shards = with_identity(infos())
    text = Manifest(shards, extensions=["json"]).to_json()
    fast = Manifest.from_json(text, base="s3://b/d/")
    assert isinstance(fast.shards, compact.ShardArrays)
    assert list(fast.shards) == shards and fast.to_json() == text
    (tmp_path / "index.json").write_text(text)
    table = wdstream.StreamingDataset(str(tmp_path)).shards
    assert [table.get("heads", i) for i in (0, 1)] == [None, shards[1].head]
    assert [table.get("last_keys", i) for i in (0, 8)] == [None, "key-000000008"]


@pytest.mark.parametrize("spoil", ["same name twice", "key twice", "head key twice",
                                   "too many samples", "samples in an empty tar"])
def test_what_the_arrays_would_let_through_is_refused_by_the_general_parser(spoil):
    shards = infos()
    text = Manifest(shards, extensions=["json"]).to_json()
    line = json.dumps({"url": shards[9].url, "samples": shards[9].samples,
                       "bytes": shards[9].bytes, "sha256": shards[9].sha256})
    assert line in text
    spoiled = {
        "same name twice": line.replace(shards[9].url, shards[8].url),
        "key twice": line.replace('"samples": ', '"samples": 1, "samples": '),
        "too many samples": line.replace(f'"samples": {shards[9].samples}',
                                         f'"samples": {shards[9].bytes}'),
        "samples in an empty tar": line.replace(f'"samples": {shards[9].samples}',
                                                '"samples": 0'),
    }
    if spoil == "head key twice":
        text = text.replace('"version": 1', '"version": 1, "version": 1', 1)
    else:
        text = text.replace(line, spoiled[spoil])
    with pytest.raises(ManifestError, match="manifest: key"):
        Manifest.from_json(text)


def outcome(parse, text):
    """What a parser makes of ``text``: its shards, or the error's message."""
    try:
        return [tuple(vars(s).values()) for s in parse(text).shards]
    except ManifestError as error:
        return str(error)


@pytest.mark.parametrize("spoil", [
    ('"samples": 11,', '"samples": 011,'),  # a leading zero is not JSON
    ('"samples": 11,', '"samples": -11,'),
    ('"samples": 11,', '"samples": 1.0,'),
    ('"samples": 11,', '"samples": 1100000000000000000000,'),
    ('"samples": 11,', '"samples":11,'),
    ('"samples": 11,', '"samples": 11 ,'),
    ('"samples": 11,', '"sampels": 11,'),
    ('"url": "', '"url" : "'),
    ('{"url"', '{ "url"'),
    ('"sha256": "6b86', '"sha256": "6B86'),
    ('"sha256": "6b86', '"sha256": "6b8'),
    ('"head": "c4ca', '"head": "c4ca0'),
    ('"head": "c4ca', '"head": null, "head": "c4ca'),
    ('"last_key": "key-000000001"', '"last_key": "k\\u00e9y"'),
    ('"last_key": "key-000000001"', '"last_key": "k\u00e9y"'),
    ('"last_key": "key-000000001"', '"last_key": "k\x01y"'),
    ('"last_key": "key-000000001"', '"last_key": ""'),
    ('"last_key": "key-000000001"', '"last_key": 5'),
    ('"last_key": "key-000000001"}', '"last_key": "key-000000001", "x": 1}'),
    ('"last_key": "key-000000001"}', '"last_key": "key-000000001"} '),
    ('"url": "part-1/shard-000001.tar"', '"url": "part-1/shard-000001.tar/"'),
    ('"url": "part-1/shard-000001.tar"', '"url": "part-1//shard-000001.tar"'),
    ('"url": "part-1/shard-000001.tar"', '"url": "part-1/sh\\"ard.tar"'),
    ('"url": "part-1/shard-000001.tar"', '"url": "pipe:rm.tar"'),
    ('"url": "part-1/shard-000001.tar"', '"url": "part-2/shard-000002.tar"'),
    # the line keeps its length: the block of lines of that length sees it
    ('"samples": 11,', '"samples": 1x,'),
    ('"samples": 11,', '"samples": 1 ,'),
    ('"bytes": 10241,', '"bytes": 1024\x00,'),
    ('"url": "part-1/shard-000001.tar"', '"url": "part-1/shard-00000".tar"'),
    ('"url": "part-1/shard-000001.tar"', '"url": "part-1/shard-00000\x7f.tar"'),
    ('"last_key": "key-000000001"', '"last_key": "key-00000000\x1f"'),
    ('"last_key": "key-000000001"', '"last_key": "key-0000\xc3\xa9001"'),
    ('"last_key": "key-000000001"', '"last_key": "key-00000", "0001"'),
    ('"head": "c4ca', '"head": "C4CA'),
    ('"head": "c4ca', '"head": "g4ca'),
    ('{"url"', '["url"'),
])
@pytest.mark.parametrize("scanner", ["by length", "by quotes"])
def test_the_scanner_reads_a_line_as_the_general_parser_does_or_leaves_it(spoil, scanner,
                                                                          monkeypatch):
    """Each spoiled line (of shard 1) is either read with the general parser's meaning or the
    whole manifest goes the general way; the results (shards or error) are the same. Both
    ways of scanning: lines grouped by length (scan_lengths) and the quote scanner."""
    if scanner == "by quotes":
        monkeypatch.setattr(scan, "scan_by_length", lambda *args: scan_lengths.VARIED)
    monkeypatch.setattr(compact, "SMALL", 100)  # the same scanners on a quicker manifest
    shards = with_identity(infos(300))
    text = Manifest(shards, extensions=["json"]).to_json()
    old, new = spoil
    line = text.split("\n")[2]
    assert old in line, (old, line)
    spoiled = text.replace(line, line.replace(old, new), 1)
    fast = compact.parse_manifest(spoiled)
    ours = outcome(Manifest.from_json, spoiled)
    monkeypatch.setattr(compact, "parse_manifest", lambda text: None)
    general_only = outcome(Manifest.from_json, spoiled)
    assert ours == general_only
    if fast is not None and isinstance(general_only, list):  # read by the scanner: the same
        assert [tuple(vars(s).values()) for s in fast[1]] == general_only


def varied_shards(count: int = COUNT) -> list[ShardInfo]:
    """Lines of many lengths and layouts: names, counts and keys of several widths, digests
    and identity keys present or not, keys beyond ASCII."""
    rng = np.random.default_rng(3)
    shards = []
    for i in range(count):
        samples = int(rng.choice([1, 9, 10, 999, 1000, 12345]))
        shards.append(ShardInfo(
            f"d{i % 11}/{'x' * (i % 3)}s-{i}.tar", samples, samples * 600 + int(rng.integers(0, 5)),
            hashlib.sha256(str(i).encode()).hexdigest() if i % 3 else None,
            hashlib.md5(str(i).encode()).hexdigest() if i % 4 else None,
            None if i % 5 == 0 else ("" if i % 17 == 0 else f"k\u00e9y-{i:0{i % 9}d}")))
    return shards


def scanned(text: str, monkeypatch=None, how: str = "by length"):
    encoded = text.encode()
    start = encoded.index(b"[\n ") + 3
    stop = len(encoded) - len("\n]}\n")
    with pytest.MonkeyPatch.context() as patch:
        if how == "by quotes":
            patch.setattr(scan, "scan_by_length", lambda *args: scan_lengths.VARIED)
        elif how == "few rounds":
            patch.setattr(scan_lengths, "MAX_ROUNDS", 3)
        return scan.scan_shards(encoded, start, stop)


@pytest.mark.parametrize("make", [infos, lambda: with_identity(infos()), varied_shards])
def test_reading_lines_by_length_gives_what_the_quote_scanner_gives(make):
    shards = make()
    text = Manifest(shards, extensions=["json"]).to_json()
    by_length, by_quotes = scanned(text), scanned(text, how="by quotes")
    assert by_length is not None and by_length.keys() == by_quotes.keys()
    for name, column in by_quotes.items():
        assert np.array_equal(by_length[name], column), name
    assert list(Manifest.from_json(text).shards) == shards


def test_lines_too_varied_for_blocks_take_the_quote_scanner(monkeypatch):
    text = Manifest(varied_shards(), extensions=["json"]).to_json()
    calls = []
    quote_block = scan._scan_block
    monkeypatch.setattr(scan, "_scan_block", lambda *a: calls.append(1) or quote_block(*a))
    few = scanned(text, how="few rounds")
    assert calls  # the lines took more than 3 rounds of blocks
    for name, column in scanned(text).items():
        assert np.array_equal(few[name], column), name


def test_a_line_in_no_layout_sends_the_manifest_to_the_general_parser():
    shards = infos()
    text = Manifest(shards).to_json()
    lines = text.split("\n")
    lines[40] = lines[40].replace('"url": ', '"url":  ', 1)
    assert scanned("\n".join(lines)) is None
    lines = text.split("\n")
    lines[40] = lines[40].replace('"bytes"', '"extra": 1, "bytes"', 1)
    assert scanned("\n".join(lines)) is None
    assert Manifest.from_json("\n".join(lines)).extra == {}  # read, the general way


def test_the_shard_table_of_a_large_manifest_makes_values_when_asked_for(tmp_path):
    """Digests, heads and last keys (not needed to stream) stay raw bytes in the arrays; the
    shard table makes a shard's strings when the reader asks for that shard."""
    shards = with_identity(infos())
    (tmp_path / "index.json").write_text(Manifest(shards, extensions=["json"]).to_json())
    gc.collect()
    before = len(gc.get_objects())
    dataset = wdstream.StreamingDataset(str(tmp_path), share_manifest=False)
    table = dataset.shards
    assert len(gc.get_objects()) - before < 2000  # no object per shard (10,007 of them)
    for column in ("urls", "sha256", "heads", "last_keys"):
        assert not isinstance(getattr(table, column), list)
    arrays = dataset.manifest.shards
    assert arrays.columns["sha256"].dtype == np.uint8 and arrays.columns["heads"].shape == (
        COUNT, 16)
    for i in (0, 1, 5, 8, COUNT - 1):
        assert (table.sha256[i], table.heads[i], table.last_keys[i]) == (
            shards[i].sha256, shards[i].head, shards[i].last_key)
