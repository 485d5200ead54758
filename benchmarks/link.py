"""Reading from S3 and GCS over a shaped link: each connection capped and its first byte
delayed, as on a cloud link. The data plane is nginx (``data_plane.py``): it serves the
shards' bytes from files, at almost no CPU per byte, and passes the rest to the moto server
and the GCS emulator (gcp-storage-emulator on a thread per connection:
``local_servers.LocalGcs``); where nginx cannot run, the suite says so and falls back to a
proxy of its own (``shaped_link.py``) in front of those servers, which then serve every byte.

For each link the suite measures, in the same run:

limit
    What the link carries: ``LIMIT_IN_FLIGHT`` ranged GETs in flight over the dataset's shards
    (threads of 2 processes, so that one client's CPU is not the limit), with parts of 8 MiB
    and of 16 MiB (the sizes the loader's reader uses); the better of the two is the limit.
one GET
    A single plain ``get_object`` through the link with a warm client: time to its first byte
    (the link's round trip) and to the first batch's bytes.
wdstream
    The default loader (opener "auto", i.e. "sdk"; shuffle off; no decoding; 2 workers, and
    4 on the shaped links; batch 32) over the link, for 1 MiB and ~100 KiB samples; the same
    datasets on loopback (no shaping)
    give the start-up cost that is not the link's.
first batch, defaults
    The loader with the dataset's defaults (shuffle on), timed to its first batch only.
GCS
    The limit, one GET and the loader for the 1 MiB samples, through the same links.

Datasets: 1 MiB and ~100 KiB samples, 16 shards of ~100 MB each (8 per worker; quick: 4
shards of ~33 MB); the loader's MB/s is reported over the whole run and after its first batch.

Goals: the loader's MB/s ≥ 0.9x the limit with 2 workers and with 4 (0.8x on the 100 MB/s
link), and no less with 4 than with 2; its first batch no later than the loopback first
batch + 2 round trips of one GET + the first batch's bytes at the link's limit.

CPU: the data plane, the servers and the loader share the machine's cores (and other jobs
may too), so every case reports the CPU seconds it took, moto's, nginx's, the proxy's (the
suite's process, less its sampling of the case's memory), the kernel's interrupt work (the
network's softirqs, which no process is charged for) and everything else the machine ran
meanwhile ("others": that sampling, other jobs) and how many cores they kept busy during the
timed read. Each limit row also says what share of its
connections' caps together it reached ("÷ caps"): well below 1 with the cores busy, the
limit is the machine's CPU, not the link. CPU per delivered byte: the loader's (all its
processes) ÷ the bare client's of the limit with the loader's part size, on the same link
and plane (goal ≤ 1.3), beside the reader's and nginx's CPU seconds per GB.
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

TITLE = "Shaped link (S3 and GCS, each connection capped and delayed)"
MiB = 1 << 20
LIMIT_PARTS = (8 * MiB, 16 * MiB)
LIMIT_IN_FLIGHT = 16
BARE_PART = 8 * MiB  # the limit's part size the loader's CPU per byte is compared with
WORKERS = 2
MORE_WORKERS = 4  # the same loader with more workers must read no less
BATCH = 32
# (MB/s per connection, first-byte delay in ms)
LINKS = ((25, 30), (100, 10))
# full: 16 shards of ~100 MB, 8 per worker, so that the start (workers, first parts) weighs
# in a run as in a training run rather than being half of it
PREFIXES = {"1 MiB": "mib", "~100 KiB": "kib"}  # a dataset's folder in the bucket "bench"
FULL = {"mib_samples": 1536, "kib_samples": 15360, "shards": 16}
QUICK = {"mib_samples": 128, "kib_samples": 1280, "shards": 4}
T_LINK = ("shaped link: S3, each connection capped and each response delayed (data plane: "
          "see the note)")
T_GCS = "shaped link: GCS, through the same links"
T_GOALS = "goals"
T_CPU_GOALS = "goals: CPU per delivered byte"
# the loader's MB/s ÷ the link's limit, per link: on 2 cores the 100 MB/s link's limit (a bare
# client's) is above what the loader reaches unshaped, its ceiling on loopback
LIMIT_GOALS = {(25, 30): 0.9, (100, 10): 0.8}
CPU_PER_BYTE_GOAL = 1.3  # the loader's CPU per byte ÷ a bare client's of ranged GETs
# where the simulated cloud (moto, the GCS emulator, the proxy) runs apart from the loader
LINK_CPUS_VARIABLE = "WDSTREAM_BENCH_LINK_CPUS"

__all__ = ["case_first_batch", "case_link_limit", "case_loader", "case_one_get", "cpu_split",
           "pin_process", "run"]


# =========================================================================== cases (child side)


def _fetch_ranges(bucket: str, ranges: list[tuple[str, int, int]],
                  threads: int) -> tuple[int, float]:
    """Bytes read by ``threads`` threads taking ranged GETs from ``ranges`` (one client), and
    the CPU seconds this process took meanwhile."""
    cpu_before = _cpu_so_far()
    get = _POOL_CLIENT["get"]
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
                got = get(bucket, key, first, last)
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
    return total[0], _cpu_so_far() - cpu_before


def case_link_limit(bucket: str, keys: list[str], sizes: list[int], part: int = 8 * MiB,
                    in_flight: int = LIMIT_IN_FLIGHT, processes: int = WORKERS,
                    store: str = "s3") -> dict:
    """``in_flight`` ranged GETs of ``part`` bytes over the shards: ``processes`` processes (as
    many as the loader's workers, so that the client's CPU is not what limits) of threads.
    ``store``: "s3" (boto3) or "gs" (urllib3 media downloads, as the GCS reader asks)."""
    quiet_logs()
    import multiprocessing

    import boto3  # noqa: F401 - imported before the clock, as the loader's case imports torch
    import urllib3  # noqa: F401

    ranges = [(key, begin, min(begin + part, size) - 1)
              for key, size in zip(keys, sizes, strict=True) for begin in range(0, size, part)]
    shares = [ranges[k::processes] for k in range(processes)]
    context = multiprocessing.get_context("fork")
    with context.Pool(processes, initializer=_warm,
                      initargs=(bucket, keys[0], in_flight // processes, store)) as pool:
        pool.starmap(time.sleep, [(0.2,)] * processes)  # every initializer has run
        started = common.start_clock()
        fetched = pool.starmap(_fetch_ranges, [(bucket, share, in_flight // processes)
                                               for share in shares])
        seconds = time.perf_counter() - started
    total = sum(nbytes for nbytes, _cpu in fetched)
    if total != sum(sizes):
        raise RuntimeError(f"read {total} bytes, expected {sum(sizes)}")
    # the CPU of the processes while they fetched (their clients made and connected before)
    return {"seconds": seconds, "bytes_read": total,
            "cpu_s": sum(cpu for _nbytes, cpu in fetched)}


_POOL_CLIENT: dict = {}  # the client of a pool process of case_link_limit


def _warm(bucket: str, key: str, threads: int, store: str) -> None:
    """Pool initializer: the process's client, connected, before the clock starts."""
    if store == "gs":
        get = _gcs_getter(threads)
        get(bucket, key, 0, 0)
        _POOL_CLIENT["get"] = get
        return
    import boto3
    import botocore.config

    client = boto3.client("s3", config=botocore.config.Config(max_pool_connections=threads))
    client.head_object(Bucket=bucket, Key=key)

    def get(bucket: str, key: str, first: int, last: int) -> int:
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")["Body"]
        return sum(len(chunk) for chunk in body.iter_chunks(MiB))

    _POOL_CLIENT["get"] = get


