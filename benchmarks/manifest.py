"""Large manifests: building a ``StreamingDataset`` on 100,000 and 1,000,000 shards, the epoch
plan, DataLoader workers' memory, and the ranks of one node sharing one parse.

Every case runs in a fresh process that imports wdstream (and torch) before its clock.
Manifests are written by ``Manifest.to_json`` (one shard per line, the layout ``wdstream pack``
and ``wdstream index`` write) with every key ``pack`` writes per shard: ``url``, ``samples``,
``bytes``, ``sha256``, ``head`` and ``last_key``.

- load: ``StreamingDataset(prefix, share_manifest=False)`` on a local ``index.json`` (read,
  parse, shard table), then one epoch's plan for 8 ranks of 4 workers; the resident memory the
  dataset keeps (RSS after minus before) and the peak above the start; CPU seconds beside wall
  seconds (the machine may be shared).
- workers: a DataLoader with 2 workers over the 1,000,000-shard manifest reads 1,000 shards per
  worker (files hard-linked to one real shard, so the manifest's identity keys hold), then the
  workers' PSS and USS (private pages) are read from ``/proc/PID/smaps_rollup``; beside it the
  same over a 3,000-shard manifest, so the difference is what the manifest costs a worker.
- worker plan: what one DataLoader worker builds before it reads, on the 1,000,000-shard
  manifest with 1 rank of 2 workers: the epoch plan, its stream's spans (``stream_spans``
  after ``drop_first``) and the reader over them (``SpanReader``: the visits it walks); the
  RSS that adds (malloc's free pages handed back first) and the CPU seconds it takes.
- node: N ranks (processes started together, as torchrun starts them) build the dataset with
  the default ``share_manifest=True`` in a fresh directory: one parses and publishes, the
  others wait and map; then N ranks again with the copy in place ("ranks 2..N": each maps).
  PSS per rank is read while all N are alive.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from pathlib import Path

from . import common
from .read import goal

TITLE = "Large manifests"
FULL = {"sizes": (100_000, 1_000_000), "one_line": True, "ranks": 4, "worker_shards": 1000}
QUICK = {"sizes": (100_000, 1_000_000), "one_line": False, "ranks": 4, "worker_shards": 1000}
T_LOAD = "large manifests: StreamingDataset(prefix) on a local index.json, then one epoch's plan"
T_WORKERS = "DataLoader workers on a 1,000,000-shard manifest: memory per worker"
T_WORKER_PLAN = ("a DataLoader worker's epoch on a 1,000,000-shard manifest: its plan, spans and "
                 "reader (1 rank x 2 workers)")
T_NODE = "ranks of one node on a 1,000,000-shard manifest (share_manifest=True, the default)"
T_GOALS = "goals"


def _rss_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * resource.getpagesize() / common.MB


def _reset_peak() -> None:
    """Make the kernel's peak RSS (VmHWM) start again from the current RSS."""
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")


def _peak_mb() -> float:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / common.MB
    return 0.0


def _smaps(pid: int) -> dict[str, float]:
    """Rss, Pss and USS (private clean + dirty) of a process, MB."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                values[name] = int(rest.split()[0]) * 1024 / common.MB
    return {"rss": values.get("Rss", 0.0), "pss": values.get("Pss", 0.0),
            "uss": values.get("Private_Clean", 0.0) + values.get("Private_Dirty", 0.0)}


def case_manifest(source: str) -> dict:
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - torch imported before the clock

    before = _rss_mb()
    _reset_peak()
    started, cpu = time.perf_counter(), time.process_time()
    dataset = wdstream.StreamingDataset(source, shuffle=True, share_manifest=False)
    loaded, cpu_loaded = time.perf_counter(), time.process_time()
    plan = dataset.plan(0, 8, 4)
    planned = time.perf_counter()
    spans = plan.stream_spans(3, 2)
    after = _rss_mb()
    peak = _peak_mb()
    return {"load_s": loaded - started, "load_cpu_s": cpu_loaded - cpu,
            "plan_s": planned - loaded, "kept_mb": after - before,
            "peak_mb": peak - before, "shards": len(dataset.shards.urls),
            "samples": len(dataset), "stream_spans": len(spans),
            "compact": type(dataset.manifest.shards).__name__ == "ShardArrays"}


# --------------------------------------------------------------------------- workers


def case_workers(source: str, batches: int, share: str | None = None) -> dict:
    """Read ``batches`` batches of 32 through 2 workers, then the workers' memory."""
    import psutil

    import wdstream

    dataset = wdstream.StreamingDataset(source, seed=0, decode=False,
                                        share_manifest=share or False)
    loader = wdstream.DataLoader(dataset, batch_size=32, num_workers=2)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    me = psutil.Process()
    workers = []
    for child in me.children():  # the DataLoader's workers: forks of this process
        try:
            if child.cmdline() == me.cmdline():
                workers.append(_smaps(child.pid))
        except (OSError, psutil.Error):
            continue
    main = _smaps(os.getpid())
    del iterator
    return {"worker_pss_mb": common.median([w["pss"] for w in workers]),
            "worker_uss_mb": common.median([w["uss"] for w in workers]),
            "worker_rss_mb": common.median([w["rss"] for w in workers]),
            "main_pss_mb": main["pss"], "workers": len(workers),
            "mapped": getattr(dataset.manifest.shards, "mapped_from", None) is not None}


