"""The local shard cache (wdstream.sources.cache), alone and through StreamingDataset /
DataLoader: later epochs read the cached copies (the S3 objects are deleted after epoch 1),
the size limit with least-recently-used eviction, workers and processes sharing a folder,
no entry from a failed, partial or wrong read, and no wait for a whole shard before the
first sample."""

from __future__ import annotations

import dataclasses
import errno
import multiprocessing
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest

import wdstream
from tests.support.shard_data import all_keys, keys_of, shard_bytes, write_dataset
from wdstream.errors import InputError, StreamError
from wdstream.sources.cache import ShardCache
from wdstream.sources.cache import folder as cache_folder
from wdstream.sources.openers import open_read

COUNTS = [6, 5, 7, 4]


def temporaries(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(cache_folder.TEMP_PREFIX)]


def entry_bytes(cache: ShardCache) -> list[bytes]:
    return [Path(path).read_bytes() for path, _size, _mtime in cache.entries()]


def read_through(cache: ShardCache, url: str, timeout: float = 10, **kwargs) -> bytes:
    with cache.open(url, lambda: open_read(url, timeout=timeout), **kwargs) as stream:
        return stream.read()


def fast_retries(ds, retries=2):
    ds.read_options = dataclasses.replace(ds.read_options, retries=retries, backoff=0.01)
    return ds


@pytest.fixture
def s3_data(s3, s3_bucket, tmp_path):
    """COUNTS shards and their manifest under s3://BUCKET/data/; (prefix URL, local folder)."""
    folder = tmp_path / "data"
    write_dataset(folder, COUNTS)
    return s3.upload(folder, s3_bucket, "data"), folder


def delete_shards(s3, url):
    bucket = url.split("/")[2]
    client = s3.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix="data/")["Contents"]
    for item in listed:
        if item["Key"].endswith(".tar"):
            client.delete_object(Bucket=bucket, Key=item["Key"])


@pytest.fixture
def shard_files(tmp_path):
    """Three shard files of a few KB; their paths."""
    folder = tmp_path / "src"
    return write_dataset(folder, [8, 8, 8], manifest=False)


# --------------------------------------------------------------------------- through the loader


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_later_epochs_read_the_cache(s3, s3_data, tmp_path, single_rank, workers):
    url, folder = s3_data
    cache_dir = tmp_path / "cache"
    ds = wdstream.StreamingDataset(url, opener="sdk", seed=5, shuffle_window=4,
                                   cache_dir=cache_dir, cache_limit="10MB")
    loader = wdstream.DataLoader(ds, batch_size=3, num_workers=workers)
    assert Counter(keys_of(loader)) == Counter(all_keys(COUNTS))
    cache = ShardCache(cache_dir)
    # every shard is read to its end by some stream (2 workers split a shard between them)
    originals = sorted(p.read_bytes() for p in folder.glob("*.tar"))
    assert sorted(entry_bytes(cache)) == originals
    assert not temporaries(cache_dir)

    delete_shards(s3, url)
    with pytest.raises(StreamError, match="not found"):  # the source really is gone
        open_read(url + "shard-000000.tar", opener="sdk").read()
    for _epoch in (1, 2):  # other shuffles: workers read what the other worker stored
        assert Counter(keys_of(loader)) == Counter(all_keys(COUNTS))
    assert loader.stats["retries"] == 0 and not loader.stats["skipped_shards"]


def test_replaced_shards_are_not_served_stale(s3, s3_data, tmp_path, single_rank):
    """The key holds the manifest's size and digest: new shards under the same URLs (and a new
    manifest) are fetched again."""
    url, _folder = s3_data
    cache_dir = tmp_path / "cache"

    def texts():
        ds = wdstream.StreamingDataset(url, opener="sdk", shuffle=False, cache_dir=cache_dir)
        return {s["__key__"]: s["json"]["pad"] for s in ds}

    assert set(texts().values()) == {""}
    replacement = tmp_path / "v2"
    write_dataset(replacement, COUNTS, payload=3)  # same keys, other bytes
    s3.upload(replacement, url.split("/")[2], "data")
    assert set(texts().values()) == {"xxx"}
    assert len(ShardCache(cache_dir).entries()) == 2 * len(COUNTS)