def _gcs_getter(threads: int):
    """``get(bucket, name, first, last) -> bytes read``: a ranged media download from the
    emulator of ``STORAGE_EMULATOR_HOST``, over one urllib3 pool."""
    import urllib3

    from wdstream.sources.gcs_ranges import endpoint, object_path

    pool = urllib3.PoolManager(maxsize=threads, retries=False)
    root = endpoint()

    def get(bucket: str, name: str, first: int, last: int) -> int:
        response = pool.request(
            "GET", f"{root}/download/storage/v1{object_path(bucket, name)}?alt=media",
            headers={"Range": f"bytes={first}-{last}"}, preload_content=False,
            decode_content=False)
        if response.status not in (200, 206):
            raise RuntimeError(f"GET {name}: HTTP {response.status}")
        got = 0
        while chunk := response.read(MiB):
            got += len(chunk)
        response.release_conn()
        return got

    return get


def _cpu_so_far() -> float:
    """CPU seconds of this process and of its children that have ended."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def case_loader(**args) -> dict:
    """``read.case_wdstream`` with the CPU it took once its imports were done (``cpu_s``:
    the case's process and its DataLoader workers), and from its first batch on
    (``cpu_after_first_s``: the workers started, their buffers and shared memory mapped)."""
    import botocore.session  # noqa: F401 - imported before the clock, as case_wdstream does

    import wdstream.stream.load.dataset  # noqa: F401
    import wdstream.stream.load.loader  # noqa: F401

    before = _cpu_so_far()
    result = case_wdstream(**args, cpu_at_first=True)
    after = _cpu_so_far()
    result["cpu_s"] = after - before
    if result.get("cpu_at_first_s") is not None:
        result["cpu_after_first_s"] = after - result.pop("cpu_at_first_s")
    return result


def case_one_get(bucket: str, key: str, first_bytes: int, store: str = "s3") -> dict:
    """One plain GET with a warm client: seconds to its first byte and to ``first_bytes``."""
    quiet_logs()
    if store == "gs":
        return _one_gcs_get(bucket, key, first_bytes)
    import boto3

    client = boto3.client("s3")
    client.head_object(Bucket=bucket, Key=key)
    started = common.start_clock()
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


def _one_gcs_get(bucket: str, name: str, first_bytes: int) -> dict:
    import urllib3

    from wdstream.sources.gcs_ranges import endpoint, object_path

    pool = urllib3.PoolManager(retries=False)
    url = f"{endpoint()}/download/storage/v1{object_path(bucket, name)}?alt=media"
    pool.request("GET", url, headers={"Range": "bytes=0-0"})  # connected, as a warm client
    started = common.start_clock()
    response = pool.request("GET", url, preload_content=False, decode_content=False)
    first = None
    got = 0
    while chunk := response.read(64 << 10):
        if first is None:
            first = time.perf_counter() - started
        got += len(chunk)
        if got >= first_bytes:
            break
    response.close()
    return {"first_byte_s": first, "first_batch_bytes_s": time.perf_counter() - started}


def case_first_batch(source: str, workers: int = WORKERS, batch: int = BATCH) -> dict:
    """The loader with the dataset's defaults (shuffle on): seconds to its first batch."""
    quiet_logs()
    import botocore.session  # noqa: F401 - imported before the clock, as in case_wdstream

    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401
    import wdstream.stream.load.loader  # noqa: F401

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source)
    loader = wdstream.DataLoader(dataset, batch_size=batch, num_workers=workers)
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - started
    del iterator
    return {"ttfb_s": first}


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
    from .local_servers import LocalGcs

    sizes = QUICK if quick else FULL
    split = cpu_split(os.environ.get(LINK_CPUS_VARIABLE, ""))  # a mistake fails before any work
    rows: list[dict] = []
    goals: list[dict] = []
    with common.scratch() as root, common.LocalS3(whole_once=True) as s3, \
            LocalGcs("bench") as gcs:
        data = _datasets(root, sizes)
        sources = {}
        for name, dataset in data.items():
            prefix = PREFIXES[name]
            common.log(f"link: uploading {dataset['bytes'] / common.MB:,.0f} MB to moto")
            url = s3.upload(dataset["dir"], "bench", prefix)
            keys = [f"{prefix}/{Path(p).name}" for p in dataset["shards"]]
            shard_sizes = [Path(p).stat().st_size for p in dataset["shards"]]
            sources[name] = (url, keys, shard_sizes)
        common.log(f"link: uploading {data['1 MiB']['bytes'] / common.MB:,.0f} MB to the "
                   "GCS emulator")
        gcs_url = gcs.upload(data["1 MiB"]["dir"], "mib")
        every_cpu = os.sched_getaffinity(0)
        plane = _open_plane(root / "plane", s3, gcs, data, split)
        if split is not None:  # the cases this thread starts, on the others
            os.sched_setaffinity(0, split[1])
        try:
            cases = _cases(plane, s3, gcs, sources, gcs_url, data)
            named = {" / ".join(key): spec for key, spec in cases.items()}
            # a first batch alone takes a few seconds and spreads by ±0.1 s: more runs
            first_batches = {" / ".join(key) for key, (target, _args, _env) in cases.items()
                             if target.endswith(":case_first_batch")}
            results = _repeat(named, [s3.process.pid, gcs.process.pid], plane.pids(),
                              more_runs=first_batches)
            by_key = {key: results[" / ".join(key)] for key in cases}
        finally:
            plane.stop()
            os.sched_setaffinity(0, every_cpu)
    for number, (rate, delay) in enumerate(LINKS):
        link = plane.describe(number)
        limit_goal = LIMIT_GOALS[(rate, delay)]
        for store, table, names in (("", T_LINK, list(data)), ("gs ", T_GCS, ["1 MiB"])):
            limit_mbps, rtt, bare_per_gb = _limit_rows(rows, by_key, link, store, table, rate)
            for name in names:
                result = by_key[(link, store + name)]
                loopback = by_key[("loopback", store + name)]
                mbps = _mbps(result, data[name]["bytes"])
                sample_bytes = data[name]["bytes"] / data[name]["samples"]
                batch_mb = BATCH * sample_bytes / common.MB
                budget = _first_batch_budget(loopback, rtt, batch_mb, limit_mbps)
                cpu = _cpu_columns(result, data[name]["bytes"])
                cpu_ratio = ratio(cpu.get("reader CPU s/GB"), bare_per_gb)
                steady_per_gb = _steady_cpu_per_gb(result, data[name]["bytes"])
                steady_ratio = ratio(steady_per_gb, bare_per_gb)
                steady_mbps = common.steady_mbps(result, data[name]["bytes"], BATCH)
                rows.append({"table": table, "link": link,
                             "reader": f"wdstream, {name} samples, 2 workers",
                             "MB/s": mbps, "÷ limit": ratio(mbps, limit_mbps),
                             "÷ loopback": ratio(mbps, _mbps(loopback, data[name]["bytes"])),
                             "MB/s after first batch": steady_mbps,
                             "first batch s": result.get("ttfb_s"),
                             "loopback first batch s": loopback.get("ttfb_s"),
                             "first batch budget s": budget,
                             "peak RSS MB": result.get("peak_rss_mb"),
                             "CPU/GB ÷ bare client": cpu_ratio,
                             "reader CPU s/GB after first batch": steady_per_gb,
                             "CPU/GB after first batch ÷ bare client": steady_ratio,
                             **cpu, "error": result.get("error")})
                against = f"a bare client's ({LIMIT_IN_FLIGHT} ranged GETs of " \
                          f"{BARE_PART // MiB} MiB)"
                goals.append(goal(f"{link}, {store or 's3 '}{name} samples: the loader's CPU "
                                  f"per byte ÷ {against}", cpu_ratio, CPU_PER_BYTE_GOAL,
                                  higher_is_better=False, table=T_CPU_GOALS))
                goals.append(goal(f"{link}, {store or 's3 '}{name} samples, after the first "
                                  f"batch: the loader's CPU per byte ÷ {against}", steady_ratio,
                                  CPU_PER_BYTE_GOAL, higher_is_better=False,
                                  table=T_CPU_GOALS))
                if store:
                    continue
                defaults = by_key[(link, f"{name} defaults")]
                loopback_defaults = by_key[("loopback", f"{name} defaults")]
                defaults_budget = _first_batch_budget(loopback_defaults, rtt, batch_mb,
                                                      limit_mbps)
                rows.append({"table": table, "link": link,
                             "reader": f"wdstream defaults (shuffle on), {name} samples, "
                             "2 workers: first batch",
                             "first batch s": defaults.get("ttfb_s"),
                             "loopback first batch s": loopback_defaults.get("ttfb_s"),
                             "first batch budget s": defaults_budget,
                             **_cpu_columns(defaults), "error": defaults.get("error")})
                goals.append(goal(f"{link}, {name} samples: MB/s ÷ the link's limit",
                                  ratio(mbps, limit_mbps), limit_goal, table=T_GOALS))
                goals.append(goal(f"{link}, {name} samples, after the first batch: MB/s ÷ the "
                                  "link's limit", ratio(steady_mbps, limit_mbps), limit_goal,
                                  table=T_GOALS))
                more = by_key[(link, f"{name} {MORE_WORKERS} workers")]
                more_mbps = _mbps(more, data[name]["bytes"])
                rows.append({"table": table, "link": link,
                             "reader": f"wdstream, {name} samples, "
                                       f"{MORE_WORKERS} workers",
                             "MB/s": more_mbps, "÷ limit": ratio(more_mbps, limit_mbps),
                             "MB/s after first batch": common.steady_mbps(
                                 more, data[name]["bytes"], BATCH),
                             "first batch s": more.get("ttfb_s"),
                             "peak RSS MB": more.get("peak_rss_mb"),
                             **_cpu_columns(more, data[name]["bytes"]),
                             "error": more.get("error")})
                goals.append(goal(f"{link}, {name} samples, {MORE_WORKERS} workers: MB/s ÷ the "
                                  "link's limit", ratio(more_mbps, limit_mbps), limit_goal,
                                  table=T_GOALS))
                goals.append(goal(f"{link}, {name} samples: MB/s with {MORE_WORKERS} workers ÷ "
                                  f"with {WORKERS}", ratio(more_mbps, mbps), 1.0,
                                  table=T_GOALS))
                goals.append(goal(f"{link}, {name} samples, the defaults (shuffle on): first "
                                  "batch ÷ budget (their loopback first batch + 2 round trips + "
                                  "a batch at the limit)",
                                  ratio(defaults.get("ttfb_s"), defaults_budget), 1.0,
                                  higher_is_better=False, table=T_GOALS))
    for store, table, names in (("", T_LINK, list(data)), ("gs ", T_GCS, ["1 MiB"])):
        for name in names:
            result = by_key[("loopback", store + name)]
            rows.append({"table": table, "link": "loopback (no shaping)",
                         "reader": f"wdstream, {name} samples, 2 workers",
                         "MB/s": _mbps(result, data[name]["bytes"]),
                         "first batch s": result.get("ttfb_s"),
                         **_cpu_columns(result, data[name]["bytes"]),
                         "error": result.get("error")})
            if store:
                continue
            defaults = by_key[("loopback", f"{name} defaults")]
            rows.append({"table": table, "link": "loopback (no shaping)",
                         "reader": f"wdstream defaults (shuffle on), {name} samples, "
                         "2 workers: first batch",
                         "first batch s": defaults.get("ttfb_s"),
                         **_cpu_columns(defaults), "error": defaults.get("error")})
    rows.append({"table": T_LINK, "note": _plane_note(plane) + (
        f"Datasets: {data['1 MiB']['samples']} samples of 1 MiB and "
        f"{data['~100 KiB']['samples']} of 100 KiB, {sizes['shards']} shards each "
        f"({data['1 MiB']['bytes'] / common.MB:.0f} and "
        f"{data['~100 KiB']['bytes'] / common.MB:.0f} MB). The loader: opener \"auto\" (the "
        "sdk reader), shuffle off, no decoding; 'defaults' rows time the first batch with "
        "shuffle on (2 × runs − 1 runs), against the same on loopback. The plane and moto run "
        f"{_placement(split)}. MB/s runs from building the dataset to the last batch; 'after "
        "first batch' leaves the start out. The limit is the better of its two part sizes; "
        "'÷ caps' is its MB/s ÷ its connections' caps together (well below 1: the CPU, not the "
        "link, limits); '÷ loopback' compares with the loader unshaped, its ceiling here. CPU "
        "s per case: the reader's processes (imports left out), the store's server, nginx "
        "or the proxy, the kernel's interrupt work (the network's softirqs) and others (the "
        "suite's sampling, other jobs; the hypervisor's steal left out); cores busy: those "
        f"seconds per second of the read, of {os.cpu_count()}. 'CPU/GB ÷ bare client': the "
        "loader's CPU per GB delivered ÷ the "
        f"limit's boto3 client's with {BARE_PART // MiB} MiB parts, {LIMIT_IN_FLIGHT} in "
        f"flight from {WORKERS} processes.")})
    rows.append({"table": T_GCS, "note": (
        "The 1 MiB dataset in gcp-storage-emulator (in memory), run by the suite on a thread "
        "per connection (the command serves one request at a time, so no two parts would be "
        "served at once), behind the same data plane (nginx serves the media downloads from "
        "the same files and asks the emulator only for metadata; without nginx, a proxy of the "
        "same shaping); the limit's ranged GETs are urllib3 media downloads, as the gs:// "
        "reader asks. The emulator, unlike moto, costs a GET its range, not the whole "
        "object.")})
    return goals + rows


