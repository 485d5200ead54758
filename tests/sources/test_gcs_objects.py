"""GCS listings through the JSON API (``gcs_objects.list_folder``): page by page against the
fake GCS of ``test_gcs_ranges.py`` (gcp-storage-emulator answers a listing in one page), as
one page against the emulator, and pages written by a stranger (a page that is not a
listing, or a token handed out twice, which would list forever)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import wdstream
from tests.sources.test_gcs_ranged import upload
from tests.sources.test_gcs_ranges import BUCKET, fake_gcs  # noqa: F401 - the fixture
from wdstream.errors import StreamError
from wdstream.sources import gcs_objects
from wdstream.tables import units


def _listings(fake) -> list[dict[str, str]]:
    return [seen.query for seen in fake.seen if seen.path == f"/storage/v1/b/{BUCKET}/o"]


def test_a_folder_is_listed_page_by_page(fake_gcs, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gcs_objects, "LIST_PAGE_SIZE", 2)
    for number in range(5):
        fake_gcs.put(f"data/part-{number}.bin", b"x" * number)
    fake_gcs.put("data/deeper/inner.bin", b"inner")
    fake_gcs.put("data", b"a folder marker's neighbour")
    fake_gcs.put("other/part.bin", b"elsewhere")
    pages: list[list[dict]] = []
    entries = gcs_objects.list_folder(f"gs://{BUCKET}/data", on_page=pages.append)
    assert [len(page) for page in pages] == [3, 2, 1]  # the subfolder on the first page
    asked = _listings(fake_gcs)
    assert [q.get("pageToken") for q in asked] == [None, "2", "4"]
    assert {q["fields"] for q in asked} == {gcs_objects.LIST_FIELDS}
    files = [e for e in entries if e["type"] == "file"]
    assert [e["name"] for e in files] == [f"{BUCKET}/data/part-{n}.bin" for n in range(5)]
    assert [e["size"] for e in files] == list(range(5)) and files[0]["generation"] == "1"
    assert [e["name"] for e in entries if e["type"] == "directory"] == [f"{BUCKET}/data/deeper"]
    everything = gcs_objects.list_folder(f"gs://{BUCKET}/data/", recursive=True)
    assert sorted(e["name"] for e in everything) == sorted(
        [f"{BUCKET}/data/deeper/inner.bin"] + [e["name"] for e in files])
    assert gcs_objects.list_folder(f"gs://{BUCKET}/nothing/") == []
    with pytest.raises(StreamError, match="bucket 'missing' not found"):
        gcs_objects.list_folder("gs://missing/data/")


@pytest.mark.parametrize("body, says", [
    (b"<html>not JSON</html>", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"items": {"name": "data/a"}}', "no list of objects"),
    (b'{"items": [{"name": 7, "size": "1"}]}', "no name or size"),
    (b'{"items": [{"name": "data/a", "size": "-1"}]}', "no name or size"),
    (b'{"items": [{"name": "data/a", "size": true}]}', "no name or size"),
    (b'{"items": [], "prefixes": [{"x": 1}]}', "subfolder of the listing is not a name"),
    (b'{"items": [], "nextPageToken": 17}', "page token is not a string"),
    (b'{"items": [], "nextPageToken": "again"}', "same page token twice"),
    (b'{"items": []}' + b" " * 300, "over 200 bytes"),
    (b"[" * 100_000, "not JSON"),  # nesting past the parser's bound
])
def test_a_page_written_by_a_stranger_is_a_stream_error(fake_gcs, monkeypatch,  # noqa: F811
                                                        body, says):
    monkeypatch.setattr(gcs_objects, "LIST_PAGE_LIMIT", 200 if b" " * 300 in body else 1 << 20)
    fake_gcs.listing_body = body
    with pytest.raises(StreamError, match=says) as raised:
        gcs_objects.list_folder(f"gs://{BUCKET}/data/")
    assert f"gs://{BUCKET}/data/" in str(raised.value)


def _parquet(first: int, rows: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(first, first + rows))}), out, row_group_size=3)
    return out.getvalue()


def test_a_parquet_folder_is_planned_as_its_pages_come(fake_gcs, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gcs_objects, "LIST_PAGE_SIZE", 2)
    pages = []
    seen_page = units.UnitsAhead.on_page
    monkeypatch.setattr(units.UnitsAhead, "on_page",
                        lambda self, entries: pages.append(len(entries))
                        or seen_page(self, entries))
    for number in range(5):
        fake_gcs.put(f"tables/part-{number}.parquet", _parquet(10 * number, 10))
    dataset = wdstream.StreamingDataset(f"gs://{BUCKET}/tables/", shuffle=False,
                                        share_manifest=False)
    assert pages == [2, 2, 1] and dataset.epoch_samples() == 50
    assert sorted(int(row["n"]) for row in dataset) == list(range(50))


def test_the_emulator_lists_a_folder_in_one_page(gcs):
    for name in ("list/a.bin", "list/b.bin", "list/sub/c.bin"):
        upload(gcs, name, name.encode())
    pages: list[list[dict]] = []
    entries = gcs_objects.list_folder(f"gs://{gcs.bucket}/list/", on_page=pages.append)
    assert len(pages) == 1
    assert sorted((e["name"], e["type"], e["size"]) for e in entries) == [
        (f"{gcs.bucket}/list/a.bin", "file", 10), (f"{gcs.bucket}/list/b.bin", "file", 10),
        (f"{gcs.bucket}/list/sub", "directory", 0)]
    assert all(e["generation"] for e in entries if e["type"] == "file")


def test_whether_an_object_exists_is_asked_without_gcsfs(fake_gcs):  # noqa: F811
    url = fake_gcs.put("here.bin", b"x")
    assert gcs_objects.exists(url) and not gcs_objects.exists(f"gs://{BUCKET}/absent.bin")
    fake_gcs.tokens = {"a token this process does not have"}  # every request refused: 401
    with pytest.raises(StreamError, match="here.bin"):
        gcs_objects.exists(url)


def test_a_parquet_folder_on_gcs_is_read_without_gcsfs(gcs, tmp_path):
    for number in range(2):
        upload(gcs, f"nogcsfs/part-{number}.parquet", _parquet(10 * number, 10))
    code = ("import json, sys, wdstream\n"
            f"dataset = wdstream.StreamingDataset('gs://{gcs.bucket}/nogcsfs/', shuffle=False,\n"
            "                                     share_manifest=False)\n"
            "rows = sorted(int(row['n']) for row in dataset)\n"
            "print(json.dumps([rows, [m for m in sys.modules if m.split('.')[0] == 'gcsfs']]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [list(range(20)), []]
