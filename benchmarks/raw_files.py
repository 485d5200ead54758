"""Parquet where it lies: wdstream against Hugging Face ``datasets`` streaming and a bare
pyarrow loop, on the same files, local and from a moto S3 server.

- zstd Parquet of ~1 KiB text rows, and of a pre-tokenized 2,048-token ``input_ids`` column;
  2 workers, batch 32, shuffle on (each library's default way of shuffling a stream: a
  ``datasets`` shuffle buffer of 1,000 rows).
- rows/s of ``wdstream.StreamingDataset`` ÷ ``load_dataset("parquet", streaming=True)`` in a
  torch ``DataLoader`` with the same workers (goal ≥ 2), ÷ a bare
  ``pyarrow.parquet.ParquetFile.iter_batches`` loop over the same files in one process (the
  limit; goal ≥ 0.8), and the pre-tokenized tokens/s per worker (goal ≥ 50 M).
- the time to build a dataset over many small Parquet files on the S3 server (footers only,
  32 in flight; through moto, and with the files' GETs served by nginx) and the builder's
  peak memory (goal: 10,000 files in at most 10 s).
- small row groups (300 of those files, 50 rows a group) read through nginx on a link with a
  30 ms first byte, wdstream ÷ ``datasets`` streaming (goal ≥ 2), where latency, not
  bandwidth, bounds the rows.
LitData's Parquet streaming is a peer where it installs beside torch; it is named as skipped
otherwise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from . import common
from .common import quiet_logs, ratio
from .read import goal

TITLE = "Parquet, JSON Lines and Arrow files where they lie"
WORKERS = 2
BATCH = 32
SEED = 17
TOKENS = 2048

# Half a GB of token rows (2,000 a file), so that their whole read is not mostly the loader's
# start (docs/benchmarks.md)
FULL = {"text_rows": 400_000, "token_rows": 64_000, "files": 8, "token_files": 32,
        "cut_files": 10_000}
QUICK = {"text_rows": 40_000, "token_rows": 4_000, "files": 4, "token_files": 4,
         "cut_files": 1_000}

T_ROWS = "rows/s, 2 workers, batch 32, shuffle on (medians)"
T_CUT = "building a dataset over many small Parquet files on the S3 server (footers only)"
T_GOALS = "goals"
PLANE = "nginx: GETs from files, listing from moto"
SHARED = "nginx, the units published by another rank of the node"
CUT_GOAL_S = 10  # "a 10,000-file dataset is cut into units in seconds"
LATENCY_LINK = (100e6, 0.03)  # bytes/s per connection and first-byte delay: a cloud store's
LATENCY_FILES = 300  # of the many small files, read through that link


# =========================================================================== cases (child side)


def _warm_imports() -> None:
    """What pyarrow imports on its first read of a file (pandas, for the schema's metadata:
    1-2 s here), imported before the clock in every case."""
    import pyarrow.parquet  # noqa: F401

    try:
        import pandas  # noqa: F401
    except ImportError:
        pass


def case_wdstream(source: str, column: str, expected: int) -> dict:
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - import torch before the clock starts

    quiet_logs()
    _warm_imports()
    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, columns=[column], seed=SEED)
    loader = wdstream.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return common.consume(loader, started, expected, touch=True)


def case_hf(files: list[str], column: str, expected: int) -> dict:
    import torch.utils.data

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    quiet_logs()
    _warm_imports()
    started = common.start_clock()
    stream = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True,
                                   columns=["id", column]).shuffle(seed=SEED, buffer_size=1000)
    if column == "input_ids":  # datasets' own way to tensors (its default collates per token)
        stream = stream.with_format("torch")
    loader = torch.utils.data.DataLoader(stream, batch_size=BATCH, num_workers=WORKERS)
    rows, first = 0, None
    for batch in loader:
        first = first or time.perf_counter()
        common.touch_pages(batch)
        rows += len(batch["id"])  # a list column is collated per position
    if rows != expected:
        raise RuntimeError(f"read {rows} rows, expected {expected}")
    return {"samples": rows, "seconds": time.perf_counter() - started,
            "ttfb_s": first - started if first else None}


def case_pyarrow(files: list[str], column: str, expected: int) -> dict:
    """The bare loop, its consumer touching what it gets as the loaders' do: the pages of a
    list column's values (zero-copy from Arrow), a text column's strings as Python's."""
    import pyarrow.parquet as pq

    _warm_imports()
    started = common.start_clock()
    rows = 0
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH, columns=[column]):
            values = batch.column(0)
            if hasattr(values, "flatten"):
                common.touch_pages(values.flatten().to_numpy())
            else:
                values.to_pylist()
            rows += batch.num_rows
    seconds = time.perf_counter() - started
    if rows != expected:
        raise RuntimeError(f"read {rows} rows, expected {expected}")
    return {"samples": rows, "seconds": seconds}


