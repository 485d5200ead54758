"""Hostile shard bytes: streams that go on past the tar, huge extended headers, a shard cache in
a directory others can write, and shards swapped behind the reader. Every case ends in
wdstream's own error naming the URL (or in the right samples), promptly and within bounded
memory and disk."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import os
import threading
import time
import tracemalloc

import pytest

import wdstream
from tests.support.proxy import TcpProxy
from tests.support.servers import free_port
from tests.support.shard_data import sample_key, shard_bytes, write_dataset
from wdstream.errors import ShardError, ShardMismatchError
from wdstream.shards.identity import head_digest
from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.shards.tar_buffer import DRAIN_MAX
from wdstream.shards.tar_header import BLOCK
from wdstream.shards.tar_reader import iter_members
from wdstream.shards.tar_writer import TarWriter
from wdstream.sources.cache import ShardCache
from wdstream.stream.plan.epoch import Span
from wdstream.stream.read.shard_reader import ReadOptions, ShardTable, SpanReader

pytestmark = pytest.mark.usefixtures("single_rank")


def dataset(source, **kwargs):
    kwargs.setdefault("shuffle", False)
    kwargs.setdefault("retries", 1)
    ds = wdstream.StreamingDataset(source, **kwargs)
    ds.read_options = dataclasses.replace(ds.read_options, backoff=0.01)
    return ds


def info_of(name: str, data: bytes, samples: int, *, identity: bool = True) -> ShardInfo:
    last = sample_key(int(name[6:12]), samples - 1) if identity else None
    return ShardInfo(name, samples, len(data), hashlib.sha256(data).hexdigest(),
                     head_digest(data) if identity else None, last)


def run_with_timeout(function, seconds=20.0):
    """``function()``'s result or exception, failing the test if it takes longer (a hang)."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# --------------------------------------------------------------------------- streams that go on


class EndlessHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``/ds/index.json`` and ``/ds/shard-000000.tar``; the shard's body goes on with
    zeros after the tar until the client hangs up (no Content-Length)."""

    shard = b""
    manifest = b""
    sent: list[int] = []

    def do_HEAD(self):  # http.server's naming
        self.send_response(200)
        self.end_headers()

    def do_GET(self):
        if self.path.endswith("index.json"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.manifest)))
            self.end_headers()
            self.wfile.write(self.manifest)
            return
        self.send_response(200)
        self.end_headers()
        sent = 0
        try:
            self.wfile.write(self.shard)
            sent = len(self.shard)
            zeros = bytes(1 << 16)
            while sent < 1 << 34:
                self.wfile.write(zeros)
                sent += len(zeros)
        except OSError:
            pass
        finally:
            self.sent.append(sent)

    def log_message(self, *args):
        pass


@pytest.fixture
def endless_http():
    data = shard_bytes(0, 4)
    handler = type("Handler", (EndlessHandler,), {
        "shard": data, "sent": [],
        "manifest": Manifest([info_of("shard-000000.tar", data, 4)], ["json", "txt"]
                             ).to_json().encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ds/", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("with_manifest", [True, False])
def test_http_object_that_streams_on_after_the_tar(endless_http, with_manifest):
    prefix, handler = endless_http
    url = prefix + "shard-000000.tar"
    source = prefix if with_manifest else [url]
    match = "goes on past the" if with_manifest else "goes on for more than"
    with pytest.raises(ShardMismatchError, match=match) as info:
        run_with_timeout(lambda: list(dataset(source, timeout=5)))
    assert url in str(info.value)
    assert info.value.transient is False


def _pipe_source(shard, after="/dev/zero"):
    return f"pipe:cat '{shard}' {after}"


def test_pipe_that_goes_on_after_the_tar(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(shard_bytes(0, 3))
    url = _pipe_source(shard)
    with pytest.raises(ShardMismatchError, match=f"more than {DRAIN_MAX} bytes after") as info:
        run_with_timeout(lambda: list(dataset([url])))
    assert url in str(info.value)
    # with the manifest's byte count: not one byte read past it
    size = shard.stat().st_size
    table = ShardTable([url], samples=[3], bytes=[size])
    reader = SpanReader([Span(0, 0, 3)], table, ReadOptions(retries=0))
    with pytest.raises(ShardMismatchError, match=f"past the {size} bytes"):
        run_with_timeout(lambda: list(reader))


def test_endless_stream_into_the_cache_stays_bounded(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(shard_bytes(0, 3))
    cache_dir = tmp_path / "cache"
    biggest = []
    stop = threading.Event()

    def watch():  # the largest file the cache directory held while the read ran
        while not stop.is_set():
            sizes = [e.stat().st_size for e in os.scandir(cache_dir)] if cache_dir.exists() else []
            biggest.append(max(sizes, default=0))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(ShardMismatchError):
            run_with_timeout(lambda: list(dataset([_pipe_source(shard)], cache_dir=cache_dir,
                                                  cache_limit="100KB")))
        size = shard.stat().st_size
        table = ShardTable([_pipe_source(shard, "/dev/urandom")], samples=[3], bytes=[size])
        options = ReadOptions(retries=0, cache_dir=str(cache_dir), cache_limit="1MB")
        with pytest.raises(ShardMismatchError):
            run_with_timeout(lambda: list(SpanReader([Span(0, 0, 3)], table, options)))
    finally:
        stop.set()
        watcher.join()
    assert max(biggest) <= 100_000
    assert [e.name for e in os.scandir(cache_dir) if not e.name.startswith(".lock")] == []


def _extended_header(typeflag: bytes, size: int) -> bytes:
    header = bytearray(BLOCK)
    header[:13] = b"././@LongLink"
    header[100:108] = b"0000644\x00"
    header[124:136] = b"%011o\x00" % size
    header[136:148] = b"00000000000\x00"
    header[156] = typeflag[0]
    header[257:265] = b"ustar  \x00"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


@pytest.mark.parametrize("typeflag", [b"L", b"K", b"x", b"g"])
def test_huge_extended_header_is_refused_without_allocating(typeflag):
    claim = 3 << 29  # 1.5 GiB
    data = _extended_header(typeflag, claim) + b"name.txt\x00" + bytes(10 * BLOCK)
    tracemalloc.start()
    try:
        with pytest.raises(ShardError, match=f"extended header of {claim} bytes"):
            list(iter_members(io.BytesIO(data), "huge.tar"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_member_larger_than_the_manifest_says_is_refused_before_reading():
    out = io.BytesIO()
    writer = TarWriter(out)
    writer.add("a.bin", bytes(5000))
    writer.close()
    with pytest.raises(ShardError, match="runs past the 2048 bytes recorded"):
        list(iter_members(io.BytesIO(out.getvalue()[:2048]), "x.tar", limit=2048))
    with pytest.raises(ShardMismatchError, match="goes on past the 2048 bytes"):
        list(iter_members(io.BytesIO(out.getvalue()), "x.tar", limit=2048))


# --------------------------------------------------------------------------- the cache


@pytest.fixture
def cached_dataset(tmp_path):
    """Two shards of the same size behind a pipe (so that they are cached), a manifest."""
    folder = tmp_path / "data"
    folder.mkdir()
    shards = [shard_bytes(i, 4) for i in range(2)]
    assert len(shards[0]) == len(shards[1])
    for i, data in enumerate(shards):
        (folder / f"shard-00000{i}.tar").write_bytes(data)
    infos = [info_of(f"shard-00000{i}.tar", data, 4) for i, data in enumerate(shards)]
    urls = [f"pipe:cat '{folder}/shard-00000{i}.tar'" for i in range(2)]
    table = ShardTable(urls, samples=[4, 4], bytes=[i.bytes for i in infos],
                       sha256=[i.sha256 for i in infos], heads=[i.head for i in infos],
                       last_keys=[i.last_key for i in infos])
    return table, shards, tmp_path / "cache"


def read_table(table, cache_dir, **options):
    options = ReadOptions(retries=0, cache_dir=str(cache_dir), **options)
    spans = [Span(i, 0, n) for i, n in enumerate(table.samples)]
    return [s["__key__"] for s in run_with_timeout(lambda: list(SpanReader(spans, table,
                                                                            options)))]


def expected_keys(table):
    return [sample_key(s, i) for s, n in enumerate(table.samples) for i in range(n)]


def entry_path(table, shard, cache_dir):
    return ShardCache(cache_dir).path_for(table.urls[shard], table.bytes[shard],
                                          table.sha256[shard])


def test_planted_symlink_and_fifo_entries_are_not_followed(cached_dataset, tmp_path):
    table, shards, cache_dir = cached_dataset
    cache_dir.mkdir()
    secret = tmp_path / "secret.tar"
    secret.write_bytes(shards[1])  # the right size, a valid tar: only the link is wrong
    os.symlink(secret, entry_path(table, 0, cache_dir))
    os.mkfifo(entry_path(table, 1, cache_dir))
    assert read_table(table, cache_dir) == expected_keys(table)
    for shard in (0, 1):  # replaced by the real shards, read from their source
        path = entry_path(table, shard, cache_dir)
        assert not os.path.islink(path) and open(path, "rb").read() == shards[shard]
    assert secret.read_bytes() == shards[1]


def test_planted_lock_symlink_creates_nothing_outside(cached_dataset, tmp_path):
    table, _shards, cache_dir = cached_dataset
    cache_dir.mkdir()
    outside = tmp_path / "outside" / "created-by-wdstream"
    outside.parent.mkdir()
    os.symlink(outside, cache_dir / ".lock")
    limit = table.bytes[0] + 100  # room for one shard: eviction must still run
    assert read_table(table, cache_dir, cache_limit=limit) == expected_keys(table)
    assert not outside.exists() and os.listdir(outside.parent) == []
    assert ShardCache(cache_dir).total_bytes() <= limit
    assert (cache_dir / ".lock").is_file() and not (cache_dir / ".lock").is_symlink()
    os.unlink(cache_dir / ".lock")
    os.mkfifo(cache_dir / ".lock")  # a FIFO there: no hang either
    assert read_table(table, cache_dir) == expected_keys(table)
    assert (cache_dir / ".lock").is_file()


@pytest.mark.parametrize("verify_digest", [False, True])
@pytest.mark.parametrize("identity", [True, False])
def test_poisoned_same_size_entry_is_not_served(cached_dataset, verify_digest, identity):
    table, shards, cache_dir = cached_dataset
    if not identity:  # an older manifest: no head, no last key
        table = dataclasses.replace(table, heads=None, last_keys=None)
    cache_dir.mkdir()
    poisoned = entry_path(table, 0, cache_dir)
    with open(poisoned, "wb") as file:
        file.write(shards[1])  # same size, a valid tar, the other shard's samples
    keys = read_table(table, cache_dir, verify_digest=verify_digest)
    if identity or verify_digest:
        assert keys == expected_keys(table)
        assert open(poisoned, "rb").read() == shards[0]
    else:
        # Size and end marker match: only the reader's own count checks remain, and the
        # other shard's samples pass them. This is what the manifest's head is for.
        assert keys == [sample_key(1, i) for i in range(4)] * 2


# --------------------------------------------------------------------------- swapped objects


class SwappingProxy(TcpProxy):
    """A TCP proxy in front of the S3 server that rewrites the first ``swaps`` requests for
    ``key`` into requests for ``other`` (same length): the reader gets another object of the
    same size in place of the one it asked for."""

    def __init__(self, target_port: int, key: str, other: str, swaps: int):
        assert len(key) == len(other)
        self.key, self.other, self.swaps = key.encode(), other.encode(), swaps
        self._swap_lock = threading.Lock()
        super().__init__(target_port, chunk=65536)

    def rewrite_request(self, data: bytes) -> bytes:
        if b"GET " in data and self.key in data:
            with self._swap_lock:
                if self.swaps > 0:
                    self.swaps -= 1
                    data = data.replace(self.key, self.other, 1)
        return data


@pytest.fixture
def swapped_s3(s3, moto_server, tmp_path, monkeypatch):
    """Two same-size shards in S3; the first GET of the first is answered with the second."""
    folder = tmp_path / "data"
    write_dataset(folder, [6, 6])
    bucket = moto_server.create_bucket(f"swap-{os.getpid()}-{time.monotonic_ns()}")
    client = moto_server.client()
    names = sorted(p.name for p in folder.glob("*.tar"))
    for name in names:
        client.put_object(Bucket=bucket, Key=f"d/{name}", Body=(folder / name).read_bytes())
    proxy = SwappingProxy(moto_server.port, f"d/{names[0]}", f"d/{names[1]}", swaps=1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
    yield bucket, client, folder, proxy
    proxy.close()


def put_manifest(client, bucket, folder, identity):
    infos = [info_of(p.name, p.read_bytes(), 6, identity=identity)
             for p in sorted(folder.glob("*.tar"))]
    client.put_object(Bucket=bucket, Key="d/index.json",
                      Body=Manifest(infos, ["json", "txt"]).to_json().encode())


@pytest.mark.parametrize("verify_digest", [False, True])
def test_swapped_object_is_caught_before_any_sample(swapped_s3, verify_digest):
    bucket, client, folder, _proxy = swapped_s3
    put_manifest(client, bucket, folder, identity=True)
    delivered = []
    ds = dataset(f"s3://{bucket}/d/", opener="sdk", verify_digest=verify_digest, retries=3)
    with pytest.raises(ShardMismatchError, match="not the shard the manifest describes"):
        for sample in ds:
            delivered.append(sample["__key__"])
    assert delivered == []  # nothing of the wrong shard, nothing twice
    assert ds.stream_context.stats.take()["retries"] == 0


def test_swapped_object_without_identity_keys_raises_with_verify_digest(swapped_s3):
    """An older manifest (no head): the wrong shard's samples do reach the loop, but the
    digest at its end raises, and is not 'repaired' by a retry."""
    bucket, client, folder, _proxy = swapped_s3
    put_manifest(client, bucket, folder, identity=False)
    delivered = []
    ds = dataset(f"s3://{bucket}/d/", opener="sdk", verify_digest=True, retries=3)
    with pytest.raises(ShardMismatchError, match="sha256"):
        for sample in ds:
            delivered.append(sample["__key__"])
    assert delivered == [sample_key(1, i) for i in range(6)]
    assert ds.stream_context.stats.take()["retries"] == 0


def test_shard_replaced_between_attempts_is_caught_on_the_retry(tmp_path):
    """A read cut in the middle, and the retry finds another shard at the URL: the retry
    does not skip 'delivered' samples of a different shard."""
    folder = tmp_path / "data"
    write_dataset(folder, [6, 6])
    shard = folder / "shard-000000.tar"
    data = shard.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2])
    state = tmp_path / "attempt"
    # first attempt: half the shard, then a failure; later attempts: the other shard's bytes
    command = (f"if [ -e '{state}' ]; then cat '{folder}/shard-000001.tar'; "
               f"else touch '{state}'; cat '{cut}'; exit 1; fi")
    table = ShardTable([f"pipe:{command}"], samples=[6], bytes=[len(data)])
    reader = SpanReader([Span(0, 0, 6)], table, ReadOptions(retries=2, backoff=0.01))
    delivered = []
    with pytest.raises(ShardMismatchError, match="changed between reads"):
        for sample in reader:
            delivered.append(sample["__key__"])
    assert delivered and all(k.startswith("s000_") for k in delivered)
    assert reader.stats.retries == 1


def test_manifest_identity_keys_round_trip_and_are_validated(tmp_path):
    data = shard_bytes(0, 2)
    info = info_of("shard-000000.tar", data, 2)
    manifest = Manifest([info], ["json", "txt"])
    again = Manifest.from_json(manifest.to_json())
    assert again.shards == [info]
    doc = json.loads(manifest.to_json())
    doc["shards"][0]["head"] = "XYZ"
    with pytest.raises(wdstream.errors.ManifestError, match=r"shards\[0\]\.head"):
        Manifest.from_json(json.dumps(doc))
    old = Manifest([dataclasses.replace(info, head=None, last_key=None)], ["json"]).to_json()
    assert "head" not in old and "last_key" not in old


# --------------------------------------------------------------------------- policies, CLI


def _local_table(tmp_path, **changes):
    folder = tmp_path / "data"
    paths = write_dataset(folder, [4, 4])
    infos = [info_of(os.path.basename(p), open(p, "rb").read(), 4) for p in paths]
    table = ShardTable(paths, samples=[4, 4], bytes=[i.bytes for i in infos],
                       heads=[i.head for i in infos], last_keys=[i.last_key for i in infos])
    return dataclasses.replace(table, **changes)


def test_mismatch_before_delivery_is_skipped_under_skip(tmp_path):
    table = _local_table(tmp_path)
    table = dataclasses.replace(table, heads=[table.heads[1], table.heads[1]])
    reader = SpanReader([Span(0, 0, 4), Span(1, 0, 4)], table,
                        ReadOptions(retries=2, on_error="skip"))
    samples = list(reader)
    assert samples[:4] == [None] * 4 and [s["__key__"] for s in samples[4:]] == [
        sample_key(1, i) for i in range(4)]
    assert reader.stats.retries == 0 and reader.stats.skipped_samples == 4


def test_mismatch_after_delivery_raises_even_under_skip(tmp_path):
    table = _local_table(tmp_path)
    table = dataclasses.replace(table, last_keys=["other", table.last_keys[1]])
    reader = SpanReader([Span(0, 0, 4), Span(1, 0, 4)], table,
                        ReadOptions(retries=2, on_error="skip"))
    with pytest.raises(ShardMismatchError, match="the last sample is 's000_00003'"):
        list(reader)
    assert reader.stats.retries == 0


@pytest.mark.slow
def test_packed_and_indexed_shards_swapped_on_disk(tmp_path, cli_env):
    """Through the real CLI: `pack` and `index` record the same identity keys, and two shards
    of the same size swapped on disk are refused before any of their samples."""
    import subprocess

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"record {i:04d}"}) + "\n" for i in range(40)))
    out = tmp_path / "out"
    subprocess.run(["wdstream", "pack", str(source), "--output", str(out), "--max-count", "20"],
                   env=cli_env, check=True, capture_output=True)
    packed = json.loads((out / "index.json").read_text())["shards"]
    subprocess.run(["wdstream", "index", str(out), "--overwrite", "-q"], env=cli_env, check=True,
                   capture_output=True)
    indexed = json.loads((out / "index.json").read_text())["shards"]
    assert [(s["head"], s["last_key"]) for s in packed] == [
        (s["head"], s["last_key"]) for s in indexed]
    assert packed[0]["bytes"] == packed[1]["bytes"] and packed[0]["head"] != packed[1]["head"]
    first, second = out / packed[0]["url"], out / packed[1]["url"]
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)
    with pytest.raises(ShardMismatchError, match="not the shard the manifest describes"):
        next(iter(dataset(str(out))))
    loader = wdstream.DataLoader(dataset(str(out)), batch_size=4, num_workers=1)
    with pytest.raises(ShardMismatchError, match="not the shard the manifest describes"):
        next(iter(loader))
    result = subprocess.run(["wdstream", "cat", str(out), "-n", "1"], env=cli_env,
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert "not the shard the manifest describes" in result.stderr
    assert "Traceback" not in result.stderr


def test_cache_does_not_keep_a_download_with_another_head(cached_dataset):
    table, shards, cache_dir = cached_dataset
    cache = ShardCache(cache_dir)
    wrong = f"pipe:cat '{table.urls[1][len('pipe:cat '):].strip(chr(39))}'"

    def opener():
        from wdstream.sources.openers import open_read
        return open_read(wrong)

    stream = cache.open(table.urls[0], opener, size=table.bytes[0], sha256=table.sha256[0],
                        head=table.heads[0])
    while stream.read(1 << 16):
        pass
    stream.close()
    assert cache.stored == 0 and cache.entries() == []
    stream = cache.open(table.urls[1], opener, size=table.bytes[1], sha256=table.sha256[1],
                        head=table.heads[1])
    while stream.read(1 << 16):
        pass
    stream.close()
    assert cache.stored == 1


def test_listing_sizes_bound_a_dataset_without_manifest(tmp_path):
    """Without a manifest the listed object sizes bound the reads: a shard that grew after
    the listing is an error, not a longer read."""
    folder = tmp_path / "data"
    paths = write_dataset(folder, [3, 3], manifest=False)
    ds = dataset(str(folder))
    with open(paths[1], "ab") as file:  # appended to after the listing
        file.write(shard_bytes(9, 3))
    with pytest.raises(ShardMismatchError, match="goes on past the") as info:
        list(ds)
    assert paths[1] in str(info.value)