def _cases(plane, s3, gcs, sources: dict, gcs_url: str, data: dict) -> dict[tuple, tuple]:
    """Every case of the run, keyed by (link, what): on each link and on loopback."""
    cases = {}
    for number in range(len(LINKS)):
        env = dict(s3.env, AWS_ENDPOINT_URL=plane.endpoint("s3", number))
        link = plane.describe(number)
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
            cases[(link, f"{name} defaults")] = (f"{__name__}:case_first_batch", {
                "source": url}, env)
            cases[(link, f"{name} {MORE_WORKERS} workers")] = (f"{__name__}:case_loader", {
                "source": url, "decode": False, "workers": MORE_WORKERS, "batch": BATCH,
                "expected": data[name]["samples"]}, env)
        gcs_env = dict(gcs.env, STORAGE_EMULATOR_HOST=plane.endpoint("gs", number))
        for part in LIMIT_PARTS:
            cases[(link, f"gs limit {part // MiB} MiB")] = (
                f"{__name__}:case_link_limit",
                {"bucket": "bench", "keys": keys, "sizes": shard_sizes, "part": part,
                 "store": "gs"}, gcs_env)
        cases[(link, "gs one GET")] = (f"{__name__}:case_one_get", {
            "bucket": "bench", "key": keys[0], "first_bytes": BATCH * MiB,
            "store": "gs"}, gcs_env)
        cases[(link, "gs 1 MiB")] = (f"{__name__}:case_loader", {
            "source": gcs_url, "decode": False, "workers": WORKERS, "batch": BATCH,
            "expected": data["1 MiB"]["samples"]}, gcs_env)
    s3_env = dict(s3.env, AWS_ENDPOINT_URL=plane.endpoint("s3", None))
    gcs_env = dict(gcs.env, STORAGE_EMULATOR_HOST=plane.endpoint("gs", None))
    for name, (url, _keys, _sizes) in sources.items():
        cases[("loopback", name)] = (f"{__name__}:case_loader", {
            "source": url, "decode": False, "workers": WORKERS, "batch": BATCH,
            "expected": data[name]["samples"]}, s3_env)
        cases[("loopback", f"{name} defaults")] = (f"{__name__}:case_first_batch", {
            "source": url}, s3_env)
    cases[("loopback", "gs 1 MiB")] = (f"{__name__}:case_loader", {
        "source": gcs_url, "decode": False, "workers": WORKERS, "batch": BATCH,
        "expected": data["1 MiB"]["samples"]}, gcs_env)
    return cases


