"""Cutting many raw files into units: their footers are read many at once, never more than
``FILES_IN_FLIGHT``, and the units are the same in whatever order they come back, and when
child processes cut some of them; on S3 a footer is one GET of the file's tail (two for a
larger footer), a folder without subfolders is listed once, and a file shorter than listed
or a footer that cannot be read is an error naming the file."""

from __future__ import annotations

import os
import threading
import time

import pytest

import wdstream
from tests.sources.test_range_reads import gets_fixture  # noqa: F401 - the fixture gets
from tests.support.raw_data import PARQUET_FILES, upload_tree, write_parquet
from wdstream.errors import ShardError, ShardMismatchError, StreamError, WdstreamError
from wdstream.sources import range_reads, s3_objects
from wdstream.sources.range_fetchers import HttpStatusError
from wdstream.sources.s3_ranges import S3Ranges
from wdstream.tables import parquet, unit_processes, units
from wdstream.tables.files import RawFile, describe
from wdstream.tables.parquet import ParquetFormat
from wdstream.tables.reads import Access

pytestmark = pytest.mark.usefixtures("single_rank")


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("many")
    for index in range(48):
        rows = 1 + index % 5
        pq.write_table(pa.table({"id": list(range(rows))}), root / f"part-{index:03d}.parquet")
    return root


def test_footers_are_read_many_at_once_within_the_bound(many, monkeypatch):
    lock, now, most = threading.Lock(), [0], [0]
    cut = ParquetFormat.cut

    def slow_cut(self, file, access):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05 if file.name.endswith(("1.parquet", "4.parquet")) else 0.02)
        try:
            return cut(self, file, access)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(units, "FILES_IN_FLIGHT", 16)
    monkeypatch.setattr(ParquetFormat, "cut", slow_cut)
    ds = wdstream.StreamingDataset(str(many), shuffle=False)
    assert most[0] == 16
    assert list(ds.shards.samples) == [1 + i % 5 for i in range(48)]
    assert [f.name for f in ds.shards.files] == [f"part-{i:03d}.parquet" for i in range(48)]


def test_a_footer_is_one_get_of_the_files_tail_on_s3(s3, s3_bucket, tmp_path, gets):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "small.parquet")
    noise = [os.urandom(1000) for _ in range(200)]  # incompressible: a file past 64 KiB
    pq.write_table(pa.table({"blob": noise}), tmp_path / "large.parquet")
    wide = pa.table({f"column_{i:04d}": [i] for i in range(1500)})  # a footer past 64 KiB
    pq.write_table(wide, tmp_path / "wide.parquet")
    url = upload_tree(s3.client(), s3_bucket, tmp_path, "footers")
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    ds = wdstream.StreamingDataset(url, shuffle=False)
    assert len(ds) == 10 + 200 + 1
    footer = int.from_bytes((tmp_path / "wide.parquet").read_bytes()[-8:-4], "little")
    tail = parquet.TAIL_BYTES
    wide_size = sizes["wide.parquet"]
    assert sorted(gets) == sorted([
        (f"bytes=0-{sizes['small.parquet'] - 1}", 206),
        (f"bytes={sizes['large.parquet'] - tail}-{sizes['large.parquet'] - 1}", 206),
        (f"bytes={wide_size - tail}-{wide_size - 1}", 206),
        (f"bytes={wide_size - footer - 8}-{wide_size - tail - 1}", 206)])


def test_a_flat_folder_is_listed_once_without_s3fs(s3, s3_bucket, tmp_path, monkeypatch):
    import s3fs

    def no_s3fs(*args, **kwargs):
        raise AssertionError("s3fs listed the folder")

    for name in ("_lsdir", "_find", "_ls"):
        monkeypatch.setattr(s3fs.S3FileSystem, name, no_s3fs)
    listings, real = [], s3_objects.list_folder

    def listed(url, recursive=False, timeout=s3_objects.TIMEOUT, on_page=None):
        listings.append((url, recursive))
        return real(url, recursive, timeout, on_page)

    monkeypatch.setattr(s3_objects, "list_folder", listed)
    write_parquet(tmp_path)
    nested = upload_tree(s3.client(), s3_bucket, tmp_path, "nested")
    flat = upload_tree(s3.client(), s3_bucket, tmp_path / "train", "flat")
    assert len(wdstream.StreamingDataset(flat)) == 113
    assert listings == [(flat, False)]  # the shards' listing serves the files
    listings.clear()
    assert len(wdstream.StreamingDataset(nested)) == sum(c for _, c, _ in PARQUET_FILES)
    assert listings == [(nested, False), (nested, True)]  # a subfolder: listed at every depth