def case_worker_plan(source: str) -> dict:
    """What a DataLoader worker holds of its epoch (1 rank, 2 workers, stream 0), built the
    way ``StreamingDataset`` builds it in the worker, without reading."""
    import gc

    import wdstream
    from wdstream.shards.compact import release_free_memory
    from wdstream.stream.plan.epoch import drop_first
    from wdstream.stream.read.shard_reader import SpanReader

    dataset = wdstream.StreamingDataset(source, seed=0, share_manifest=False)
    gc.collect()
    release_free_memory()
    before = _rss_mb()
    cpu = time.process_time()
    plan = dataset.plan(0, 1, 2)
    spans = drop_first(plan.stream_spans(0, 0), 0)
    reader = SpanReader(spans, dataset.shards, dataset.read_options)
    cpu_built = time.process_time()
    gc.collect()
    release_free_memory()
    return {"held_mb": _rss_mb() - before, "build_cpu_s": cpu_built - cpu,
            "spans": len(spans), "visits": len(reader.visits),
            "spans_type": type(spans).__name__}


def write_worker_data(folder: Path, count: int, per_worker: int) -> tuple[str, int]:
    """A manifest of ``count`` shards that all have one real shard's bytes, and hard links
    for the shards the two workers of one rank read first; (prefix, batches to read)."""
    import wdstream
    from wdstream.shards.index_shards import index_shard
    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar_writer import TarWriter

    folder.mkdir(parents=True)
    real = folder / "real.tar"
    samples = 4
    with open(real, "wb") as out:
        writer = TarWriter(out)
        for i in range(samples):
            writer.add(f"{i:06d}.json", json.dumps({"i": i, "text": "x" * 200}).encode())
        writer.close()
    info, _ = index_shard(str(real))
    shards = [ShardInfo(f"shard-{i:07d}.tar", info.samples, info.bytes, info.sha256, info.head,
                        info.last_key) for i in range(count)]
    (folder / "index.json").write_text(Manifest(shards, extensions=["json"]).to_json())
    dataset = wdstream.StreamingDataset(str(folder), seed=0, share_manifest=False)
    plan = dataset.plan(0, 1, 2)
    for worker in range(2):
        for span in plan.stream_spans(0, worker)[:per_worker + 200]:  # + what prefetch reads
            path = folder / shards[span.shard].url
            if not path.exists():
                os.link(real, path)
    return str(folder), per_worker * 2 * samples // 32


# --------------------------------------------------------------------------- node


def _rank(source: str, directory: str, ready, go, results, done) -> None:
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - torch imported before the clock

    ready.release()
    go.wait()
    before = _rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    dataset = wdstream.StreamingDataset(source, share_manifest=directory)
    loaded, cpu_loaded = time.perf_counter(), time.process_time()
    dataset.plan(0, 8, 4).stream_spans(0, 0)
    shards = dataset.manifest.shards
    results.put({"load_s": loaded - started, "cpu_s": cpu_loaded - cpu,
                 "rss_mb": _rss_mb() - before, "pss_mb": _smaps(os.getpid())["pss"],
                 "mapped": getattr(shards, "mapped_from", None) is not None})
    done.wait()  # alive until every rank measured its PSS