class _ProxyPlane:
    """The data plane where nginx cannot run: the suite's proxy (``shaped_link.py``) in front
    of moto and of the GCS emulator, one per link and store, its threads in this process (on
    the link's CPUs with a split); loopback is the servers themselves."""

    def __init__(self, s3, gcs, split: tuple[set[int], set[int]] | None, why: str):
        from .shaped_link import ShapedProxy

        self.servers = {"s3": s3, "gs": gcs}
        self.why = why
        if split is not None:
            os.sched_setaffinity(0, split[0])  # this thread's, which new threads inherit
        self.proxies = [{store: ShapedProxy(server.port, rate * 1e6, delay / 1000).start()
                         for store, server in self.servers.items()} for rate, delay in LINKS]

    def endpoint(self, store: str, link: int | None) -> str:
        return self.servers[store].endpoint if link is None else self.proxies[link][store].endpoint

    def describe(self, link: int) -> str:
        return self.proxies[link]["s3"].describe()

    def pids(self) -> list[int]:
        return []  # the proxy's CPU is this process's

    def stop(self) -> None:
        for pair in self.proxies:
            for proxy in pair.values():
                proxy.stop()


def _open_plane(folder: Path, s3, gcs, data: dict, split):
    """The links' data plane, started: nginx serving the datasets' files in front of moto and
    the GCS emulator (``data_plane.NginxPlane``), or, where nginx cannot run here, the suite's
    proxy (``_ProxyPlane``), said in the log and in the table's note. With ``split``, the
    servers and the plane on the link's CPUs."""
    from .data_plane import NginxPlane, missing

    if split is not None:
        for pid in (s3.process.pid, gcs.process.pid):
            pin_process(pid, split[0])
    why = missing()
    if why is not None:
        common.log(f"link: {why}: the data plane falls back to moto and the GCS emulator "
                   "behind the suite's proxy")
        return _ProxyPlane(s3, gcs, split, why)
    plane = NginxPlane(folder, s3.port, gcs.port,
                       [(rate * 1e6, delay / 1000) for rate, delay in LINKS])
    for name, dataset in data.items():
        plane.mirror(dataset["dir"], "bench", PREFIXES[name])
    plane.start()
    if split is not None:
        for pid in plane.pids():
            pin_process(pid, split[0])
    return plane