def case_litdata(files: list[str], column: str, expected: int) -> dict:
    """LitData's Parquet streaming: its index of the files (``index_parquet_dataset``, which
    reads each footer) written to a scratch folder before the clock, then ``StreamingDataset``
    with its ``ParquetLoader`` (the column and ``id``, which counts a batch's rows) in its
    ``StreamingDataLoader`` with the ``spawn`` workers it asks for beside Polars. Its rows
    are dicts of Python values: the token column's lists of ints, which the default collate
    makes one tensor per token position (2,048 tensors of 32 per batch).

    Skipped, as a result, without litdata or the Polars its loader needs (the case runs under
    ``python -m benchmarks.common``, whose ``Skip`` is ``__main__.Skip``, not the class this
    module would raise)."""
    try:
        import litdata
        import polars  # noqa: F401 - ParquetLoader refuses to start without it
        from litdata.streaming.item_loader import ParquetLoader
    except ImportError as error:
        return {"error": f"skipped: litdata or Polars is not installed ({error})", "skip": True}
    quiet_logs()
    _warm_imports()
    with common.scratch("wdstream-bench-litdata-") as scratch:
        folder, index_s = _litdata_index(litdata, files, scratch)
        started = common.start_clock()
        dataset = litdata.StreamingDataset(
            str(folder), cache_dir=str(scratch / "cache"), index_path=str(scratch / "index"),
            item_loader=ParquetLoader(columns=["id", column]), shuffle=True, seed=SEED)
        loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS,
                                             multiprocessing_context="spawn")
        result = common.consume(loader, started, expected, touch=True)
    return {**result, "index_s": index_s}


def _litdata_index(litdata, files: list[str], scratch: Path) -> tuple[Path, float]:
    """LitData's index of ``files``, written under ``scratch``, and the seconds it took.
    LitData reads a local dataset from the folder its ``index.json`` is copied into, so it
    reads a folder of links to the files: the data's own folder stays as it is."""
    folder, index = scratch / "files", scratch / "index"
    folder.mkdir()
    index.mkdir()
    for path in files:
        (folder / Path(path).name).symlink_to(path)
    started = time.perf_counter()
    litdata.index_parquet_dataset(str(folder), cache_dir=str(index))
    return folder, time.perf_counter() - started


def case_cut_units(url: str, files: int, server_pid: int | None = None,
              plane_pids: tuple[int, ...] = (), shared: bool = False) -> dict:
    """The dataset built over ``files`` Parquet files: seconds, the RSS it adds to the process
    after the imports (held once built, and at its peak), and the CPU seconds of this process,
    of the server (``server_pid``) and of the data plane (``plane_pids``) while it is
    built. Cut here (no units shared on the node), or with ``shared`` as another rank of
    the node builds it: once the units are published (by a first build, not timed)."""
    import botocore.session  # noqa: F401 - the imports a rank has made anyway

    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401
    from wdstream.tables.files import find_files

    quiet_logs()
    _warm_imports()
    share = tempfile.mkdtemp(prefix="wdstream-units-") if shared else False
    if shared:
        wdstream.StreamingDataset(url, share_manifest=share)  # the rank that cuts
    before = _rss_mb()
    server, plane = _cpu_seconds(server_pid), sum(map(_cpu_seconds, plane_pids))
    cpu = _own_and_children_cpu()
    started = common.start_clock()
    dataset = wdstream.StreamingDataset(url, share_manifest=share)
    seconds = time.perf_counter() - started
    cutter_cpu = _own_and_children_cpu() - cpu
    server_cpu = _cpu_seconds(server_pid) - server if server_pid else None
    plane_cpu = sum(map(_cpu_seconds, plane_pids)) - plane if plane_pids else None
    if len(dataset.shards.files) != files:
        raise RuntimeError(f"found {len(dataset.shards.files)} files, expected {files}")
    result = {"samples": len(dataset), "seconds": seconds, "rss_added_mb": _rss_mb() - before,
              "peak_added_mb": _peak_rss_mb() - before, "cutter_cpu_s": cutter_cpu,
              "server_cpu_s": server_cpu, "plane_cpu_s": plane_cpu}
    if shared:
        shutil.rmtree(share, ignore_errors=True)
    listed = time.perf_counter()
    find_files(url)
    return {**result, "listing_s": time.perf_counter() - listed}