def test_listing_a_missing_bucket_or_an_empty_prefix(s3, s3_bucket):
    with pytest.raises(StreamError, match="bucket 'no-such-bucket' not found"):
        wdstream.StreamingDataset("s3://no-such-bucket/data/")
    assert s3_objects.list_folder(f"s3://{s3_bucket}/nothing-here/") == []


def test_a_file_shorter_than_listed_is_an_error_naming_it(s3, s3_bucket, tmp_path, gets):
    write_parquet(tmp_path)
    url = upload_tree(s3.client(), s3_bucket, tmp_path, "short")
    listed = describe(url + "part-1.parquet", "part-1.parquet")
    longer = RawFile(listed.url, listed.name, listed.size + 100, listed.tag)
    with pytest.raises(ShardMismatchError, match=r"part-1.parquet: ended at byte "
                                                 rf"{listed.size}; {listed.size + 100} bytes"):
        ParquetFormat().cut(longer, Access())
    assert gets == [(f"bytes=0-{listed.size + 99}", 206)]


def test_a_footer_that_cannot_be_read_fails_the_build_naming_the_file(
        s3, s3_bucket, tmp_path, monkeypatch):
    write_parquet(tmp_path)
    url = upload_tree(s3.client(), s3_bucket, tmp_path, "failing")
    monkeypatch.setattr(range_reads, "RETRY_BACKOFF", 0.0)
    real_get = S3Ranges.get

    def get(self, begin, last, version):
        if self.key.endswith("part-1.parquet"):
            raise HttpStatusError(500, "InternalError: try again")
        return real_get(self, begin, last, version)

    monkeypatch.setattr(S3Ranges, "get", get)
    with pytest.raises(StreamError, match=r"failing/part-1.parquet: HTTP status 500"):
        wdstream.StreamingDataset(url)


@pytest.fixture
def children(monkeypatch):
    """Cutting in processes from 4 files on, a child for 8 or more, 4 CPUs: the sizes of
    the runs children cut, and how many children were started (``started.count``)."""
    monkeypatch.setattr(unit_processes, "MIN_FILES", 4)
    monkeypatch.setattr(unit_processes, "FILES_PER_PROCESS", 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    started, start, ask = Runs(), unit_processes._start, unit_processes._ask

    def counted():
        started.count += 1
        return start()

    def asked(child, run, access):
        started.append(len(run))
        return ask(child, run, access)

    monkeypatch.setattr(unit_processes, "_start", counted)
    monkeypatch.setattr(unit_processes, "_ask", asked)
    return started


class Runs(list):
    count = 0


def _units_of(source) -> tuple[str, list[str]]:
    """The plan's fingerprint and the keys, cut here (not found cut on this node)."""
    ds = wdstream.StreamingDataset(source, shuffle=False, share_manifest=False)
    return ds.shards.fingerprint(), [s["__key__"] for s in ds]


def test_many_files_are_cut_by_children_as_by_one_process(many, children, monkeypatch):
    together = _units_of(str(many))
    assert children.count == 3 and children  # 48 files, 4 processes (4 CPUs): runs of 12
    assert set(children) == {12} and len(children) <= 3
    monkeypatch.setattr(unit_processes, "MIN_FILES", 1000)
    children.clear()
    assert _units_of(str(many)) == together and children == [] and children.count == 3


def test_a_childs_error_is_raised_as_it_is(many, children, tmp_path):
    for path in many.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "part-047.parquet").write_bytes(b"a text file, not a Parquet one")
    with pytest.raises(ShardError, match="part-047.parquet: not a Parquet file"):
        wdstream.StreamingDataset(str(tmp_path))
    child = unit_processes._start()
    try:  # the same, asked of a child directly
        with pytest.raises(ShardError, match="part-047.parquet: not a Parquet file"):
            unit_processes._ask(child, [describe(str(tmp_path / "part-047.parquet"))], Access())
        ours = describe(str(tmp_path / "part-001.parquet"))
        assert unit_processes._ask(child, [ours], Access()) == units.cut_files([ours], Access())
    finally:
        child.process.kill()
        child.process.wait()
    with pytest.raises(WdstreamError, match=r"part-001.parquet and 0 more files in another "
                                            r"process failed \(exit -9\)"):
        unit_processes._ask(child, [ours], Access())