def _plane_note(plane) -> str:
    """The table note's words on the data plane."""
    if isinstance(plane, _ProxyPlane):
        return (f"Data plane: moto and the GCS emulator behind the suite's proxy, nginx being "
                f"unavailable ({plane.why}): the servers' CPU per byte weighs on the loader's "
                "cores and on the limit. ")
    return ("Data plane: nginx serves the shards' GETs and HEADs from files, each link a "
            "listener whose connections the kernel paces (SO_MAX_PACING_RATE) and whose "
            "requests are held back by the delay; moto and the GCS emulator answer the rest; "
            "loopback is nginx unshaped. ")


def cpu_split(text: str) -> tuple[set[int], set[int]] | None:
    """``WDSTREAM_BENCH_LINK_CPUS`` read: (the CPUs the link's simulation runs on, the CPUs
    left to the cases), from a list such as "2,3" or "2-3"; None when ``text`` is empty (every
    process on every CPU). Raises ``ValueError`` naming the variable for a list it cannot
    read, a CPU this process may not run on, or a list that leaves the cases none."""
    text = text.strip()
    if not text:
        return None
    link_cpus: set[int] = set()
    for piece in text.split(","):
        first, dash, last = piece.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f"{LINK_CPUS_VARIABLE}={text!r}: expected CPU numbers such as "
                             "2,3 or 2-3") from None
        if low < 0 or high < low:
            raise ValueError(f"{LINK_CPUS_VARIABLE}={text!r}: {piece.strip()!r} is not a "
                             "range of CPUs")
        link_cpus.update(range(low, high + 1))
    allowed = os.sched_getaffinity(0)
    if not link_cpus <= allowed:
        raise ValueError(f"{LINK_CPUS_VARIABLE}={text!r}: CPUs {sorted(link_cpus - allowed)} "
                         f"are not among this process's ({sorted(allowed)})")
    if not allowed - link_cpus:
        raise ValueError(f"{LINK_CPUS_VARIABLE}={text!r} leaves no CPU for the loader "
                         f"(this process may run on {sorted(allowed)})")
    return link_cpus, allowed - link_cpus