def _own_and_children_cpu() -> float:
    """CPU seconds of this process and of its children that ended (the cutting ones)."""
    import resource

    own, ended = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def _cpu_seconds(pid: int | None) -> float:
    """User and system CPU seconds of process ``pid`` so far (0 without one)."""
    import psutil

    return sum(psutil.Process(pid).cpu_times()[:2]) if pid else 0.0


# =========================================================================== data and rows


def _write(folder: Path, name: str, rows: int, files: int, make) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    paths, per_file = [], -(-rows // files)
    for index in range(files):
        count = min(per_file, rows - index * per_file)
        path = folder / f"{name}-{index:05d}.parquet"
        pq.write_table(pa.table(make(index * per_file, count)), path, compression="zstd",
                       row_group_size=10_000 if name == "text" else 500)
        paths.append(str(path))
    return paths


def _text(first: int, count: int) -> dict:
    words = common._text_source()
    return {"id": list(range(first, first + count)),
            "text": [words[(i * 97) % 60_000:][:1000] for i in range(first, first + count)]}


def _tokens(first: int, count: int) -> dict:
    import numpy as np
    import pyarrow as pa

    # token ids as a tokenizer's output falls: Zipf-distributed over a 50,000-token vocabulary
    # (zstd keeps about a third of their bytes, as of real token files)
    ids = (np.random.default_rng(first).zipf(1.2, count * TOKENS) % 50_000).astype(np.int32)
    offsets = np.arange(0, (count + 1) * TOKENS, TOKENS, dtype=np.int32)
    return {"id": list(range(first, first + count)),
            "input_ids": pa.ListArray.from_arrays(offsets, ids)}


def _row(where: str, data: str, name: str, result: dict) -> dict:
    return {"table": T_ROWS, "storage": where, "data": data, "reader": name,
            "rows/s": _speed(result), "rows/s after the first batch": _steady(result),
            "first batch s": result.get("ttfb_s"), "peak RSS MB": result.get("peak_rss_mb"),
            "error": result.get("error")}


def _read_rows(where: str, sets: dict, env: dict | None) -> tuple[list[dict], dict]:
    here = "benchmarks.raw_files:"
    cases = {}
    for data, (source, files, column, rows) in sets.items():
        args = {"column": column, "expected": rows}
        cases[(data, "wdstream")] = (here + "case_wdstream", {"source": source, **args}, env)
        cases[(data, "datasets streaming")] = (here + "case_hf", {"files": files, **args}, env)
        if env is None:  # the bare loop and LitData read local files
            cases[(data, "pyarrow iter_batches")] = (here + "case_pyarrow",
                                                     {"files": files, **args})
            cases[(data, "litdata")] = (here + "case_litdata", _litdata_share(files, args))
    results = common.repeat({f"{where} {k[0]} {k[1]}": v for k, v in cases.items()},
                            progress=common.log)
    rows, found = [], {}
    for (data, name) in cases:
        result = results[f"{where} {data} {name}"]
        found[(data, name)] = result
        rows.append(_row(where, data, name, result))
    return rows, found


def _litdata_share(files: list[str], args: dict) -> dict:
    """LitData's arguments: the token rows from the first file only (its rows arrive at tens
    per second: the whole set would outlast the case's time limit); rows/s compare as
    rates."""
    if args["column"] != "input_ids":
        return {"files": files, **args}
    return {"files": files[:1], "column": args["column"],
            "expected": -(-args["expected"] // len(files))}


def _speed(result: dict | None) -> float | None:
    if not result or "seconds" not in result:
        return None
    return result["samples"] / result["seconds"]


def _steady(result: dict | None) -> float | None:
    """Rows/s once the first batch is in (the workers started, the first units read)."""
    if not result or result.get("ttfb_s") is None or result["seconds"] <= result["ttfb_s"]:
        return None
    return (result["samples"] - BATCH) / (result["seconds"] - result["ttfb_s"])


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    rows, goals = [], []
    with common.scratch() as root:
        text = _write(root / "text", "text", sizes["text_rows"], sizes["files"], _text)
        tokens = _write(root / "tokens", "tokens", sizes["token_rows"], sizes["token_files"],
                        _tokens)
        local = {"~1 KiB text": (str(root / "text"), text, "text", sizes["text_rows"]),
                 "2,048 tokens": (str(root / "tokens"), tokens, "input_ids",
                                  sizes["token_rows"])}
        found, results = _read_rows("local", local, None)
        rows += found
        with common.LocalS3(whole_once=True) as s3:
            remote = {}
            for data, (folder, files, column, count) in local.items():
                url = s3.upload(folder, "bench", Path(folder).name)
                remote[data] = (url, [url + Path(f).name for f in files], column, count)
            found, s3_results = _read_rows("s3", remote, s3.env)
            rows += found
            cut = _cut_rows(s3, root / "many", sizes["cut_files"])
        rows += cut
        rows += _notes(sizes)
        for where, found in (("local", results), ("s3", s3_results)):
            wd = _speed(found.get(("~1 KiB text", "wdstream")))
            goals.append(goal(f"{where}: wdstream ÷ datasets streaming, text rows/s",
                              ratio(wd, _speed(found.get(("~1 KiB text", "datasets streaming")))),
                              2, table=T_GOALS))
        goals += _token_goals(results)
        fastest = [r["seconds"] for r in cut
                   if r.get("seconds") is not None and r["data plane"] != SHARED]
        goals.append(goal(f"{sizes['cut_files']:,} Parquet files cut into units on S3, s "
                          "(the cheaper data plane)", min(fastest) if fastest else None,
                          CUT_GOAL_S, higher_is_better=False, table=T_GOALS))
    return rows + goals


def _cut_rows(s3, folder: Path, count: int) -> list[dict]:
    """The many-files case through moto alone, and with the files' GETs served by nginx
    (``data_plane.NginxPlane``: the listing still from moto) where nginx runs here."""
    from contextlib import nullcontext

    from .data_plane import NginxPlane, missing

    url = _many_files(s3, count, folder)
    why = missing(delays=True)
    if why is not None:
        common.log(f"raw_files: {why}: files are cut through moto alone")
    with nullcontext() if why else NginxPlane(folder / "plane", s3.port,
                                              links=[LATENCY_LINK]) as plane:
        args = {"url": url, "files": count, "server_pid": s3.process.pid}
        cases = {"moto": ("benchmarks.raw_files:case_cut_units", args, s3.env)}
        if plane is not None:
            plane.mirror(folder / "files", "many", "units")
            nginx = {**s3.env, "AWS_ENDPOINT_URL": plane.endpoint("s3", None)}
            cases[PLANE] = ("benchmarks.raw_files:case_cut_units",
                            {**args, "plane_pids": plane.pids()}, nginx)
            cases[SHARED] = ("benchmarks.raw_files:case_cut_units",
                             {**args, "plane_pids": plane.pids(), "shared": True}, nginx)
        results = common.repeat(cases, progress=common.log)
        reads = [] if plane is None else _latency_reads(url, plane, s3.env)
    return reads + [{"table": T_CUT, "files": count, "data plane": name,
             "seconds": found.get("seconds"), "listing s": found.get("listing_s"),
             "peak RSS MB": found.get("peak_rss_mb"),
             "RSS added MB": found.get("rss_added_mb"),
             "peak added MB": found.get("peak_added_mb"),
             "cutter CPU s": found.get("cutter_cpu_s"),
             "cutter CPU ms per file": _per_file_ms(found.get("cutter_cpu_s"), count),
             "moto CPU s": found.get("server_cpu_s"), "nginx CPU s": found.get("plane_cpu_s"),
             "error": found.get("error")} for name, found in results.items()]


def _latency_reads(url: str, plane, env: dict) -> list[dict]:
    """The first ``LATENCY_FILES`` of the many small files (two 50-row groups each) read by
    wdstream and by ``datasets`` streaming through the plane's link with a first byte of
    ``LATENCY_LINK``'s delay: the rows' reads wait on round trips, not on bandwidth."""
    files = [f"{url}part-{index:05d}.parquet" for index in range(LATENCY_FILES)]
    link = {**env, "AWS_ENDPOINT_URL": plane.endpoint("s3", 0)}
    args = {"column": "text", "expected": LATENCY_FILES * 100}
    here = "benchmarks.raw_files:"
    cases = {"wdstream": (here + "case_wdstream", {"source": files, **args}, link),
             "datasets streaming": (here + "case_hf", {"files": files, **args}, link)}
    results = common.repeat(cases, progress=common.log)
    where = f"s3, {plane.describe(0)}"
    data = f"{LATENCY_FILES * 2} row groups of 50 rows"
    rows = [_row(where, data, name, results[name]) for name in cases]
    rows.append(goal(f"{where}: wdstream ÷ datasets streaming, rows/s of small row groups",
                     ratio(_speed(results["wdstream"]), _speed(results["datasets streaming"])),
                     2, table=T_GOALS))
    return rows


def _per_file_ms(seconds: float | None, count: int) -> float | None:
    return None if seconds is None else seconds * 1000 / count


def _notes(sizes: dict) -> list[dict]:
    rows_note = (
        f"{sizes['text_rows']:,} text rows in {sizes['files']} zstd Parquet files and "
        f"{sizes['token_rows']:,} rows of {TOKENS:,} int32 tokens in {sizes['token_files']} "
        "(row groups of 10,000 and 500 rows). The clock starts before the dataset is built, "
        "after the imports (torch, pyarrow and the pandas pyarrow loads on a first read); "
        "the consumer touches what it "
        "gets: a byte of every 4 KiB page of each batch's tensors, for the bare loop of each "
        "list column's values as numpy (no copy) and a text column's strings made Python's. "
        "'After the first batch': the rows after the first batch over the time after it. "
        "LitData reads the token rows of the first file only (tens of rows/s: the whole "
        "set would outlast a case's time limit). The rows over a link with a delayed first "
        f"byte: the first {LATENCY_FILES} of the many small files below (100 rows in 2 row "
        "groups, ~1.5 KB each), named one by one, read with the 'text' column through nginx "
        "(benchmarks/data_plane.py) on that link.")
    cut_note = (
        f"{sizes['cut_files']:,} files of 100 rows in 2 row groups (~1.5 KB each) on the "
        "moto server, put there by 16 threads; StreamingDataset(url) lists them (one listing "
        "of the folder, which holds no index.json, no shards and no subfolder) and reads each "
        "footer (one ranged GET of the file, at most its last 64 KiB, 32 files in flight in "
        "each cutting process: this one and, on this machine's 2 CPUs, one child, each "
        "taking the next page of the listing, 1,000 files, while the listing goes on). "
        "Data plane 'moto': every request to the moto server, which answers each GET at "
        "about 4 ms of its CPU, on the cutter's 2 cores; 'nginx': the files' GETs served "
        "from the same bytes on disk by nginx (benchmarks/data_plane.py), the listing by moto "
        "behind it, so that the figure is the cutter's more than the simulated store's. "
        "Seconds from the call to the dataset; peak RSS of the process; the RSS the dataset "
        "adds to it once built and at its peak, after the imports (torch, pyarrow, botocore): "
        "what a rank pays; CPU seconds of the process and its child, of "
        "moto and of nginx meanwhile; 'listing s': one listing of the folder alone, after. "
        "Every process cuts here (share_manifest=False) but in the last row, where the "
        "node's units were published by a first build (another rank, or the job before a "
        "restart): the rank lists the folder and reads those units. "
        f"The goal (at most {CUT_GOAL_S} s) takes the cheaper data plane.")
    return [{"table": T_ROWS, "note": rows_note}, {"table": T_CUT, "note": cut_note}]


def _token_goals(results: dict) -> list[dict]:
    """The pre-tokenized rows against the bare pyarrow loop, and tokens/s per worker: over
    the whole run, and once the first batch is in."""
    arrow = _speed(results.get(("2,048 tokens", "pyarrow iter_batches")))
    goals = []
    for how, speed in (("", _speed), (", after the first batch", _steady)):
        tokens_wd = speed(results.get(("2,048 tokens", "wdstream")))
        goals.append(goal(f"local: wdstream ÷ pyarrow iter_batches, token rows/s{how}",
                          ratio(tokens_wd, arrow), 0.8, table=T_GOALS))
        goals.append(goal(f"local: pre-tokenized M tokens/s per worker{how}",
                          tokens_wd * TOKENS / WORKERS / 1e6 if tokens_wd else None, 50,
                          table=T_GOALS))
    return goals


def _many_files(s3, count: int, folder: Path, threads: int = 16) -> str:
    """``count`` small Parquet files (100 rows, 2 row groups each) in ``folder``/files and on
    the S3 server, put by ``threads`` at once; their bytes differ by the first row's id."""
    import io
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    client = s3.client()
    client.create_bucket(Bucket="many")
    (folder / "files").mkdir(parents=True)

    def put(index: int) -> None:
        out = io.BytesIO()
        table = pa.table({"id": list(range(index, index + 100)), "text": ["x" * 100] * 100})
        pq.write_table(table, out, row_group_size=50)
        name = f"part-{index:05d}.parquet"
        (folder / "files" / name).write_bytes(out.getvalue())
        client.put_object(Bucket="many", Key=f"units/{name}", Body=out.getvalue())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(count)))
    return "s3://many/units/"