def _start_ranks(source: str, directory: str, count: int) -> list[dict]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ready, go, done = context.Semaphore(0), context.Event(), context.Event()
    results = context.Queue()
    processes = [context.Process(target=_rank, args=(source, directory, ready, go, results,
                                                     done)) for _ in range(count)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    go.set()
    measured = [results.get(timeout=common.CASE_TIMEOUT) for _ in processes]
    done.set()
    for process in processes:
        process.join()
    return measured


def case_node(source: str, ranks: int) -> dict:
    import tempfile

    directory = tempfile.mkdtemp(prefix="wdstream-bench-shared-")
    try:
        together = _start_ranks(source, directory, ranks)
        later = _start_ranks(source, directory, ranks)
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    first = max(together, key=lambda r: r["load_s"])
    others = [r for r in together if r is not first]
    return {"first_s": first["load_s"], "first_cpu_s": first["cpu_s"],
            "waiting_s": common.median([r["load_s"] for r in others]),
            "later_s": common.median([r["load_s"] for r in later]),
            "later_cpu_s": common.median([r["cpu_s"] for r in later]),
            "later_rss_mb": common.median([r["rss_mb"] for r in later]),
            "rank_pss_mb": common.median([r["pss_mb"] for r in later]),
            "node_pss_mb": sum(r["pss_mb"] for r in later),
            "mapped": sum(r["mapped"] for r in together + later), "ranks": ranks}


# --------------------------------------------------------------------------- data, run


def write_manifests(folder: Path, count: int, one_line: bool) -> dict[str, str]:
    from wdstream.shards.manifest import Manifest, ShardInfo

    infos = [ShardInfo(f"shard-{i:07d}.tar", 1000, 1_100_000 + i,
                       hashlib.sha256(i.to_bytes(8, "little")).hexdigest(),
                       hashlib.md5(i.to_bytes(8, "little")).hexdigest(),
                       f"{i * 1000 + 999:012d}")
             for i in range(count)]
    text = Manifest(infos, extensions=["json"]).to_json()
    lines = folder / f"lines-{count}"
    lines.mkdir(parents=True)
    (lines / "index.json").write_text(text)
    out = {"to_json layout": str(lines)}
    if one_line and count >= 1_000_000:
        one = folder / f"one-line-{count}"
        one.mkdir()
        (one / "index.json").write_text(json.dumps(json.loads(text)))
        out["one-line JSON (general parser)"] = str(one)
    return out


def table_rows(table: str, label: str, results: dict[str, dict], columns: dict[str, str]
               ) -> list[dict]:
    """One row per case of ``results``: its name under ``label``, then each column's value
    (``columns``: column -> result key), the runs and any error."""
    return [{"table": table, label: name, **{column: result.get(key)
                                             for column, key in columns.items()},
             "runs": result.get("runs"), "error": result.get("error")}
            for name, result in results.items()]


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    rows, goals = [], []
    million = f"{1_000_000:,} shards, to_json layout"
    with common.scratch() as root:
        cases = {}
        for count in sizes["sizes"]:
            common.log(f"manifest: writing {count:,} shards")
            for layout, folder in write_manifests(root, count, sizes["one_line"]).items():
                cases[f"{count:,} shards, {layout}"] = (f"{__name__}:case_manifest",
                                                        {"source": folder})
        common.log("manifest: writing the workers' data")
        per_worker = sizes["worker_shards"]
        big, batches = write_worker_data(root / "workers-1m", 1_000_000, per_worker)
        small, _ = write_worker_data(root / "workers-3000", 3000, per_worker)
        workers = {
            "3,000 shards (baseline)": (f"{__name__}:case_workers",
                                      {"source": small, "batches": batches}),
            "1,000,000 shards, parsed by this rank": (
                f"{__name__}:case_workers", {"source": big, "batches": batches}),
            "1,000,000 shards, mapped node-local copy": (
                f"{__name__}:case_workers", {"source": big, "batches": batches,
                                             "share": str(root / "shared")}),
        }
        node = {f"{sizes['ranks']} ranks": (f"{__name__}:case_node",
                                            {"source": str(root / "lines-1000000"),
                                             "ranks": sizes["ranks"]})}
        plan_case = {"1,000,000 shards": (f"{__name__}:case_worker_plan",
                                          {"source": str(root / "lines-1000000")})}
        results = common.repeat(cases, progress=common.log)
        worker_results = common.repeat(workers, progress=common.log)
        plan_results = common.repeat(plan_case, progress=common.log)
        node_results = common.repeat(node, progress=common.log)
    rows += table_rows(T_LOAD, "manifest", results, {
        "load s": "load_s", "load CPU s": "load_cpu_s",
        "plan s (8 ranks x 4 workers)": "plan_s", "kept MB": "kept_mb",
        "peak MB above start": "peak_mb", "as arrays": "compact"})
    rows.append({"table": T_LOAD, "note": (
        "Each shard: a 17-character name, counts, a sha256, a head and a 12-character last key "
        "(216 MB of index.json for a million). 'kept' is the RSS the dataset holds once built; "
        "'peak' includes the file's text while it is parsed. Each process parses its own copy "
        "here (share_manifest=False).")})
    rows += table_rows(T_WORKERS, "manifest", worker_results, {
        "PSS per worker MB": "worker_pss_mb", "USS per worker MB": "worker_uss_mb",
        "RSS per worker MB": "worker_rss_mb", "main PSS MB": "main_pss_mb",
        "workers": "workers"})
    rows.append({"table": T_WORKERS, "note": (
        f"2 workers, batch 32, after {batches} batches ({per_worker:,} shards of 4 samples per "
        "worker; a full epoch of a million shards takes too long here). USS: pages only that "
        "worker holds; the manifest's cost to a worker is its USS above the 3,000-shard row: the "
        "manifest's arrays are shared; what a worker holds of its own is its epoch plan "
        "(its stream's spans and the reader's visits, some 500,000 here: the table below).")})
    rows += table_rows(T_WORKER_PLAN, "manifest", plan_results, {
        "spans": "spans", "visits": "visits", "held MB": "held_mb",
        "built in CPU s": "build_cpu_s", "spans held as": "spans_type"})
    rows.append({"table": T_WORKER_PLAN, "note": (
        "Built in one process as StreamingDataset builds it in a worker (plan(0, 1, 2), "
        "drop_first(stream_spans(0, 0), 0), SpanReader over them), without reading; 'held' is "
        "the RSS added, after gc and malloc_trim. 'list': a Span object per span and a list "
        "per visit; 'SpanArray': int64 arrays of shard, start and stop.")})
    rows += table_rows(T_NODE, "ranks", node_results, {
        "first rank (parse + publish) s": "first_s",
        "ranks 2..N started with it s": "waiting_s",
        "ranks 2..N, copy in place s": "later_s", "ranks 2..N CPU s": "later_cpu_s",
        "RSS per rank MB": "later_rss_mb", "PSS per rank MB": "rank_pss_mb",
        "node PSS MB": "node_pss_mb"})
    rows.append({"table": T_NODE, "note": (
        "Ranks are processes started together (spawn, as torchrun does). 'started with it': "
        "they wait on the entry's lock while the first parses, then map. 'copy in place': "
        "the entry exists (a later job, or ranks that start later); each checks the entry "
        "(header, sha256 of its 114 MB of columns, names) and maps it. PSS counts the mapped "
        "pages shared among the ranks.")})
    loaded = results.get(million, {})
    node_result = node_results.get(f"{sizes['ranks']} ranks", {})
    goals.append(goal("1,000,000 shards: StreamingDataset built, s", loaded.get("load_s"), 2.0,
                      higher_is_better=False, table=T_GOALS))
    goals.append(goal("1,000,000 shards: memory kept per rank, MB", loaded.get("kept_mb"), 200,
                      higher_is_better=False, table=T_GOALS))
    goals.append(goal("1,000,000 shards: the epoch plan, s", loaded.get("plan_s"), 1.0,
                      higher_is_better=False, table=T_GOALS))
    goals.append(goal("1,000,000 shards: rank 2..N with a node-local copy, s",
                      node_result.get("later_s"), 2.0, higher_is_better=False, table=T_GOALS))
    return goals + rows
