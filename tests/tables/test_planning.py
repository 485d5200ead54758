"""Planning many raw files: their footers are read many at once, never more than
``PLANS_IN_FLIGHT``, and the plan is the same in whatever order they come back."""

from __future__ import annotations

import threading
import time

import pytest

import wdstream
from wdstream.tables import units
from wdstream.tables.parquet import ParquetFormat

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
    plan = ParquetFormat.plan

    def slow_plan(self, file, access):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05 if file.name.endswith(("1.parquet", "4.parquet")) else 0.02)
        try:
            return plan(self, file, access)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(units, "PLANS_IN_FLIGHT", 16)
    monkeypatch.setattr(ParquetFormat, "plan", slow_plan)
    ds = wdstream.StreamingDataset(str(many), shuffle=False)
    assert most[0] == 16
    assert list(ds.shards.samples) == [1 + i % 5 for i in range(48)]
    assert [f.name for f in ds.shards.files] == [f"part-{i:03d}.parquet" for i in range(48)]
