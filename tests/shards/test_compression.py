"""Compressed shards (.tar.gz/.tgz, .tar.zst, .tar.bz2, .tar.xz) read everywhere a .tar is:
the decompressing stream alone (every cut point is an error, bounded output), listings that
count every shard and name what they leave out, ``wdstream index/ls/verify/cat/bench``, the
loader with exact and elastic resume, the cache, ``pipe:`` URLs and the S3 server."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import shutil
import subprocess
from collections import Counter

import pytest
import zstandard

import wdstream as wds
from tests.cli.test_inspect import wdstream
from tests.support.shard_data import all_keys, batch_keys, first_batches, shard_bytes
from wdstream.errors import ShardError
from wdstream.inspection import read_samples
from wdstream.shards.compression import open_tar, sniff
from wdstream.shards.index_shards import index_shard
from wdstream.sources.cache import ShardCache

COMPRESS = {
    ".tar.gz": lambda data: gzip.compress(data, mtime=0),
    ".tgz": lambda data: gzip.compress(data, mtime=0),
    ".tar.zst": lambda data: zstandard.ZstdCompressor(write_checksum=True).compress(data),
    ".tar.bz2": bz2.compress,
    ".tar.xz": lambda data: lzma.compress(data, format=lzma.FORMAT_XZ),
}
COUNTS = [9, 14, 6, 11, 8]
SUFFIXES = [".tar", ".tar.gz", ".tar.zst", ".tar.bz2", ".tar.xz"]  # one kind per shard


class Chunks:
    """A stream that hands out at most ``step`` bytes per read."""

    def __init__(self, data: bytes, step: int):
        self.data, self.pos, self.step, self.closed = data, 0, step, False

    def read(self, n: int = -1) -> bytes:
        n = self.step if n is None or n < 0 else min(n, self.step)
        piece = self.data[self.pos : self.pos + n]
        self.pos += len(piece)
        return piece

    def close(self):
        self.closed = True


def write_mixed(folder, counts=COUNTS, suffixes=SUFFIXES) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for shard, (count, suffix) in enumerate(zip(counts, suffixes, strict=True)):
        data = shard_bytes(shard, count, payload=300)
        if suffix != ".tar":
            data = COMPRESS[suffix](data)
        path = os.path.join(folder, f"shard-{shard:06d}{suffix}")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One shard of each kind, indexed with the installed command."""
    folder = tmp_path_factory.mktemp("mixed") / "ds"
    write_mixed(folder)
    wdstream("index", folder, "--quiet")
    return folder


# --------------------------------------------------------------------------- the stream


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_decompressing_stream_and_every_cut(suffix):
    tar = shard_bytes(0, 40, payload=2000)
    stored = COMPRESS[suffix](tar)
    assert sniff(stored) is not None
    for step in (1 << 20, 1000, 3):
        stream = open_tar(Chunks(stored, step), "x" + suffix)
        assert stream.read() == tar and stream.stored_bytes == len(stored)
    cuts = sorted({1, 5, 10, len(stored) // 3, len(stored) // 2, len(stored) - 1,
                   *range(len(stored) - 12, len(stored))})
    for cut in cuts:
        with pytest.raises(ShardError, match=f"x{suffix}"):
            open_tar(Chunks(stored[:cut], 4096), "x" + suffix).read()
    with pytest.raises(ShardError, match="corrupt|other data after its end"):
        open_tar(Chunks(stored + b"more data", 4096), "x" + suffix).read()


def test_concatenated_members_and_bounded_output():
    tar = shard_bytes(0, 10)
    half = len(tar) // 2
    for compress in (lambda d: gzip.compress(d, mtime=0), zstandard.compress, bz2.compress,
                     lzma.compress):
        stored = compress(tar[:half]) + compress(tar[half:])
        assert open_tar(Chunks(stored, 777), "x").read() == tar
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # ~2 KB of stored bytes
    stream = open_tar(Chunks(bomb, 1 << 20), "bomb.tar.zst")
    pieces = iter(lambda: stream.read1(1 << 20), b"")
    assert max(len(p) for p in pieces) <= 1 << 20 and stream.stored_bytes == len(bomb)


def test_names_and_magic():
    tar = shard_bytes(0, 3)
    # gzip data named .tar is read (its magic bytes say what it is)
    assert open_tar(Chunks(gzip.compress(tar), 100), "a.tar").read() == tar
    with pytest.raises(ShardError, match="name says gzip-compressed"):
        open_tar(Chunks(tar, 100), "a.tar.gz")
    with pytest.raises(ShardError, match="lz4-compressed"):
        open_tar(Chunks(b"\x04\x22\x4d\x18" + bytes(100), 100), "a.tar.lz4")


# --------------------------------------------------------------------------- commands


