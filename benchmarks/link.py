"""Reading from S3 over a shaped link: each connection capped and its first byte delayed, as on
a cloud link, by a proxy of the suite's own (``shaped_link.py``) in front of the moto server.

For each link the suite measures, in the same run:

limit
    What the link carries: ``LIMIT_IN_FLIGHT`` ranged GETs in flight over the dataset's shards
    (threads of 2 processes, so that one client's CPU is not the limit), with parts of 8 MiB
    and of 16 MiB (the sizes the loader's reader uses); the better of the two is the limit.
one GET
    A single plain ``get_object`` through the link with a warm client: time to its first byte
    (the link's round trip) and to the first batch's bytes.
wdstream
    The default loader (opener "auto", i.e. "sdk"; shuffle off; no decoding; 2 workers, batch
    32) over the link, for 1 MiB and ~100 KiB samples; the same datasets on loopback (no proxy)
    give the start-up cost that is not the link's.

Datasets: 1 MiB and ~100 KiB samples, 16 shards of ~100 MB each (8 per worker; quick: 4
shards of ~33 MB); the loader's MB/s is reported over the whole run and after its first batch.

Goals: the loader's MB/s ≥ 0.8x the limit; its first batch no later than the loopback first
batch + 2 round trips of one GET + the first batch's bytes at the link's limit.

CPU: moto, the proxy and the loader share the machine's cores (and other jobs may too), so
every case reports the CPU seconds it took, moto's, the proxy's (the suite's process) and
everything else the machine ran meanwhile ("others"), and the load average at its start.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

from . import common
from .common import quiet_logs, ratio
from .read import case_wdstream, goal

TITLE = "Shaped link (S3 through a capped, delayed proxy)"
MiB = 1 << 20
LIMIT_PARTS = (8 * MiB, 16 * MiB)
LIMIT_IN_FLIGHT = 16
WORKERS = 2
BATCH = 32
# (MB/s per connection, first-byte delay in ms)
LINKS = ((25, 30), (100, 10))
# full: 16 shards of ~100 MB, 8 per worker, so that the start (workers, first parts) weighs
# in a run as in a training run rather than being half of it (4 shards until 2026-12)
FULL = {"mib_samples": 1536, "kib_samples": 15360, "shards": 16}
QUICK = {"mib_samples": 128, "kib_samples": 1280, "shards": 4}
T_LINK = "shaped link: S3 (moto) behind a proxy that caps each connection and delays each response"
T_GOALS = "goals (issue 18)"

__all__ = ["case_link_limit", "case_loader", "case_one_get", "run"]


# =========================================================================== cases (child side)


def _fetch_ranges(bucket: str, ranges: list[tuple[str, int, int]], threads: int) -> int:
    """Bytes read by ``threads`` threads taking ranged GETs from ``ranges`` (one client)."""
    client = _POOL_CLIENT["client"]
    work: queue.Queue = queue.Queue()
    for item in ranges:
        work.put(item)
    total = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def fetch():
        while True:
            try:
                key, first, last = work.get_nowait()
            except queue.Empty:
                return
            try:
                body = client.get_object(Bucket=bucket, Key=key,
                                         Range=f"bytes={first}-{last}")["Body"]
                got = sum(len(chunk) for chunk in body.iter_chunks(MiB))
            except Exception as error:  # reported by the case
                errors.append(error)
                return
            with lock:
                total[0] += got

    pool = [threading.Thread(target=fetch) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(f"ranged GET failed: {errors[0]}")
    return total[0]


def case_link_limit(bucket: str, keys: list[str], sizes: list[int], part: int = 8 * MiB,
                    in_flight: int = LIMIT_IN_FLIGHT, processes: int = WORKERS) -> dict:
    """``in_flight`` ranged GETs of ``part`` bytes over the shards: ``processes`` processes (as
    many as the loader's workers, so that the client's CPU is not what limits) of threads."""
    quiet_logs()
    import multiprocessing

    import boto3  # noqa: F401 - imported before the clock, as the loader's case imports torch

    ranges = [(key, begin, min(begin + part, size) - 1)
              for key, size in zip(keys, sizes, strict=True) for begin in range(0, size, part)]
    shares = [ranges[k::processes] for k in range(processes)]
    context = multiprocessing.get_context("fork")
    before = _cpu_so_far()
    with context.Pool(processes, initializer=_warm,
                      initargs=(bucket, keys[0], in_flight // processes)) as pool:
        pool.starmap(time.sleep, [(0.2,)] * processes)  # every initializer has run
        started = time.perf_counter()
        totals = pool.starmap(_fetch_ranges, [(bucket, share, in_flight // processes)
                                              for share in shares])
        seconds = time.perf_counter() - started
        pool.close()
        pool.join()  # its processes' CPU is counted once they have ended
    if sum(totals) != sum(sizes):
        raise RuntimeError(f"read {sum(totals)} bytes, expected {sum(sizes)}")
    return {"seconds": seconds, "bytes_read": sum(totals), "cpu_s": _cpu_so_far() - before}


_POOL_CLIENT: dict = {}  # the client of a pool process of case_link_limit


def _warm(bucket: str, key: str, threads: int) -> None:
    """Pool initializer: the process's client, connected, before the clock starts."""
    import boto3
    import botocore.config

    client = boto3.client("s3", config=botocore.config.Config(max_pool_connections=threads))
    client.head_object(Bucket=bucket, Key=key)
    _POOL_CLIENT["client"] = client