def _placement(split: tuple[set[int], set[int]] | None) -> str:
    """Where the note says the link's simulation and the cases ran."""
    if split is None:
        return (f"on the same {len(os.sched_getaffinity(0))} cores as the loader "
                f"({LINK_CPUS_VARIABLE} unset)")
    return (f"with the GCS emulator on CPUs {_cpu_list(split[0])}, the cases on CPUs "
            f"{_cpu_list(split[1])} ({LINK_CPUS_VARIABLE})")


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (the threads it starts later inherit its
    threads' CPUs)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def _first_batch_budget(loopback: dict, rtt: float | None, batch_mb: float,
                        limit_mbps: float | None) -> float | None:
    """A first batch's budget on a link: the same loader's first batch on loopback, 2 round
    trips and a batch's bytes at the link's limit; None where a figure is missing."""
    if rtt is None or loopback.get("ttfb_s") is None or not limit_mbps:
        return None
    return loopback["ttfb_s"] + 2 * rtt + batch_mb / limit_mbps


def _limit_rows(rows: list[dict], by_key: dict, link: str, store: str, table: str,
                connection_mbps: float) -> tuple[float | None, float | None, float | None]:
    """The rows of the link's limit and of one GET; returns (limit MB/s, round trip s, the
    bare client's CPU s per GB with the loader's part size, ``BARE_PART``).
    ``connection_mbps``: one connection's cap, so that each limit row says what share of
    its GETs' caps together it reached."""
    limits = []
    bare = by_key[(link, f"{store}limit {BARE_PART // MiB} MiB")]
    for part in LIMIT_PARTS:
        limit = by_key[(link, f"{store}limit {part // MiB} MiB")]
        limits.append(_mbps(limit, limit.get("bytes_read")) or 0.0)
        rows.append({"table": table, "link": link,
                     "reader": f"limit: {LIMIT_IN_FLIGHT} ranged GETs of {part // MiB} MiB "
                     f"in flight ({WORKERS} processes)", "MB/s": limits[-1] or None,
                     "÷ caps": ratio(limits[-1] or None, LIMIT_IN_FLIGHT * connection_mbps),
                     **_cpu_columns(limit, limit.get("bytes_read")),
                     "error": limit.get("error")})
    one = by_key[(link, f"{store}one GET")]
    rows.append({"table": table, "link": link, "reader": "one plain GET (warm client)",
                 "first byte s": one.get("first_byte_s"),
                 "first batch s": one.get("first_batch_bytes_s"),
                 "MB/s": (BATCH * MiB / common.MB / one["first_batch_bytes_s"])
                 if one.get("first_batch_bytes_s") else None,
                 "error": one.get("error")})
    bare_per_gb = _cpu_columns(bare, bare.get("bytes_read")).get("reader CPU s/GB")
    return max(limits) or None, one.get("first_byte_s"), bare_per_gb


