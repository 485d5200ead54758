"""Reading raw files' units: small units of remote files are read several at once (a link's
first byte is not paid once per unit), large ones one ahead, local files' one ahead where a
CPU is free for the thread and in the reading thread where none is; the rows come in the
plan's order either way, each once."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest

import wdstream
from tests.support.raw_data import upload_tree
from wdstream.stream.read import unit_reader as unit_read
from wdstream.tables.parquet import ParquetFormat

pytestmark = pytest.mark.usefixtures("single_rank")


@pytest.fixture
def small_units(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(200))}), tmp_path / "a.parquet", row_group_size=5)
    return str(tmp_path)


FIRST_BYTE = 0.05  # seconds a slowed read waits: 40 units one by one take 2 s, 8 at once 0.25


def _concurrent_reads(monkeypatch, threads: set | None = None) -> list[int]:
    """Reads of units made slow (a long first byte); the most in flight at once, and the
    names of the threads that read them put in ``threads``."""
    lock, now, most = threading.Lock(), [0], [0]
    read = ParquetFormat.read

    def slow_read(self, *args):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
            if threads is not None:
                threads.add(threading.current_thread().name)
        time.sleep(FIRST_BYTE)
        try:
            return read(self, *args)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(ParquetFormat, "read", slow_read)
    return most


def test_small_units_on_s3_are_read_several_at_once_in_order(small_units, monkeypatch, s3,
                                                            s3_bucket):
    url = upload_tree(s3.client(), s3_bucket, Path(small_units), "small")
    most = _concurrent_reads(monkeypatch)
    dataset = wdstream.StreamingDataset(url, shuffle=False)
    started = time.perf_counter()
    ids = [s["id"] for s in dataset]
    assert ids == list(range(200))  # 40 units of 5 rows, in order, each once
    assert most[0] == unit_read.UNITS_AHEAD
    assert time.perf_counter() - started < 40 * FIRST_BYTE / 2  # not a round trip per unit


@pytest.mark.parametrize("where", ["local", "s3, large units"])
def test_local_files_and_large_units_are_read_one_ahead(small_units, monkeypatch, where,
                                                         s3, s3_bucket):
    source = small_units
    if where != "local":
        source = upload_tree(s3.client(), s3_bucket, Path(small_units), "large")
        monkeypatch.setattr(unit_read, "AHEAD_BYTES", 1)  # every unit is "large"
    monkeypatch.setattr(unit_read, "rank_cpus", lambda: 2)
    threads: set[str] = set()
    most = _concurrent_reads(monkeypatch, threads)
    ids = [s["id"] for s in wdstream.StreamingDataset(source, shuffle=False)]
    assert ids == list(range(200)) and most[0] == 1
    assert any(name.startswith("wdstream-units") for name in threads)


def test_without_a_free_cpu_local_units_are_read_in_the_reading_thread(small_units,
                                                                     monkeypatch):
    monkeypatch.setattr(unit_read, "rank_cpus", lambda: 1)
    threads: set[str] = set()
    _concurrent_reads(monkeypatch, threads)
    ids = [s["id"] for s in wdstream.StreamingDataset(small_units, shuffle=False)]
    assert ids == list(range(200)) and threads == {threading.current_thread().name}


@pytest.mark.parametrize(("cpus", "workers", "ahead"), [
    (2, None, 1), (1, None, 0), (4, 2, 1), (3, 2, 0), (16, 8, 1), (8, 8, 0)])
def test_a_local_unit_is_read_ahead_when_each_reader_has_two_cpus(monkeypatch, cpus, workers,
                                                                   ahead):
    import torch.utils.data

    info = None if workers is None else types.SimpleNamespace(num_workers=workers)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
    monkeypatch.setattr(unit_read, "rank_cpus", lambda: cpus)
    assert unit_read.local_ahead() == ahead


def test_without_torch_the_reading_process_is_the_only_reader(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # no torch: no DataLoader workers either
    monkeypatch.setattr(unit_read, "rank_cpus", lambda: 2)
    assert unit_read.local_ahead() == 1