@pytest.mark.slow
def test_first_sample_does_not_wait_for_the_whole_shard(tmp_path, single_rank):
    """A source that sends about half of a 3 MB shard, then stalls 3 s before the rest: the
    first sample arrives at once through the cache (the tar reader reads 1 MiB at a time),
    the shard is stored at its end, and the next epoch reads the copy."""
    data = shard_bytes(0, 30, payload=100_000)
    path = tmp_path / "slow.tar"
    path.write_bytes(data)
    half = 1_500_000
    url = f"pipe:head -c {half} '{path}'; sleep 3; tail -c +{half + 1} '{path}'"
    cache_dir = tmp_path / "cache"
    ds = wdstream.StreamingDataset(url, shuffle=False, cache_dir=cache_dir, timeout=10)
    started = time.monotonic()
    samples = iter(ds)
    assert next(samples)["__key__"] == "s000_00000"
    assert time.monotonic() - started < 2
    assert len(list(samples)) == 29
    assert time.monotonic() - started >= 3
    assert entry_bytes(ShardCache(cache_dir)) == [data]
    started = time.monotonic()
    assert len(list(ds)) == 30
    assert time.monotonic() - started < 2, "the second epoch should not run the command"


def test_a_corrupt_cached_copy_is_dropped_on_retry(tmp_path, single_rank):
    """A copy damaged on disk fails the reader's checks; the retry reads the source again and
    stores a good copy."""
    data = shard_bytes(0, 5)
    (tmp_path / "a.tar").write_bytes(data)
    url = f"pipe:cat '{tmp_path / 'a.tar'}'"
    cache_dir = tmp_path / "cache"
    ds = fast_retries(wdstream.StreamingDataset(url, shuffle=False, cache_dir=cache_dir))
    assert len(list(ds)) == 5
    [(entry, _size, _mtime)] = ShardCache(cache_dir).entries()
    damaged = bytearray(data)
    damaged[148] ^= 0x01  # the first header's checksum field
    Path(entry).write_bytes(bytes(damaged))
    assert [s["__key__"] for s in ds] == [f"s000_{i:05d}" for i in range(5)]
    assert entry_bytes(ShardCache(cache_dir)) == [data]


def test_bad_settings_fail_at_construction(tmp_path):
    with pytest.raises(InputError, match="not a size"):
        wdstream.StreamingDataset(["s3://b/x.tar"], cache_dir=tmp_path / "c", cache_limit="lots")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cache_dir"):
        wdstream.StreamingDataset(["s3://b/x.tar"], cache_dir=tmp_path / "file" / "c")
    assert ShardCache(tmp_path / "c", "2KiB").limit == 2048
    assert ShardCache(tmp_path / "c").limit == 10**10


# --------------------------------------------------------------------------- the cache alone


def test_hit_miss_and_keys(shard_files, tmp_path):
    cache = ShardCache(tmp_path / "cache", "1MB")
    url = f"pipe:cat '{shard_files[0]}'"
    data = Path(shard_files[0]).read_bytes()
    assert read_through(cache, url) == data
    assert (cache.hits, cache.misses, cache.stored) == (0, 1, 1)
    assert read_through(cache, url) == data
    assert (cache.hits, cache.misses, cache.stored) == (1, 1, 1)
    # another size/digest (a replaced shard, a new manifest) is another key
    assert read_through(cache, url, size=len(data)) == data
    assert cache.misses == 2 and len(cache.entries()) == 2
    # local files are read in place, never copied
    assert read_through(cache, shard_files[1]) == Path(shard_files[1]).read_bytes()
    assert len(cache.entries()) == 2 and cache.misses == 2
    names = [os.path.basename(p) for p, _s, _m in cache.entries()]
    assert all(re.fullmatch(r"[0-9a-f]{40}-[A-Za-z0-9._-]*shard-000000\.tar_", n) for n in names)


