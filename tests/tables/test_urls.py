"""Raw files named by plain HTTP URLs (a server that answers ranged GETs, as HTTPS stores and
CDNs do) and by another fsspec URL (``memory://``): every row once through workers, exact
resume, and a file that changed since the plan is an error naming it."""

from __future__ import annotations

import http.server
import os
import re
from pathlib import Path

import pytest

import wdstream
from tests.support.raw_data import (
    JSONL_FILES,
    PARQUET_FILES,
    all_keys,
    counted,
    jsonl_keys,
    keys_of,
    loader_of,
    roundtrip,
    take,
    write_jsonl,
    write_parquet,
)
from tests.support.servers import http_server

pytestmark = pytest.mark.usefixtures("single_rank")
RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


def ranged_files(root: Path) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler serving the files below ``root`` with ``HEAD`` and single ``Range`` GETs."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # a connection per request

        def log_message(self, *args):
            pass

        def _file(self) -> Path | None:
            path = (root / self.path.split("?")[0].lstrip("/")).resolve()
            return path if path.is_file() and root in path.parents else None

        def do_HEAD(self):
            path = self._file()
            if path is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(path.stat().st_size))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{path.stat().st_mtime_ns}"')
            self.end_headers()

        def do_GET(self):
            path = self._file()
            if path is None:
                self.send_error(404)
                return
            data = path.read_bytes()
            found = RANGE.match(self.headers.get("Range", ""))
            if found:
                start = int(found[1])
                end = min(int(found[2]) if found[2] else len(data) - 1, len(data) - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                data = data[start : end + 1]
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{path.stat().st_mtime_ns}"')
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served").resolve()
    write_parquet(root / "pq")
    write_jsonl(root / "lines")
    with http_server(ranged_files(root)) as base:
        yield root, base


def urls(base: str, folder: str, names) -> list[str]:
    return [f"{base}/{folder}/{name}" for name in names]


def test_parquet_and_jsonl_over_http_every_row_once_and_resume(served):
    root, base = served
    parquet = urls(base, "pq", [name for name, _, _ in PARQUET_FILES])
    whole = keys_of(loader_of(parquet, batch_size=8, seed=1))
    assert counted(whole) == dict.fromkeys(all_keys(), 1)
    loader = loader_of(parquet, batch_size=8, seed=1)
    first = keys_of(take(loader, 6))
    resumed = loader_of(parquet, batch_size=8, seed=1)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(resumed) == whole

    lines = urls(base, "lines", [name for name, _ in JSONL_FILES])
    rows = list(wdstream.StreamingDataset(lines, shuffle=False))
    assert {r["__key__"] for r in rows} == jsonl_keys() and len(rows) == len(jsonl_keys())
    assert rows[0]["__url__"] == lines[0] and rows[0]["text"] == "a.jsonl row 0"


def test_a_file_changed_over_http_since_the_plan_is_an_error_naming_it(served, tmp_path):
    root, base = served
    target = root / "pq" / "changed.parquet"
    target.write_bytes((root / "pq" / "part-0.parquet").read_bytes())
    url = f"{base}/pq/changed.parquet"
    dataset = wdstream.StreamingDataset([url], shuffle=False)
    target.write_bytes((root / "pq" / "part-1.parquet").read_bytes())
    os.utime(target, ns=(1, 1))
    with pytest.raises(wdstream.WdstreamError, match=re.escape(url)):
        list(dataset)


def test_a_memory_url_streams_through_workers():
    import fsspec

    folder = Path("/wdstream-test-urls")
    memory = fsspec.filesystem("memory")
    local = write_parquet(Path(os.environ.get("TMPDIR", "/tmp")) / f"urls-{os.getpid()}")
    for name, _, _ in PARQUET_FILES:
        memory.pipe(str(folder / name), (local / name).read_bytes())
    try:
        batches = keys_of(loader_of(f"memory://{folder}/", batch_size=8, seed=2))
        assert counted(batches) == dict.fromkeys(all_keys(), 1)
    finally:
        memory.rm(str(folder), recursive=True)