def test_children_cut_s3_files_with_this_process_s_settings(s3, s3_bucket, many, children):
    url = upload_tree(s3.client(), s3_bucket, many, "many")
    from_s3 = _units_of(url)
    assert children.count == 3 and children  # the children read the footers from S3
    assert from_s3[1] == _units_of(str(many))[1]


def test_an_s3_folder_s_files_are_cut_while_it_is_listed(s3, s3_bucket, many, children,
                                                             monkeypatch):
    url = upload_tree(s3.client(), s3_bucket, many, "paged")
    alone = _units_of(url)
    monkeypatch.setattr(s3_objects, "LIST_PAGE_SIZE", 10)  # 5 pages of 48 files
    events, real_list, real_cut = [], s3_objects.list_folder, units.cut_files

    def listed(*args, **kwargs):
        found = real_list(*args, **kwargs)
        events.append(("listed", len(found)))
        return found

    def cut_now(files, access):
        events.append(("cutting", len(files)))
        return real_cut(files, access)

    monkeypatch.setattr(s3_objects, "list_folder", listed)
    monkeypatch.setattr(units, "cut_files", cut_now)
    children.clear()
    assert _units_of(url) == alone
    assert events[0] == ("cutting", 10) and ("listed", 48) in events  # the first page's
    assert children.count >= 1 and set(children) <= {10, 8}  # a child from the second page
    assert sum(children) + sum(n for what, n in events if what == "cutting") == 48


def test_a_folder_of_shards_beside_parquet_files_stops_their_cutting(
        s3, s3_bucket, many, tmp_path, monkeypatch):
    from tests.support.shard_data import shard_bytes

    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "part-000.parquet").write_bytes((many / "part-000.parquet").read_bytes())
    (folder / "shard-000000.tar").write_bytes(shard_bytes(0, 3))
    url = upload_tree(s3.client(), s3_bucket, folder, "mixed")
    assert len(list(wdstream.StreamingDataset(url, shuffle=False))) == 3
    assert not [t for t in threading.enumerate() if t.name == "wdstream-cutter"]


def test_the_ranks_of_a_node_share_its_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert unit_processes.rank_cpus() == 4
    assert unit_processes.processes_for(1_000_000) == 4
    assert unit_processes.processes_for(unit_processes.MIN_FILES - 1) == 1
    assert unit_processes.processes_for(unit_processes.MIN_FILES) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert unit_processes.rank_cpus() == 1
    assert unit_processes.processes_for(1_000_000) == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert unit_processes.processes_for(1_000_000) == unit_processes.MAX_PROCESSES


def test_an_index_scanned_by_children_is_the_one_a_process_writes(tmp_path, children,
                                                                    monkeypatch):
    from wdstream.cli.index import _index_raw_files

    lines = tmp_path / "lines"
    lines.mkdir()
    for index in range(24):
        rows = "".join(f'{{"id": {index}, "row": {row}}}\n' for row in range(1 + index % 4))
        (lines / f"part-{index:02d}.jsonl").write_text(rows)
    _index_raw_files([str(lines)], str(tmp_path / "by-children.json"), False, True, None)
    assert children == [8, 8]  # 24 files: 3 runs of at least 8
    monkeypatch.setattr(unit_processes, "MIN_FILES", 1000)
    _index_raw_files([str(lines)], str(tmp_path / "by-one.json"), False, True, None)
    assert children == [8, 8]  # none more
    assert (tmp_path / "by-children.json").read_bytes() == (tmp_path / "by-one.json").read_bytes()


def test_without_a_child_process_this_one_cuts_them_all(many, children, monkeypatch, caplog):
    def no_process():
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(unit_processes, "_start", no_process)
    together = _units_of(str(many))
    assert children == [] and "cutting into units in another process: Resource" in caplog.text
    monkeypatch.setattr(unit_processes, "MIN_FILES", 1000)
    assert _units_of(str(many)) == together