def _repeat(cases: dict[str, tuple], server_pids: list[int], plane_pids: list[int],
            more_runs: set[str] | frozenset[str] = frozenset()) -> dict[str, dict]:
    """``common.repeat`` with the CPU each case took, the servers', the data plane's (nginx:
    ``plane_pids``), the proxy's and the machine's. The cases in ``more_runs`` run
    ``2 × runs − 1`` times, the others ``runs``."""
    runs = common.RUNS
    most = 2 * runs - 1  # the runs of the cases in more_runs
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for round_ in range(most):
        for name, (target, args, env) in cases.items():
            total = most if name in more_runs else runs
            if round_ >= total:
                continue
            common.log(f"{name} (run {round_ + 1}/{total})")
            load = os.getloadavg()[0]
            before = _cpu(server_pids, plane_pids)
            result = common.run_case(target, args, env=env)
            after = _cpu(server_pids, plane_pids)
            used = {key: after[key] - before[key] for key in before}
            # this process's CPU is the proxy's, but for the sampling of the case's memory
            used["proxy"] = max(0.0, used["proxy"] - result.get("sampler_cpu_s", 0.0))
            # the reader's own CPU once its imports were done, where the case says it
            result.update({"cpu_reader_s": result.get("cpu_s", used["reader"]),
                           "cpu_server_s": used["server"],
                           "cpu_plane_s": used["plane"] if plane_pids else None,
                           "cpu_proxy_s": None if plane_pids else used["proxy"],
                           "cpu_interrupts_s": used["interrupts"],
                           "cpu_others_s": max(0.0, used["machine"] - used["reader"]
                                               - used["server"] - used["plane"]
                                               - used["proxy"] - used["interrupts"]),
                           "load": load})
            if result.get("seconds"):  # how much of the machine the timed read kept busy
                result["cores_busy"] = sum(result[key] or 0.0 for key in (
                    "cpu_reader_s", "cpu_server_s", "cpu_plane_s", "cpu_proxy_s",
                    "cpu_interrupts_s", "cpu_others_s")) / result["seconds"]
            results[name].append(result)
    return {name: common.medians(values) for name, values in results.items()}