def _cpu_so_far() -> float:
    """CPU seconds of this process and of its children that have ended."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def case_loader(**args) -> dict:
    """``read.case_wdstream`` with the CPU it took once its imports were done (``cpu_s``:
    the case's process and its DataLoader workers)."""
    import botocore.session  # noqa: F401 - imported before the clock, as case_wdstream does

    import wdstream.stream.dataset  # noqa: F401
    import wdstream.stream.loader  # noqa: F401

    before = _cpu_so_far()
    result = case_wdstream(**args)
    result["cpu_s"] = _cpu_so_far() - before
    return result


def case_one_get(bucket: str, key: str, first_bytes: int) -> dict:
    """One plain GET with a warm client: seconds to its first byte and to ``first_bytes``."""
    quiet_logs()
    import boto3

    client = boto3.client("s3")
    client.head_object(Bucket=bucket, Key=key)
    started = time.perf_counter()
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    first = None
    got = 0
    for chunk in body.iter_chunks(64 << 10):
        if first is None:
            first = time.perf_counter() - started
        got += len(chunk)
        if got >= first_bytes:
            break
    body.close()
    return {"first_byte_s": first, "first_batch_bytes_s": time.perf_counter() - started}


# =========================================================================== the suite (parent)


def _datasets(root: Path, sizes: dict) -> dict:
    per = sizes["shards"]
    return {
        "1 MiB": common.blob_dataset(root / "mib", sizes["mib_samples"],
                                     sizes["mib_samples"] // per, MiB),
        "~100 KiB": common.blob_dataset(root / "kib", sizes["kib_samples"],
                                        sizes["kib_samples"] // per, 100 * 1024),
    }


def run(quick: bool) -> list[dict]:
    from .shaped_link import ShapedProxy

    sizes = QUICK if quick else FULL
    rows: list[dict] = []
    goals: list[dict] = []
    with common.scratch() as root, common.LocalS3() as s3:
        data = _datasets(root, sizes)
        sources = {}
        for name, dataset in data.items():
            prefix = "mib" if name == "1 MiB" else "kib"
            common.log(f"link: uploading {dataset['bytes'] / common.MB:,.0f} MB to moto")
            url = s3.upload(dataset["dir"], "bench", prefix)
            keys = [f"{prefix}/{Path(p).name}" for p in dataset["shards"]]
            shard_sizes = [Path(p).stat().st_size for p in dataset["shards"]]
            sources[name] = (url, keys, shard_sizes)
        proxies = [ShapedProxy(s3.port, rate * 1e6, delay / 1000).start()
                   for rate, delay in LINKS]
        try:
            cases = {}
            for proxy in proxies:
                env = dict(s3.env, AWS_ENDPOINT_URL=proxy.endpoint)
                link = proxy.describe()
                url, keys, shard_sizes = sources["1 MiB"]
                for part in LIMIT_PARTS:
                    cases[(link, f"limit {part // MiB} MiB")] = (
                        f"{__name__}:case_link_limit",
                        {"bucket": "bench", "keys": keys, "sizes": shard_sizes, "part": part},
                        env)
                cases[(link, "one GET")] = (f"{__name__}:case_one_get", {
                    "bucket": "bench", "key": keys[0], "first_bytes": BATCH * MiB}, env)
                for name, (url, _keys, _sizes) in sources.items():
                    cases[(link, name)] = (f"{__name__}:case_loader", {
                        "source": url, "decode": False, "workers": WORKERS, "batch": BATCH,
                        "expected": data[name]["samples"]}, env)
            for name, (url, _keys, _sizes) in sources.items():
                cases[("loopback", name)] = (f"{__name__}:case_loader", {
                    "source": url, "decode": False, "workers": WORKERS, "batch": BATCH,
                    "expected": data[name]["samples"]}, s3.env)
            named = {" / ".join(key): spec for key, spec in cases.items()}
            results = _repeat(named, s3.process.pid)
            by_key = {key: results[" / ".join(key)] for key in cases}
        finally:
            for proxy in proxies:
                proxy.stop()
    for proxy in proxies:
        link = proxy.describe()
        limits = []
        for part in LIMIT_PARTS:
            limit = by_key[(link, f"limit {part // MiB} MiB")]
            limits.append(_mbps(limit, limit.get("bytes_read")) or 0.0)
            rows.append({"table": T_LINK, "link": link,
                         "reader": f"limit: {LIMIT_IN_FLIGHT} ranged GETs of {part // MiB} MiB "
                         f"in flight ({WORKERS} processes)", "MB/s": limits[-1] or None,
                         "runs": limit.get("runs"), **_cpu_columns(limit),
                         "error": limit.get("error")})
        limit_mbps = max(limits) or None
        one = by_key[(link, "one GET")]
        rtt = one.get("first_byte_s")
        rows.append({"table": T_LINK, "link": link, "reader": "one plain GET (warm client)",
                     "first byte s": rtt,
                     "first batch s": one.get("first_batch_bytes_s"),
                     "MB/s": (BATCH * MiB / common.MB / one["first_batch_bytes_s"])
                     if one.get("first_batch_bytes_s") else None,
                     "runs": one.get("runs"), "error": one.get("error")})
        for name in data:
            result = by_key[(link, name)]
            loopback = by_key[("loopback", name)]
            mbps = _mbps(result, data[name]["bytes"])
            steady = _steady_mbps(result, data[name]["bytes"])
            sample_bytes = data[name]["bytes"] / data[name]["samples"]
            budget = None
            if rtt is not None and loopback.get("ttfb_s") is not None and limit_mbps:
                budget = (loopback["ttfb_s"] + 2 * rtt
                          + BATCH * sample_bytes / common.MB / limit_mbps)
            rows.append({"table": T_LINK, "link": link,
                         "reader": f"wdstream default loader, {name} samples, 2 workers",
                         "MB/s": mbps, "÷ limit": ratio(mbps, limit_mbps),
                         "MB/s after first batch": steady,
                         "first batch s": result.get("ttfb_s"),
                         "loopback first batch s": loopback.get("ttfb_s"),
                         "first batch budget s": budget,
                         "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                         **_cpu_columns(result), "error": result.get("error")})
            goals.append(goal(f"{link}, {name} samples: MB/s ÷ the link's limit",
                              ratio(mbps, limit_mbps), 0.8, table=T_GOALS))
            goals.append(goal(f"{link}, {name} samples: first batch ÷ budget (loopback first "
                              "batch + 2 round trips + a batch at the limit)",
                              ratio(result.get("ttfb_s"), budget), 1.0,
                              higher_is_better=False, table=T_GOALS))
    for name, dataset in data.items():
        rows.append({"table": T_LINK, "link": "loopback (no proxy)",
                     "reader": f"wdstream default loader, {name} samples, 2 workers",
                     "MB/s": _mbps(by_key[("loopback", name)], dataset["bytes"]),
                     "first batch s": by_key[("loopback", name)].get("ttfb_s"),
                     "runs": by_key[("loopback", name)].get("runs"),
                     **_cpu_columns(by_key[("loopback", name)]),
                     "error": by_key[("loopback", name)].get("error")})
    rows.append({"table": T_LINK, "note": (
        f"Datasets: {data['1 MiB']['samples']} samples of 1 MiB and "
        f"{data['~100 KiB']['samples']} of 100 KiB, {sizes['shards']} shards each "
        f"({data['1 MiB']['bytes'] / common.MB:.0f} and "
        f"{data['~100 KiB']['bytes'] / common.MB:.0f} MB; {sizes['shards'] // WORKERS} shards "
        "per worker: until 2026-12 the full datasets were 4 shards, 403 and 395 MB, whose "
        "start was half of a run). The loader: opener \"auto\" (the sdk reader), shuffle off "
        "and no decoding, so that the rows measure the link's path. The proxy paces each connection's "
        "responses and holds each request back by the delay; it runs in the suite's process, "
        "moto in its own, both on the same 2 cores as the loader. MB/s of a loader counts from "
        "building the dataset to its last batch (worker start-up included); 'after first "
        "batch' leaves the start out. The limit is the better of its two part sizes. CPU s: "
        "seconds of CPU during the case taken by the reader (its processes, once their imports "
        "were done: about 1.7 s of importing torch for the loader is left out), moto, the "
        "proxy, and everything else the machine ran meanwhile (others: other jobs); "
        "load: the 1-minute load average at the case's start.")})
    return goals + rows


def _repeat(cases: dict[str, tuple], moto_pid: int) -> dict[str, dict]:
    """``common.repeat`` with the CPU each case took, moto's, the proxy's and the machine's."""
    runs = common.RUNS
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for round_ in range(runs):
        for name, (target, args, env) in cases.items():
            common.log(f"{name} (run {round_ + 1}/{runs})")
            load = os.getloadavg()[0]
            before = _cpu(moto_pid)
            result = common.run_case(target, args, env=env)
            after = _cpu(moto_pid)
            used = {key: after[key] - before[key] for key in before}
            # the reader's own CPU once its imports were done, where the case says it
            result.update({"cpu_reader_s": result.get("cpu_s", used["reader"]),
                           "cpu_moto_s": used["moto"],
                           "cpu_proxy_s": used["proxy"],
                           "cpu_others_s": max(0.0, used["machine"] - used["reader"]
                                               - used["moto"] - used["proxy"]),
                           "load": load})
            results[name].append(result)
    return {name: common.medians(values) for name, values in results.items()}


def _cpu(moto_pid: int) -> dict:
    """CPU seconds so far: the cases' processes (reaped children of this one), moto, this
    process (the proxy's thread), and the whole machine (from /proc/stat)."""
    import psutil

    mine = os.times()
    moto = psutil.Process(moto_pid).cpu_times()
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return {"reader": mine.children_user + mine.children_system,
            "moto": moto.user + moto.system, "proxy": mine.user + mine.system,
            "machine": (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")}


def _cpu_columns(result: dict) -> dict:
    return {"CPU s: reader": result.get("cpu_reader_s"), "moto": result.get("cpu_moto_s"),
            "proxy": result.get("cpu_proxy_s"), "others": result.get("cpu_others_s"),
            "load": result.get("load")}


def _mbps(result: dict, nbytes) -> float | None:
    seconds = result.get("seconds")
    if not seconds or not nbytes or "error" in result:
        return None
    return nbytes / common.MB / seconds


def _steady_mbps(result: dict, nbytes) -> float | None:
    seconds, first = result.get("seconds"), result.get("ttfb_s")
    if not seconds or first is None or seconds <= first or "error" in result:
        return None
    return nbytes * (1 - BATCH / max(result.get("samples") or BATCH, BATCH)) / common.MB \
        / (seconds - first)