def test_limit_evicts_least_recently_used(shard_files, tmp_path):
    size = os.path.getsize(shard_files[0])
    cache = ShardCache(tmp_path / "cache", int(2.5 * size))
    urls = [f"pipe:cat '{p}'" for p in shard_files]
    read_through(cache, urls[0])
    time.sleep(0.02)
    read_through(cache, urls[1])
    time.sleep(0.02)
    read_through(cache, urls[0])  # a hit: now the most recently used
    time.sleep(0.02)
    read_through(cache, urls[2])  # over the limit: urls[1] goes
    assert cache.total_bytes() <= cache.limit
    kept = {p for p, _s, _m in cache.entries()}
    assert kept == {cache.path_for(urls[0]), cache.path_for(urls[2])}
    tiny = ShardCache(tmp_path / "tiny", size // 2)  # a shard larger than the limit: not kept
    assert read_through(tiny, urls[0]) == Path(shard_files[0]).read_bytes()
    assert tiny.entries() == [] and tiny.stored == 0  # the copy stopped at the limit


def test_limit_through_the_dataset(s3, s3_data, tmp_path, single_rank):
    url, folder = s3_data
    sizes = sorted(p.stat().st_size for p in folder.glob("*.tar"))
    limit = sizes[-1] + sizes[-2] + 100  # room for two shards, not three
    ds = wdstream.StreamingDataset(url, opener="sdk", shuffle=False, cache_dir=tmp_path / "c",
                                   cache_limit=limit)
    assert len(list(ds)) == sum(COUNTS)
    cache = ShardCache(tmp_path / "c")
    assert cache.total_bytes() <= limit and len(cache.entries()) == 2
    assert sorted(entry_bytes(cache)) == sorted(
        (folder / f"shard-00000{i}.tar").read_bytes() for i in (2, 3))  # the last two read


def test_failed_or_partial_reads_leave_nothing(shard_files, tmp_path):
    cache_dir = tmp_path / "cache"
    cache = ShardCache(cache_dir, "1MB")
    path = shard_files[0]
    data = Path(path).read_bytes()

    # the command fails after writing every byte
    with pytest.raises(StreamError, match="status 3"):
        read_through(cache, f"pipe:cat '{path}'; exit 3")
    # a stall in the middle
    with pytest.raises(StreamError, match="no data for 1 s"):
        read_through(cache, f"pipe:head -c 3000 '{path}'; sleep 30", timeout=1)
    # closed early (a span that ends inside the shard)
    url = f"pipe:cat '{path}'"
    with cache.open(url, lambda: open_read(url)) as stream:
        assert stream.read(3000) == data[:3000]
    # a clean exit, but short: at a member boundary, without the end-of-archive marker
    read_through(cache, f"pipe:head -c {len(data) - 1024} '{path}'")
    # the wrong size or digest for the manifest
    read_through(cache, url, size=len(data) + 1)
    read_through(cache, url, size=len(data), sha256="0" * 64, verify_digest=True)
    assert cache.entries() == [] and not temporaries(cache_dir) and cache.stored == 0
    # and then a good read is stored
    read_through(cache, url, size=len(data))
    assert entry_bytes(cache) == [data]


def test_failed_shard_through_the_dataset_leaves_nothing(shard_files, tmp_path, single_rank):
    good, bad = shard_files[0], shard_files[1]
    sources = [f"pipe:cat '{good}'", f"pipe:cat '{bad}'; echo boom >&2; exit 3"]
    ds = fast_retries(wdstream.StreamingDataset(sources, shuffle=False,
                                                cache_dir=tmp_path / "cache"))
    with pytest.raises(StreamError, match="status 3") as info:
        list(ds)
    assert "boom" in info.value.stderr
    assert entry_bytes(ShardCache(tmp_path / "cache")) == [Path(good).read_bytes()]
    assert not temporaries(tmp_path / "cache")


def test_disk_full_streams_on_uncached(shard_files, tmp_path, monkeypatch):
    cache = ShardCache(tmp_path / "cache")

    def full(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ShardCache, "_temporary", full)
    url = f"pipe:cat '{shard_files[0]}'"
    assert read_through(cache, url) == Path(shard_files[0]).read_bytes()
    assert cache.entries() == []


def test_abandoned_temporaries_are_removed(tmp_path):
    cache = ShardCache(tmp_path / "cache")
    dead = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    dead.start()
    dead.join()
    host = cache_folder.host()
    names = {
        "dead": f"{cache_folder.TEMP_PREFIX}{host}-{dead.pid}-{'a' * 16}",
        "live": f"{cache_folder.TEMP_PREFIX}{host}-{os.getpid()}-{'a' * 16}",
        "old": f"{cache_folder.TEMP_PREFIX}otherhost-1-{'a' * 16}",
        "recent": f"{cache_folder.TEMP_PREFIX}otherhost-2-{'a' * 16}",
    }
    for name in names.values():
        (tmp_path / "cache" / name).write_bytes(b"x")
    old = time.time() - cache_folder.STALE_TEMP_SECONDS - 10
    os.utime(tmp_path / "cache" / names["old"], (old, old))
    cache.evict()
    assert sorted(temporaries(tmp_path / "cache")) == sorted([names["live"], names["recent"]])


def _race_reader(cache_dir, urls, out):
    cache = ShardCache(cache_dir, "1MB")
    got = [read_through(cache, url) for url in urls]
    Path(out).write_bytes(b"".join(got))


def test_processes_racing_on_one_folder(shard_files, tmp_path):
    """Four processes read the same shards at the same time (slow sources, so the downloads
    overlap): each gets the right bytes, one entry per shard, no temporary file left."""
    cache_dir = tmp_path / "cache"
    urls = [f"pipe:sleep 0.3; cat '{p}'" for p in shard_files]
    expected = b"".join(Path(p).read_bytes() for p in shard_files)
    context = multiprocessing.get_context("fork")
    outs = [tmp_path / f"out{i}" for i in range(4)]
    procs = [context.Process(target=_race_reader, args=(cache_dir, urls, out)) for out in outs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert all(out.read_bytes() == expected for out in outs)
    cache = ShardCache(cache_dir)
    assert sorted(entry_bytes(cache)) == sorted(Path(p).read_bytes() for p in shard_files)
    assert not temporaries(cache_dir)


# --------------------------------------------------------------------------- only its own files


def fill(cache: ShardCache, shard_files, order=(0, 1, 2)) -> list[str]:
    """Read the shards in ``order`` through ``cache``, each later than the one before; their
    entries' paths."""
    urls = [f"pipe:cat '{p}'" for p in shard_files]
    for index in order:
        read_through(cache, urls[index])
        time.sleep(0.02)
    return [cache.path_for(url) for url in urls]


def test_files_not_its_own_are_neither_counted_nor_deleted(shard_files, tmp_path):
    """A user's files in cache_dir, larger than the limit, survive reads that overflow it,
    and do not count towards it: the cache keeps as many entries as without them."""
    size = os.path.getsize(shard_files[0])
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    old = time.time() - cache_folder.STALE_TEMP_SECONDS - 10
    theirs = {
        "thesis.docx": b"x" * (3 * size),
        ".tmp-notes": b"n",  # starts like a temporary file, is not one
        f".tmp-{cache_folder.host()}-999999-notes": b"n",
        "0" * 39 + "-short.tar": b"s",  # one hex digit short of an entry's name
        "A" * 40 + "-upper.tar": b"u",
    }
    for name, data in theirs.items():
        (cache_dir / name).write_bytes(data)
        os.utime(cache_dir / name, (old, old))
    (cache_dir / ("f" * 40 + "-folder")).mkdir()  # an entry's name, but a folder
    cache = ShardCache(cache_dir, int(2.5 * size))
    paths = fill(cache, shard_files)
    assert [p for p, _s, _m in cache.entries()] == paths[1:]  # the oldest evicted
    assert cache.total_bytes() == 2 * size
    for name, data in theirs.items():
        assert (cache_dir / name).read_bytes() == data
    assert (cache_dir / ("f" * 40 + "-folder")).is_dir()


def test_links_are_neither_followed_nor_deleted(shard_files, tmp_path):
    """Links in cache_dir to a file outside, under a name of the user's, an entry's name and
    an abandoned temporary file's name: not counted, not deleted, the file outside intact."""
    size = os.path.getsize(shard_files[0])
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * (3 * size))  # would overflow the limit if it were counted
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    old = time.time() - cache_folder.STALE_TEMP_SECONDS - 10
    links = [cache_dir / "data.tar", cache_dir / ("e" * 40 + "-x.tar"),
             cache_dir / f"{cache_folder.TEMP_PREFIX}otherhost-1-{'b' * 16}"]
    for link in links:
        os.symlink(outside, link)
        os.utime(link, (old, old), follow_symlinks=False)
    cache = ShardCache(cache_dir, int(2.5 * size))
    paths = fill(cache, shard_files)
    assert [p for p, _s, _m in cache.entries()] == paths[1:]
    assert all(link.is_symlink() for link in links)
    assert outside.read_bytes() == b"o" * (3 * size)


def test_an_entry_it_cannot_delete_is_skipped_with_one_warning(shard_files, tmp_path,
                                                              monkeypatch, caplog):
    """An entry whose unlink is refused (another user's in a sticky folder) is skipped: newer
    entries are evicted in its place, the total stays within the limit, and one warning names
    it, however many reads follow."""
    size = os.path.getsize(shard_files[0])
    cache = ShardCache(tmp_path / "cache", int(2.5 * size))
    urls = [f"pipe:cat '{p}'" for p in shard_files]
    stuck = cache.path_for(urls[0])
    unlink = os.unlink

    def refuse(path, *args, **kwargs):
        if os.fspath(path) == stuck:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    caplog.set_level("WARNING", logger="wdstream.sources.cache")
    fill(cache, shard_files, order=(0, 1, 2, 1, 2, 1))
    kept = [p for p, _s, _m in cache.entries()]
    assert kept[0] == stuck and len(kept) == 2  # the stuck one and the last read
    assert kept[1] == cache.path_for(urls[1])
    assert cache.total_bytes() <= cache.limit
    warnings = [r.getMessage() for r in caplog.records if stuck in r.getMessage()]
    assert len(warnings) == 1 and "cannot delete" in warnings[0]
    assert not any("exceed" in r.getMessage() for r in caplog.records)
    # a limit the stuck entry alone exceeds: everything else goes, and a warning says so, once
    small = ShardCache(tmp_path / "cache", size // 2)
    for _ in range(3):
        small.evict()
    assert [p for p, _s, _m in small.entries()] == [stuck]
    assert sum("exceed cache_limit" in r.getMessage() for r in caplog.records) == 1


def test_remove_checks_the_name(tmp_path):
    """The one function that deletes: only the cache's own names, never a link's target."""
    theirs = tmp_path / "thesis.docx"
    theirs.write_bytes(b"t")
    assert not cache_folder.remove(str(theirs)) and theirs.exists()
    entry = tmp_path / ("a" * 40 + "-x.tar")
    os.symlink(theirs, entry)
    assert cache_folder.remove(str(entry)) and not entry.is_symlink() and theirs.exists()
    assert not cache_folder.remove(str(entry))  # gone already