@pytest.mark.slow
def test_listing_counts_every_shard_and_names_what_it_leaves_out(tmp_path):
    folder = tmp_path / "ds"
    write_mixed(folder, [3, 4, 5], [".tar", ".tar.gz", ".tar"])
    (folder / "d.tar.lz4").write_bytes(b"\x04\x22\x4d\x18")
    (folder / "notes.txt").write_text("hi")
    listed = json.loads(wdstream("ls", folder, "--json").stdout)
    assert [s["name"] for s in listed["shards"]] == [
        "shard-000000.tar", "shard-000001.tar.gz", "shard-000002.tar"]
    assert listed["samples"] == 12 and listed["not_shards"] == {".tar.lz4": 1, ".txt": 1}
    text = wdstream("ls", folder)
    assert "2 listed file(s) are not shards" in text.stderr and ".tar.lz4" in text.stderr
    result = wdstream("index", folder, "--quiet")
    assert "1 .tar.lz4, 1 .txt" in result.stderr
    manifest = json.loads((folder / "index.json").read_text())
    assert [s["url"] for s in manifest["shards"]][1] == "shard-000001.tar.gz"
    assert manifest["samples"] == 12


@pytest.mark.slow
def test_index_records_stored_bytes_and_digests(mixed):
    manifest = json.loads((mixed / "index.json").read_text())
    assert [s["samples"] for s in manifest["shards"]] == COUNTS
    for entry in manifest["shards"]:
        stored = (mixed / entry["url"]).read_bytes()
        assert entry["bytes"] == len(stored)
        assert entry["sha256"] == hashlib.sha256(stored).hexdigest()
    wdstream("verify", mixed, "--deep")
    cat = wdstream("cat", mixed / "shard-000002.tar.zst", "-n", "2").stdout.splitlines()
    assert [json.loads(line)["__key__"] for line in cat] == ["s002_00000", "s002_00001"]
    bench = json.loads(wdstream("bench", mixed, "--json", "--workers", "1").stdout)
    assert bench["samples"] == sum(COUNTS)


def cut_copy(dataset, folder, name: str | None = None, cut: int = 0):
    """A copy of ``dataset`` in ``folder``, the last ``cut`` bytes of member ``name`` gone."""
    shutil.copytree(dataset, folder)
    if name is not None:
        damaged = folder / name
        damaged.write_bytes(damaged.read_bytes()[:-cut])
    return folder


def test_verify_finds_a_cut_compressed_shard(mixed, tmp_path):
    folder = cut_copy(mixed, tmp_path / "ds", "shard-000001.tar.gz", 20)
    (folder / "index.json").unlink()  # no manifest: only the stream can tell
    result = wdstream("verify", folder, code=1)
    assert "shard-000001.tar.gz" in result.stdout and "truncated" in result.stdout


# --------------------------------------------------------------------------- the loader


def make(source, workers=2, batch_size=4, **kwargs):
    ds = wds.StreamingDataset(str(source), seed=3, shuffle_window=5, **kwargs)
    return wds.DataLoader(ds, batch_size=batch_size, num_workers=workers)