def _cpu(server_pids: list[int], plane_pids: list[int]) -> dict:
    """CPU seconds so far: the cases' processes (reaped children of this one), the servers
    (moto, the GCS emulator), the data plane (nginx), this process (the proxy's thread, if
    the plane is the proxy), the kernel's interrupt work
    (the network's softirqs, charged to no process) and the whole machine's work (from
    /proc/stat: the time the hypervisor took from it, "steal", left out)."""
    import psutil

    mine = os.times()
    def cpu_of(pids: list[int]) -> float:
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)

    machine = common.machine_cpu()
    return {"reader": mine.children_user + mine.children_system,
            "server": cpu_of(server_pids), "plane": cpu_of(plane_pids),
            "proxy": mine.user + mine.system,
            "interrupts": machine["irq"] + machine["softirq"],
            "machine": sum(machine.values())}


def _cpu_columns(result: dict, nbytes=None) -> dict:
    """The CPU columns of a case's row; with ``nbytes`` (the bytes it delivered), the
    reader's and nginx's CPU seconds per GB too."""
    per_gb = {}
    if nbytes and "error" not in result:
        gb = nbytes / 1e9
        per_gb = {"reader CPU s/GB": _divided(result.get("cpu_reader_s"), gb),
                  "nginx CPU s/GB": _divided(result.get("cpu_plane_s"), gb)}
    columns = {**per_gb, "CPU s: reader": result.get("cpu_reader_s"),
               "server": result.get("cpu_server_s"), "nginx": result.get("cpu_plane_s"),
               "proxy": result.get("cpu_proxy_s"), "interrupts": result.get("cpu_interrupts_s"),
               "others": result.get("cpu_others_s"), "cores busy": result.get("cores_busy")}
    # the plane that did not run has no column (nginx's, or the proxy's: the suite's process)
    return {key: value for key, value in columns.items()
            if value is not None or key not in ("nginx", "proxy", "nginx CPU s/GB")}


def _divided(value: float | None, by: float) -> float | None:
    return None if value is None else value / by


def _mbps(result: dict, nbytes) -> float | None:
    seconds = result.get("seconds")
    if not seconds or not nbytes or "error" in result:
        return None
    return nbytes / common.MB / seconds


def _steady_cpu_per_gb(result: dict, nbytes) -> float | None:
    """The reader's CPU seconds per GB from its first batch on (that batch's bytes left out,
    as in ``common.steady_mbps``)."""
    cpu = result.get("cpu_after_first_s")
    after = common.bytes_after_first_batch(result, nbytes, BATCH)
    return None if cpu is None or not after else cpu / (after / 1e9)
