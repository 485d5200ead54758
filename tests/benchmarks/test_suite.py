"""The benchmark suite's plumbing that the results page depends on: a rewrite of
docs/benchmarks-results.md keeps the sections of benchmarks not run and nothing written by hand,
and the local S3 server the suite (and these tests) start serves uploads; a case's clock starts
after a full garbage collection; a section's figure of how quiet the machine was counts the
suite's own reaped processes as the suite's; without nginx the link suite says so and uses its
proxy (the nginx data plane itself: tests/benchmarks/test_data_plane.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.__main__ import busy_seconds, others_cpu, write_results


def test_a_rewrite_keeps_other_sections_and_nothing_written_by_hand(tmp_path):
    path = tmp_path / "results.md"
    path.write_text("# old\n\n<!-- benchmark:resume -->\n## Resumption\nold resume\n"
                    "<!-- /benchmark:resume -->\n\n<!-- note:relayout -->\n## After the move\n"
                    "kept by hand\n<!-- /note:relayout -->\n\n<!-- benchmark:read -->\nold read\n"
                    "<!-- /benchmark:read -->\n")
    info = {"date": "d", "cpus": 2, "cpu": "c", "memory": "m", "os": "o", "load": "l",
            "memory_settings": "free page reporting off", "python": "p", "source": "s",
            **{k: "v" for k in (
                "torch", "webdataset", "wdstream", "numpy", "boto3", "s3fs", "moto", "orjson",
                "datasets", "litdata", "mosaicml-streaming", "psutil")}}
    new_read = "<!-- benchmark:read -->\nnew read\n<!-- /benchmark:read -->"
    write_results(path, info, {"read": new_read}, quick=True, ran=["read"])
    text = path.read_text()
    assert "new read" in text and "old read" not in text
    assert "- Memory: free page reporting off" in text
    assert "old resume" in text
    assert "kept by hand" not in text and "note:relayout" not in text
    assert text.index("<!-- /benchmark:read -->") < text.index("<!-- benchmark:resume -->")


def test_a_sections_quiet_figure_counts_the_suites_reaped_children_as_its_own():
    before = busy_seconds()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                    "while time.process_time() < end: pass"], check=True)
    machine, suite = (after - start for after, start in zip(busy_seconds(), before,
                                                            strict=True))
    # the child's 0.5 s, give or take a tick (rusage and /proc/stat count in ticks)
    assert suite >= 0.45 and machine >= 0.4
    text = others_cpu(before, 10.0)
    assert text.startswith("other processes ") and "CPU s (" in text
    assert others_cpu((float("inf"), 0.0), 10.0).startswith("other processes 0.0 CPU s (0.0%")


@pytest.mark.slow
def test_local_s3_serves_an_upload(tmp_path):
    from benchmarks.local_servers import LocalS3

    (tmp_path / "a.txt").write_bytes(b"payload")
    with LocalS3() as s3:
        url = s3.upload(tmp_path, "bench-bucket", "p")
        body = s3.client().get_object(Bucket="bench-bucket", Key="p/a.txt")["Body"].read()
        assert s3.process.poll() is None
    assert url == "s3://bench-bucket/p/" and body == b"payload"
    assert s3.process.poll() is not None  # stopped at the end of the block


@pytest.mark.slow
def test_the_link_benchmarks_servers_serve_ranges_of_the_current_object(tmp_path):
    """The suite's moto that reads a value once, and its threaded GCS emulator: ranged GETs
    give the object's bytes, also after it was replaced."""
    import os

    import urllib3

    from benchmarks.local_servers import LocalGcs, LocalS3

    first, second = os.urandom(3 << 20), os.urandom(3 << 20)
    with LocalS3(whole_once=True) as s3:
        client = s3.client()
        client.create_bucket(Bucket="bench-bucket")
        for data in (first, second):
            client.put_object(Bucket="bench-bucket", Key="k", Body=data)
            for begin in (0, 5, 1 << 20):
                got = client.get_object(Bucket="bench-bucket", Key="k",
                                        Range=f"bytes={begin}-{begin + 99}")["Body"].read()
                assert got == data[begin:begin + 100]
    (tmp_path / "x.bin").write_bytes(first)
    with LocalGcs("bench") as gcs:
        assert gcs.upload(tmp_path, "p") == "gs://bench/p/"
        response = urllib3.PoolManager().request(
            "GET", f"{gcs.endpoint}/download/storage/v1/b/bench/o/p%2Fx.bin?alt=media",
            headers={"Range": "bytes=7-106"})
        assert response.status == 206 and response.data == first[7:107]


def test_a_case_clock_starts_with_no_collection_due():
    """Garbage that only a full collection frees (cycles that outlived the young
    generations) is gone once a case's clock starts, as in a process that has run a while."""
    import gc
    import weakref

    from benchmarks import common

    class Node:
        pass

    gc.collect()
    cycle = Node()
    cycle.self = cycle
    alive = weakref.ref(cycle)
    gc.collect(1)  # it survives into the oldest generation, which only a full collection walks
    del cycle
    common.start_clock()
    assert alive() is None


def test_the_link_suites_cpu_split_is_read_or_refused_before_any_work():
    import os

    import pytest

    from benchmarks.link import LINK_CPUS_VARIABLE, cpu_split

    allowed = sorted(os.sched_getaffinity(0))
    assert cpu_split("") is None and cpu_split("  ") is None
    if len(allowed) >= 2:
        last = allowed[-1]
        assert cpu_split(str(last)) == ({last}, set(allowed[:-1]))
        assert cpu_split(f"{allowed[0]}-{allowed[0]}") == ({allowed[0]}, set(allowed[1:]))
    everything = ",".join(map(str, allowed))
    for text, says in ((everything, "leaves no CPU"), ("two", "expected CPU numbers"),
                       ("3-1", "not a range"), (str(max(allowed) + 64), "are not among")):
        with pytest.raises(ValueError, match=says) as caught:
            cpu_split(text)
        assert LINK_CPUS_VARIABLE in str(caught.value)


def test_without_nginx_the_link_suite_says_so_and_uses_its_proxy(tmp_path, monkeypatch):
    """The fallback plane: moto and the GCS emulator behind the suite's proxy, one per link
    and store, named with the reason in the log and the table's note; loopback is the
    servers themselves."""
    from types import SimpleNamespace

    from benchmarks import common, data_plane, link

    logged: list[str] = []
    monkeypatch.setattr(data_plane, "missing", lambda: "no nginx binary (for the test)")
    monkeypatch.setattr(common, "log", logged.append)
    s3 = SimpleNamespace(port=1, endpoint="http://127.0.0.1:1", process=None)
    gcs = SimpleNamespace(port=2, endpoint="http://127.0.0.1:2", process=None)
    plane = link._open_plane(tmp_path / "plane", s3, gcs, {}, None)
    try:
        assert isinstance(plane, link._ProxyPlane)
        assert plane.endpoint("s3", None) == s3.endpoint
        assert plane.endpoint("gs", None) == gcs.endpoint
        endpoints = {plane.endpoint(store, n) for store in ("s3", "gs")
                     for n in range(len(link.LINKS))}
        assert len(endpoints) == 2 * len(link.LINKS)
        assert plane.describe(0) == data_plane.describe_link(link.LINKS[0][0] * 1e6,
                                                             link.LINKS[0][1] / 1000)
        assert plane.pids() == []
    finally:
        plane.stop()
    assert any("no nginx binary (for the test)" in line and "falls back" in line
               for line in logged)
    assert "no nginx binary (for the test)" in link._plane_note(plane)
    assert not (tmp_path / "plane").exists()