def keys(loader):
    return [k for batch in batch_keys(loader) for k in batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_reads_all_kinds_and_resumes_exactly(mixed, single_rank, workers):
    reference = batch_keys(make(mixed, workers))
    assert Counter(k for b in reference for k in b) == Counter(all_keys(COUNTS))
    for stop in (3, 7):  # inside compressed shards: re-read from their start, skipped
        first = make(mixed, workers)
        before = batch_keys(first_batches(first, stop))
        resumed = make(mixed, workers)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert before + batch_keys(resumed) == reference


def test_elastic_resume_over_compressed_shards(mixed, monkeypatch):
    def run(world, workers, batches, state=None):
        got, states = [], []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            loader = make(mixed, workers, verify_digest=True)
            if state is not None:
                loader.load_state_dict(state)
            got += batch_keys(loader) if batches is None else batch_keys(
                first_batches(loader, batches))
            states.append(loader.state_dict())
        return [k for b in got for k in b], states[0]

    before, state = run(2, 2, 3)
    after, _ = run(3, 1, None, state)
    seen = Counter(before + after)
    assert max(seen.values()) == 1 and len(all_keys(COUNTS) - set(seen)) < 3


def test_a_cut_compressed_shard_is_an_error_not_a_short_shard(mixed, tmp_path, single_rank):
    folder = cut_copy(mixed, tmp_path / "ds", "shard-000002.tar.zst", 30)
    ds = wds.StreamingDataset(str(folder), shuffle=False, retries=0)
    with pytest.raises(ShardError, match="shard-000002.tar.zst"):
        list(wds.DataLoader(ds, batch_size=4, num_workers=0))


def test_pipe_urls_and_the_cache(mixed, tmp_path, single_rank):
    urls = [f"pipe:cat {path}" for path in sorted(mixed.glob("shard-*"))]
    loader = wds.DataLoader(wds.StreamingDataset(urls, shuffle=False, cache_dir=tmp_path / "c"),
                            batch_size=None, num_workers=0)
    assert Counter(s["__key__"] for s in loader) == Counter(all_keys(COUNTS))
    cache = ShardCache(tmp_path / "c")
    stored = sorted(p.read_bytes() for p in mixed.glob("shard-*"))
    assert sorted(open(p, "rb").read() for p, _, _ in cache.entries()) == stored
    # a cut compressed stream is never cached
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes((mixed / "shard-000001.tar.gz").read_bytes()[:-10])
    other = ShardCache(tmp_path / "c2")
    ds = wds.StreamingDataset([f"pipe:cat {cut}"], shuffle=False, retries=0,
                              cache_dir=tmp_path / "c2")
    with pytest.raises(ShardError):
        list(wds.DataLoader(ds, batch_size=None, num_workers=0))
    assert other.entries() == []


@pytest.mark.slow
def test_from_s3(s3, s3_bucket, mixed, single_rank, tmp_path):
    client = s3.client()
    for path in mixed.iterdir():
        client.put_object(Bucket=s3_bucket, Key=f"ds/{path.name}", Body=path.read_bytes())
    url = f"s3://{s3_bucket}/ds/"
    for opener in ("sdk", "fsspec", "cli"):
        ds = wds.StreamingDataset(url, opener=opener, verify_digest=True, seed=1)
        assert Counter(keys(wds.DataLoader(ds, batch_size=4, num_workers=2))) == \
            Counter(all_keys(COUNTS))
    client.delete_object(Bucket=s3_bucket, Key="ds/index.json")  # a listing of the prefix
    info, _ = index_shard(url + "shard-000003.tar.bz2")
    assert info.samples == COUNTS[3]
    listed = json.loads(wdstream("ls", url, "--json").stdout)
    assert listed["samples"] == sum(COUNTS) and len(listed["shards"]) == len(COUNTS)


def test_digest_mismatch_is_about_stored_bytes(mixed, tmp_path, single_rank):
    manifest = json.loads((mixed / "index.json").read_text())
    folder = cut_copy(mixed, tmp_path / "ds")
    # same tar content, compressed differently: another stored digest and size
    name = "shard-000001.tar.gz"
    tar = gzip.decompress((folder / name).read_bytes())
    (folder / name).write_bytes(gzip.compress(tar, compresslevel=1, mtime=5))
    ds = wds.StreamingDataset(str(folder), shuffle=False, retries=0, verify_digest=True)
    with pytest.raises(ShardError, match="shard-000001.tar.gz"):
        list(wds.DataLoader(ds, batch_size=None, num_workers=0))
    assert manifest["shards"][1]["url"] == name


# --------------------------------------------------------------------------- writing


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("records") / "r.jsonl"
    with open(path, "w") as f:
        for i in range(3000):
            f.write(json.dumps({"id": i, "text": f"record {i} " + "lorem ipsum dolor " * 40,
                                "noise": os.urandom(60).hex()}) + "\n")
    return path


@pytest.mark.parametrize("codec, suffix", [("zstd", ".tar.zst"), ("gzip", ".tar.gz")])
@pytest.mark.slow
def test_pack_compressed_is_the_same_for_any_workers(records, tmp_path, codec, suffix):
    outputs = []
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        wdstream("pack", records, "-o", out, "--compress", codec, "--max-size", "400kB",
                 "--workers", workers, "-q")
        outputs.append(out)
    names = sorted(p.name for p in outputs[0].iterdir())
    assert names == sorted(p.name for p in outputs[1].iterdir())
    assert len(names) > 3 and all(n.endswith(suffix) for n in names if n != "index.json")
    for name in names:
        assert (outputs[0] / name).read_bytes() == (outputs[1] / name).read_bytes()
    manifest = json.loads((outputs[0] / "index.json").read_text())
    assert manifest["compression"]["codec"] == codec and manifest["samples"] == 3000
    for entry in manifest["shards"]:
        stored = (outputs[0] / entry["url"]).read_bytes()
        assert entry["bytes"] == len(stored) <= 400_000
        assert entry["sha256"] == hashlib.sha256(stored).hexdigest()
    first = outputs[0] / manifest["shards"][0]["url"]
    flag = "--zstd" if codec == "zstd" else "--gzip"
    listed = subprocess.run(["tar", flag, "-tf", first], capture_output=True, text=True,
                            check=True).stdout.split()
    assert len(listed) == manifest["shards"][0]["samples"]
    if codec == "gzip":
        import webdataset

        read = webdataset.WebDataset(str(first), shardshuffle=False, empty_check=False)
        assert [s["__key__"] for s in read] == listed_keys(listed)
    wdstream("verify", outputs[0], "--deep")
    loader = wds.DataLoader(wds.StreamingDataset(str(outputs[0]), shuffle=False),
                            batch_size=None, num_workers=0)
    assert [s["json"]["id"] for s in loader] == list(range(3000))


def listed_keys(names):
    return [name.split(".")[0] for name in names]


def test_max_size_bounds_the_stored_bytes_of_incompressible_data(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(12):
        (folder / f"f{i:03d}.bin").write_bytes(os.urandom(90_000))
    for codec in ("zstd", "gzip"):
        out = tmp_path / codec
        wdstream("pack", folder, "-o", out, "--compress", codec, "--level", "1",
                 "--max-size", "200kB", "-q")
        sizes = [p.stat().st_size for p in out.glob("shard-*")]
        assert len(sizes) >= 6 and max(sizes) <= 200_000


def test_bad_compression_options(records, tmp_path):
    result = wdstream("pack", records, "-o", tmp_path / "x", "--compress", "gzip",
                      "--level", "12", code=2)
    assert "--level 12" in result.stderr
    result = wdstream("pack", records, "-o", tmp_path / "y", "--level", "3", code=2)
    assert "--compress" in result.stderr


@pytest.mark.parametrize("bytes_as", ["bytes", "tensor"])
def test_large_payloads_of_compressed_shards_through_workers(tmp_path, single_rank, bytes_as):
    from wdstream.shards.tar_writer import TarWriter

    payloads = {f"k{i:02d}": os.urandom(200_000 + i * 1000) for i in range(10)}
    import io

    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for key, data in payloads.items():
        writer.add(f"{key}.bin", data)
        writer.add(f"{key}.txt", key.encode())
    writer.close()
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "a.tar.zst").write_bytes(COMPRESS[".tar.zst"](buffer.getvalue()))
    (folder / "b.tar.gz").write_bytes(COMPRESS[".tar.gz"](buffer.getvalue()))
    wdstream("index", folder, "--quiet")
    ds = wds.StreamingDataset(str(folder), shuffle=False)
    got = {}
    for sample in wds.DataLoader(ds, batch_size=None, num_workers=2, bytes_as=bytes_as):
        value = sample["bin"]
        got.setdefault(sample["__key__"], []).append(
            bytes(value) if isinstance(value, bytes) else value.numpy().tobytes())
    assert got == {key: [data, data] for key, data in payloads.items()}


@pytest.mark.slow
def test_stray_members_are_reported_everywhere(tmp_path, single_rank):
    from wdstream.shards.tar_writer import TarWriter

    folder = tmp_path / "ds"
    folder.mkdir()
    with open(folder / "a.tar.gz", "wb") as f:
        buffer = __import__("io").BytesIO()
        writer = TarWriter(buffer)
        writer.add("README", b"read me")
        for i in range(5):
            writer.add(f"k{i}.txt", b"x")
        writer.add("__meta__", b"{}")
        writer.add(".hidden", b"")
        writer.close()
        f.write(gzip.compress(buffer.getvalue()))
    listed = wdstream("ls", folder, "--json")
    assert json.loads(listed.stdout)["shards"][0]["stray_members"] == 3
    assert "stray members" in wdstream("ls", folder).stdout
    verified = wdstream("verify", folder, "--deep")
    assert "3 member(s) that belong to no sample were skipped" in verified.stderr
    indexed = wdstream("index", folder)
    assert "stray members" in indexed.stdout and "README" in indexed.stdout
    loader = wds.DataLoader(wds.StreamingDataset(str(folder)), batch_size=2, num_workers=2)
    assert sum(len(b["__key__"]) for b in loader) == 5
    assert loader.stats["stray_members"] == 3


def test_a_compressed_stream_is_not_read_past_its_recorded_size(tmp_path):
    # random payloads do not compress: the shard is far larger than the size recorded for it
    records = [{"blob": os.urandom(3000).hex()} for _ in range(200)]
    source = tmp_path / "r.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    wdstream("pack", source, "--output", tmp_path / "ds", "--compress", "zstd", "--quiet")
    manifest = json.loads((tmp_path / "ds" / "index.json").read_text())
    [shard] = manifest["shards"]
    assert shard["bytes"] > 2 << 18  # more than two of the reader's stored reads
    manifest["bytes"] = shard["bytes"] = 600 * shard["samples"] // 100  # still a valid count
    (tmp_path / "ds" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="goes on past the .* stored bytes recorded for it"):
        list(wds.StreamingDataset(str(tmp_path / "ds"), shuffle=False, retries=0))
    with pytest.raises(ShardError, match="goes on past the"):
        list(read_samples(str(tmp_path / "ds")))
