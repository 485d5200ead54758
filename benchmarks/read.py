"""Reading throughput: wdstream against its peers and against the raw speed of the storage.

Tables (every case in a fresh process, ``common.RUNS`` runs interleaved, medians; ratios are
between cases of the same suite run):

small records
    ~1 KiB JSON samples from local shards, 2 DataLoader workers, ``batch_size=32``, each library's
    default collate; with JSON decoding and without. Peers: plain ``webdataset.WebDataset``,
    Hugging Face ``datasets`` streaming of the same records as JSONL (``json`` builder; ``text``
    for no decoding), LitData (its own chunk format, converted once, untimed); Mosaic
    ``streaming`` is measured by ``benchmarks/mosaic.py`` (a virtualenv of its own).
    (``case_hf(builder="webdataset")`` reads the tar shards with HF's webdataset builder; it is
    left out of the suite for time: about 0.6x plain webdataset.)
large samples
    ~1 MiB samples from local shards: MB/s against ``cat`` of the same files to /dev/null;
    members as ``bytes`` (the default) and as uint8 tensors (``bytes_as="tensor"``).
s3
    The same large samples on a moto server on 127.0.0.1: wdstream with each opener (and the
    default one with ``bytes_as="tensor"``) against a bare
    boto3 ``get_object`` + ``iter_chunks`` loop over the same shards; time to first batch.
memory
    Peak resident memory of the whole process tree while streaming ~1 GB and ~4 GB (quick:
    125 MB and 500 MB); wdstream against webdataset.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from . import common
from .common import Skip, consume, quiet_logs, ratio

TITLE = "Reading throughput"
WORKERS = 2
BATCH = 32
MiB = 1 << 20

FULL = {"small_samples": 100_000, "small_per_shard": 1000, "big_per_shard": 64,
        "s3_samples": 768, "s3_long_samples": 6144, "rss_small_gb": 1, "rss_large_gb": 4}
QUICK = {"small_samples": 8_000, "small_per_shard": 250, "big_per_shard": 16,
         "s3_samples": 64, "s3_long_samples": 512, "rss_small_gb": 0.125, "rss_large_gb": 0.5}

# Why a peer is absent: found by `pip install --dry-run PEER torch==2.13.0` on this machine.
NOT_INSTALLABLE = {
    "litdata": "pip pulls torchvision 0.28.0, a CUDA build that fails to import beside the CPU "
               "torch 2.13.0 ('operator torchvision::nms does not exist'); measurable when "
               "installed with --no-deps into a folder named by WDSTREAM_BENCH_SITE",
    "streaming": "mosaicml-streaming 0.13.0 pins numpy<2.2 (would downgrade numpy 2.4 to 2.1.3), "
                 "transformers<5 and pulls the CUDA torchvision 0.28.0; measured on the same "
                 "records in a virtualenv of its own by the mosaic benchmark",
}


# =========================================================================== cases (child side)


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process and of its children that ended (DataLoader workers once
    the loader is exhausted)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _consume_timed(loader, started: float, expected: int | None, touch: bool = False,
                   cpu_at_first: bool = False) -> dict:
    """``consume`` with the CPU time of the main process and of the workers per sample, and
    the 1-minute load average at the end."""
    main, workers = _cpu()
    result = consume(loader, started, expected, touch=touch, cpu_at_first=cpu_at_first)
    main_after, workers_after = _cpu()
    if result.get("samples"):
        result["main_cpu_us"] = (main_after - main) / result["samples"] * 1e6
        result["worker_cpu_us"] = (workers_after - workers) / result["samples"] * 1e6
    result["load_end"] = os.getloadavg()[0]
    return result


def case_wdstream(source: str, decode: bool = True, expected: int | None = None,
                  opener: str = "auto", workers: int = WORKERS, batch: int | None = BATCH,
                  shuffle: bool = False, bytes_as: str = "bytes", touch: bool = False,
                  cpu_at_first: bool = False) -> dict:
    quiet_logs()
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - import torch before the clock starts
    import wdstream.stream.load.loader  # noqa: F401

    if source.startswith("s3://"):
        import botocore.session  # noqa: F401 - as the boto3 case imports boto3 before its clock

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, shuffle=shuffle, decode=decode, opener=opener)
    loader = wdstream.DataLoader(dataset, batch_size=batch, num_workers=workers,
                                 bytes_as=bytes_as)
    return _consume_timed(loader, started, expected, touch=touch, cpu_at_first=cpu_at_first)


def case_wdstream_inprocess(source: str, expected: int | None = None) -> dict:
    """The reader alone: the dataset iterated in this process, no DataLoader."""
    quiet_logs()
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - import torch before the clock starts

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, shuffle=False, decode=False)
    items, first = 0, None
    for _sample in dataset:
        if first is None:
            first = time.perf_counter()
        items += 1
    seconds = time.perf_counter() - started
    if expected is not None and items != expected:
        raise RuntimeError(f"read {items} samples, expected {expected}")
    return {"samples": items, "seconds": seconds, "ttfb_s": first - started}


def case_webdataset(urls: list[str], decode: bool = True, expected: int | None = None) -> dict:
    quiet_logs()
    import torch.utils.data
    import webdataset as wds

    started = common.start_clock()
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if decode:
        dataset = dataset.decode()
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return _consume_timed(loader, started, expected)


def case_hf(files: list[str], builder: str, expected: int | None = None) -> dict:
    """Hugging Face datasets streaming: ``builder`` "json" (JSONL parsed), "text" (raw lines),
    or "webdataset" (the tar shards, JSON decoded)."""
    quiet_logs()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError as error:
        raise Skip(f"datasets not installed ({error})") from None
    import torch.utils.data

    datasets.disable_progress_bars()
    started = common.start_clock()
    dataset = datasets.load_dataset(builder, data_files={"train": files}, split="train",
                                    streaming=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return _consume_timed(loader, started, expected)


def _litdata_record(path: str):
    """LitData ``optimize`` input function: one dict per tar member (module level: picklable)."""
    from wdstream.shards.tar_reader import iter_members

    with open(path, "rb") as file:
        for name, payload in iter_members(file, path):
            yield {"key": name.split(".", 1)[0], "json": payload}


def prepare_shardwriter(shards: list[str], output: str, per_shard: int) -> dict:
    """The same samples written again by webdataset's ``ShardWriter`` (its tar headers: a PAX
    header per member), with a manifest from ``wdstream.shards.index_shards`` (not timed)."""
    import webdataset as wds

    from wdstream.shards.index_shards import index_shards
    from wdstream.shards.manifest import MANIFEST_NAME
    from wdstream.shards.samples import iter_samples
    from wdstream.shards.tar_reader import iter_members

    started = common.start_clock()
    os.makedirs(output, exist_ok=True)
    with wds.ShardWriter(os.path.join(output, "shard-%06d.tar"), maxcount=per_shard,
                         verbose=0) as writer:
        for path in shards:
            with open(path, "rb") as file:
                for sample in iter_samples(iter_members(file, path), path):
                    writer.write({k: v for k, v in sample.items() if k != "__url__"})
    names = sorted(str(p) for p in Path(output).glob("shard-*.tar"))
    manifest = index_shards(names, base=output, workers=2)
    Path(output, MANIFEST_NAME).write_text(manifest.to_json())
    os.sync()
    return {"seconds": time.perf_counter() - started, "shards": names,
            "bytes": sum(os.path.getsize(name) for name in names)}


def prepare_litdata(shards: list[str], output: str) -> dict:
    """Convert the tar shards to LitData's chunk format once (not timed in the benchmark)."""
    quiet_logs()
    try:
        import litdata
    except ImportError as error:
        raise Skip(f"litdata not installed ({error})") from None
    started = common.start_clock()
    litdata.optimize(fn=_litdata_record, inputs=shards, output_dir=output, chunk_bytes="64MB",
                     num_workers=2, mode="overwrite")
    return {"seconds": time.perf_counter() - started}


def case_litdata(directory: str, decode: bool = True, expected: int | None = None) -> dict:
    quiet_logs()
    try:
        import litdata
    except ImportError as error:
        raise Skip(f"litdata not installed ({error})") from None
    import json

    import torch.utils.data  # noqa: F401 - before the clock, as for every case

    class JsonDataset(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            if decode:
                item["json"] = json.loads(item["json"])
            return item

    started = common.start_clock()
    dataset = JsonDataset(directory, shuffle=False, drop_last=False)
    loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return _consume_timed(loader, started, expected)


def _synthetic(samples: int, record_bytes: int):
    """An iterable of ``samples`` ready-made samples of the small-records shape (a key and a
    parsed JSON record of about ``record_bytes``), split across DataLoader workers: no I/O and
    no decoding, so a DataLoader over it costs only what torch's own transfer costs."""

    import torch.utils.data

    class Synthetic(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            first, step = (info.id, info.num_workers) if info is not None else (0, 1)
            text = "x" * (record_bytes - 40)
            for index in range(first, samples, step):
                yield {"__key__": f"{index:010d}",
                       "json": {"id": index, "source": "bench", "text": text}}

    return Synthetic()


def _columns(samples: list[dict]) -> dict[str, list]:
    """A batch as wdstream's default collate gives these samples: a list per key."""
    return {key: [sample[key] for sample in samples] for key in samples[0]}


def case_floor(expected: int, record_bytes: int = 1000) -> dict:
    """The DataLoader's floor: torch's DataLoader (2 workers, batch 32) over ready-made
    samples of the small records' shape, each batch the lists wdstream's collate gives them:
    what moving these batches from the workers costs, with nothing read or decoded."""
    quiet_logs()
    import torch.utils.data

    started = common.start_clock()
    loader = torch.utils.data.DataLoader(_synthetic(expected, record_bytes), batch_size=BATCH,
                                         num_workers=WORKERS, collate_fn=_columns)
    return _consume_timed(loader, started, expected)


def case_cat(files: list[str]) -> dict:
    started = common.start_clock()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    return {"seconds": time.perf_counter() - started, "samples": None}


def case_boto3(bucket: str, keys: list[str]) -> dict:
    """A bare streaming loop: ``get_object`` and ``iter_chunks(1 MiB)``, one shard after the
    other, one process."""
    import boto3

    started = common.start_clock()  # the client's set-up counts, as the dataset's does
    client = boto3.client("s3")
    first = None
    total = 0
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in body.iter_chunks(MiB):
            if first is None:
                first = time.perf_counter()
            total += len(chunk)
    return {"seconds": time.perf_counter() - started, "bytes_read": total,
            "ttfb_s": first - started}


def case_webdataset_s3(urls: list[str], expected: int | None = None) -> dict:
    """webdataset's own way to read S3: ``pipe:aws s3 cp URL -`` per shard."""
    return case_webdataset([f"pipe:aws s3 cp --only-show-errors {url} -" for url in urls],
                           decode=False, expected=expected)


# =========================================================================== the suite (parent)

# the small records' cases and the shuffle goal's pair run 2 * runs - 1 times (5 by default)
SMALL_RUNS_FACTOR = 2
T_SMALL = "small records: ~1 KiB JSON samples, local shards, 2 workers, batch 32"
T_LARGE = "large samples: ~1 MiB samples, local shards"
T_MEMORY = "memory: peak RSS of the whole process tree (main + 2 workers)"
T_S3 = "S3 on 127.0.0.1 (data plane: see the note): ~1 MiB samples, 2 workers, batch 32"
T_GOALS = "goals"
DEFAULTS = "wdstream, every default (shuffle on, JSON parsed), ShardWriter's shards"
DEFAULTS_OWN = "wdstream, every default, wdstream's shards"
FLOOR = "the DataLoader's floor: torch's DataLoader over ready-made samples"
TENSOR = 'wdstream, bytes_as="tensor" (views of the mapped shards: no copy)'
TOUCHED = "wdstream, pages touched"
TENSOR_TOUCHED = 'wdstream, bytes_as="tensor", pages touched'
SHUFFLED = "wdstream, shuffle on (the default)"
SHUFFLED_TOUCHED = "wdstream, shuffle on, pages touched"
# the shuffle's cost over the 4x larger dataset: the smaller one reads in about 0.3 s, where
# worker start-up and the first windows weigh as much as the shuffle
TOUCHED_LARGE = "wdstream, pages touched, 4x the data"
SHUFFLED_TOUCHED_LARGE = "wdstream, shuffle on, pages touched, 4x the data"
S3_TENSOR = 'wdstream, opener "sdk", bytes_as="tensor"'


def _rate(result: dict, key: str = "samples"):
    value = result.get(key)
    seconds = result.get("seconds")
    if value is None or not seconds:
        return None
    return value / seconds


def _mbps(result: dict, nbytes: int):
    seconds = result.get("seconds")
    return nbytes / common.MB / seconds if seconds and "error" not in result else None


def _mbps_rows(table: str, results: dict, names, nbytes: int, against: str, base) -> list[dict]:
    """One row per reader: MB/s, its ratio to ``base`` (column ``against``), first batch,
    peak RSS."""
    rows = []
    for name in names:
        result = results[name]
        mbps = _mbps(result, nbytes)
        rows.append({"table": table, "reader": name, "MB/s": mbps, against: ratio(mbps, base),
                     "first batch s": result.get("ttfb_s"),
                     "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                     "error": result.get("error")})
    return rows


def _note(table: str, text: str) -> dict:
    return {"table": table, "note": text}


def goal(name: str, measured, target: float, higher_is_better: bool = True,
         table: str = T_GOALS) -> dict:
    if measured is None:
        met = "n/a"
    else:
        met = "yes" if (measured >= target if higher_is_better else measured <= target) else "no"
    return {"table": table, "goal": name, "measured": measured,
            "target": f"{'≥' if higher_is_better else '≤'} {target:g}", "met": met}


def _small(root: Path, sizes: dict) -> tuple[list[dict], dict]:
    samples = sizes["small_samples"]
    common.log(f"read: writing {samples:,} ~1 KiB JSON samples")
    data = common.json_dataset(root / "small", samples, sizes["small_per_shard"])
    lit_dir = str(root / "small-litdata")
    written = common.run_case(f"{__name__}:prepare_shardwriter",
                              {"shards": data["shards"], "output": str(root / "small-sw"),
                               "per_shard": sizes["small_per_shard"]})
    if "error" in written:
        raise RuntimeError(f"ShardWriter copy: {written['error']}")
    prepared = common.run_case(f"{__name__}:prepare_litdata",
                               {"shards": written["shards"], "output": lit_dir})
    here = f"{__name__}:"
    sw_dir = str(root / "small-sw")
    cases = {
        ("wdstream", "json"): (here + "case_wdstream", {"source": data["dir"], "decode": True}),
        ("wdstream", "none"): (here + "case_wdstream", {"source": data["dir"], "decode": False}),
        (DEFAULTS, "json"): (here + "case_wdstream", {"source": sw_dir, "decode": True,
                                                      "shuffle": True}),
        (DEFAULTS_OWN, "json"): (here + "case_wdstream", {"source": data["dir"],
                                                          "decode": True, "shuffle": True}),
        ("webdataset", "json"): (here + "case_webdataset",
                                 {"urls": data["shards"], "decode": True}),
        ("webdataset", "none"): (here + "case_webdataset",
                                 {"urls": data["shards"], "decode": False}),
        ("HF datasets, JSONL", "json"): (here + "case_hf",
                                         {"files": data["jsonl"], "builder": "json"}),
        ("HF datasets, JSONL as text", "none"): (here + "case_hf",
                                                 {"files": data["jsonl"], "builder": "text"}),
    }
    cases[(FLOOR, "json")] = (here + "case_floor", {})
    if "error" not in prepared:
        cases[("LitData", "json")] = (here + "case_litdata", {"directory": lit_dir,
                                                              "decode": True})
        cases[("LitData", "none")] = (here + "case_litdata", {"directory": lit_dir,
                                                              "decode": False})
    for spec in cases.values():
        spec[1]["expected"] = samples
    # these cases take a second or two each, and a single run of one moves most: more runs
    results = common.repeat({f"{k[0]} / {k[1]}": v for k, v in cases.items()},
                            runs=SMALL_RUNS_FACTOR * common.RUNS - 1, progress=common.log)
    by_key = {key: results[f"{key[0]} / {key[1]}"] for key in cases}
    rows, summary = [], {}
    summary["defaults_vs_litdata_raw"] = ratio(_rate(by_key[(DEFAULTS, "json")]),
                                               _rate(by_key.get(("LitData", "none"), {})))
    summary["defaults_vs_floor"] = ratio(_rate(by_key[(DEFAULTS, "json")]),
                                         _rate(by_key[(FLOOR, "json")]))
    for decode in ("json", "none"):
        peers = {key: r for key, r in by_key.items()
                 if key[1] == decode and not key[0].startswith("wdstream") and key[0] != FLOOR}
        best_key = max((k for k in peers if _rate(peers[k])), key=lambda k: _rate(peers[k]),
                       default=None)
        best = _rate(peers[best_key]) if best_key else None
        webdataset = _rate(by_key[("webdataset", decode)])
        ours = _rate(by_key[("wdstream", decode)])
        summary[decode] = {"vs_webdataset": ratio(ours, webdataset), "vs_best": ratio(ours, best),
                           "best": best_key[0] if best_key else None}
        for key, result in by_key.items():
            if key[1] != decode:
                continue
            rate = _rate(result)
            rows.append({
                "table": T_SMALL, "loader": key[0],
                "decode": "JSON parsed" if decode == "json" else "none (raw bytes/lines)",
                "samples/s": rate, "MB/s": (rate * data["bytes"] / samples / common.MB)
                if rate else None,
                "first batch s": result.get("ttfb_s"), "peak RSS MB": result.get("peak_rss_mb"),
                "CPU µs/sample: workers": result.get("worker_cpu_us"),
                "main": result.get("main_cpu_us"),
                "÷ webdataset": ratio(rate, webdataset),
                "÷ best peer": ratio(rate, best) if key[0].startswith("wdstream") else None,
                "runs": result.get("runs"), "error": result.get("error"),
            })
    rows.append(_note(T_SMALL, f"{samples:,} samples in {len(data['shards'])} shards "
                      f"({data['bytes'] / common.MB:.0f} MB of tar). Each library with its own "
                      "default collate; MB/s counts tar bytes. The same samples written again "
                      "by webdataset's ShardWriter (a PAX header per member: "
                      f"{written['bytes'] / common.MB:.0f} MB) for the 'every default' row and "
                      "LitData's conversion; the other wdstream, webdataset and HF rows read "
                      "wdstream's shards. The DataLoader's floor: torch's DataLoader with the "
                      "same workers and batch over samples made in memory (a key and the "
                      "record's parsed JSON), each batch the lists wdstream's default collate "
                      "gives: nothing read or decoded, only the DataLoader's own transfer. "
                      "LitData reads its own chunk format, converted once "
                      "before timing"
                      + (f" ({prepared['seconds']:.0f} s)." if "seconds" in prepared else ".")
                      + " CPU µs/sample: CPU time of all the DataLoader workers, and of the main "
                      "process while it iterates the loader (starting the "
                      "workers included), per sample; on a shared machine these vary less "
                      "than samples/s."))
    if "error" in prepared:
        rows.append(_note(T_SMALL, f"LitData: not measured: {prepared['error']}; "
                          f"{NOT_INSTALLABLE['litdata']}."))
    rows.append(_note(T_SMALL, f"Mosaic streaming: not in this table: "
                      f"{NOT_INSTALLABLE['streaming']}."))
    return rows, summary


def _large_and_memory(root: Path, sizes: dict) -> tuple[list[dict], dict]:
    per_shard = sizes["big_per_shard"]
    small_n = int(sizes["rss_small_gb"] * 1000 * common.MB / MiB) // per_shard * per_shard
    large_n = int(sizes["rss_large_gb"] * 1000 * common.MB / MiB) // per_shard * per_shard
    common.log(f"read: writing {large_n:,} samples of 1 MiB")
    big = common.blob_dataset(root / "big", large_n, per_shard, MiB)
    small = common.subset(big, small_n // per_shard, root / "big-subset")
    here = f"{__name__}:"
    cases = {
        "cat": (here + "case_cat", {"files": small["shards"]}),
        "wdstream": (here + "case_wdstream", {"source": small["dir"], "decode": False,
                                              "expected": small["samples"]}),
        TENSOR: (here + "case_wdstream", {"source": small["dir"], "decode": False,
                                          "bytes_as": "tensor", "expected": small["samples"]}),
        "wdstream, in-process reader (no DataLoader)": (
            here + "case_wdstream_inprocess", {"source": small["dir"],
                                               "expected": small["samples"]}),
        "webdataset": (here + "case_webdataset", {"urls": small["shards"], "decode": False,
                                                  "expected": small["samples"]}),
        TOUCHED: (here + "case_wdstream", {"source": small["dir"], "decode": False,
                                           "touch": True, "expected": small["samples"]}),
        TENSOR_TOUCHED: (here + "case_wdstream", {"source": small["dir"], "decode": False,
                                                  "bytes_as": "tensor", "touch": True,
                                                  "expected": small["samples"]}),
        SHUFFLED: (here + "case_wdstream", {"source": small["dir"], "decode": False,
                                            "shuffle": True, "expected": small["samples"]}),
        SHUFFLED_TOUCHED: (here + "case_wdstream", {"source": small["dir"], "decode": False,
                                                    "shuffle": True, "touch": True,
                                                    "expected": small["samples"]}),
        "wdstream, large": (here + "case_wdstream", {"source": big["dir"], "decode": False,
                                                     "expected": big["samples"]}),
        TOUCHED_LARGE: (here + "case_wdstream", {"source": big["dir"], "decode": False,
                                                 "touch": True, "expected": big["samples"]}),
        SHUFFLED_TOUCHED_LARGE: (here + "case_wdstream", {
            "source": big["dir"], "decode": False, "shuffle": True, "touch": True,
            "expected": big["samples"]}),
        "webdataset, large": (here + "case_webdataset", {"urls": big["shards"], "decode": False,
                                                         "expected": big["samples"]}),
    }
    # the shuffle goal's two cases take about a second each and spread by ±15% from run to
    # run: more runs for them, as for the small records
    goal_cases = {name: cases.pop(name) for name in (TOUCHED_LARGE, SHUFFLED_TOUCHED_LARGE)}
    results = common.repeat(cases, progress=common.log, pss=True)  # the memory table's PSS
    results.update(common.repeat(goal_cases, runs=SMALL_RUNS_FACTOR * common.RUNS - 1,
                                 progress=common.log))
    cat = _mbps(results["cat"], small["bytes"])
    rows = _mbps_rows(T_LARGE, results, ("cat", "wdstream", TOUCHED, TENSOR, TENSOR_TOUCHED,
                                         SHUFFLED, SHUFFLED_TOUCHED,
                                         "wdstream, in-process reader (no DataLoader)",
                                         "webdataset"), small["bytes"], "÷ cat", cat)
    rows += _mbps_rows(T_LARGE, results, (TOUCHED_LARGE, SHUFFLED_TOUCHED_LARGE), big["bytes"],
                       "÷ cat", cat)
    rows.append(_note(T_LARGE, f"{small['samples']:,} samples of 1 MiB in {len(small['shards'])} "
                      f"shards, {small['bytes'] / common.MB:,.0f} MB, from the page cache; "
                      "2 workers and batch 32 for the DataLoader rows. Shuffle off unless said; "
                      "'pages touched': the consumer reads one byte of every 4 KiB page of each "
                      "batch (the other rows do not look at the data). Shuffle on uses the "
                      "default window (1000 samples, bounded by shuffle_bytes=256 MiB: 255 "
                      f"samples of 1 MiB). '4x the data': {big['samples']:,} samples, "
                      f"{big['bytes'] / common.MB:,.0f} MB, read once through (its ÷ cat is "
                      "against the smaller read's cat); the shuffle's goal compares these two, "
                      "which run 2 × runs − 1 times, interleaved with each other."))
    summary = {"vs_cat": ratio(_mbps(results["wdstream"], small["bytes"]), cat),
               "tensor_vs_cat": ratio(_mbps(results[TENSOR], small["bytes"]), cat),
               "touched_vs_cat": ratio(_mbps(results[TOUCHED], small["bytes"]), cat),
               "tensor_touched_vs_cat": ratio(_mbps(results[TENSOR_TOUCHED], small["bytes"]),
                                              cat),
               "shuffle_on_vs_off": ratio(_mbps(results[SHUFFLED_TOUCHED_LARGE], big["bytes"]),
                                          _mbps(results[TOUCHED_LARGE], big["bytes"]))}
    runs = {("wdstream", 1): (results["wdstream"], small),
            ("wdstream", 4): (results["wdstream, large"], big),
            ("webdataset", 1): (results["webdataset"], small),
            ("webdataset", 4): (results["webdataset, large"], big)}
    peaks = {key: result.get("peak_rss_mb") for key, (result, _data) in runs.items()}
    for (loader, size), (result, data) in runs.items():
        rows.append({"table": T_MEMORY, "loader": loader, "streamed GB": data["bytes"] / 1e9,
                     "peak RSS MB": result.get("peak_rss_mb"),
                     "peak PSS MB": result.get("peak_pss_mb"),
                     "MB/s": _mbps(result, data["bytes"]),
                     "÷ smaller run": ratio(peaks[(loader, 4)], peaks[(loader, 1)])
                     if size == 4 else None,
                     "÷ webdataset": ratio(peaks[(loader, size)], peaks[("webdataset", size)])
                     if loader == "wdstream" else None,
                     "runs": result.get("runs"), "error": result.get("error")})
    rows.append(_note(T_MEMORY, "Sum of the RSS of the case's process and its DataLoader workers, "
                      "sampled every 50 ms (PSS counts pages shared between them once). "
                      "Same 1 MiB-sample shards, no shuffle."))
    summary["rss_growth"] = ratio(peaks[("wdstream", 4)], peaks[("wdstream", 1)])
    summary["rss_vs_webdataset"] = ratio(peaks[("wdstream", 4)], peaks[("webdataset", 4)])
    summary["pss_vs_webdataset"] = ratio(runs[("wdstream", 4)][0].get("peak_pss_mb"),
                                         runs[("webdataset", 4)][0].get("peak_pss_mb"))
    return rows, summary


def _s3(root: Path, sizes: dict) -> tuple[list[dict], dict]:
    from .data_plane import missing

    samples = sizes["s3_samples"]
    data = common.blob_dataset(root / "s3", samples, samples // 4, MiB)  # 4 shards, 2 workers
    # the long read's shards are served by nginx alone: moto holds no copy of them, which on
    # this machine would take about twice their bytes of its memory
    no_plane = missing(delays=False)
    long = None if no_plane else common.blob_dataset(
        root / "s3-long", sizes["s3_long_samples"], sizes["s3_long_samples"] // 32, MiB)
    here = f"{__name__}:"
    rows = []
    # moto keeping each value whole: a ranged GET costs it its range, as it costs S3 (stock
    # moto reads the whole object for each one, which ranged readers pay many times over)
    with common.LocalS3(whole_once=True) as s3, \
            _s3_plane(data["dir"], root, s3, no_plane, long["dir"] if long else None) as env:
        common.log(f"read: uploading {data['bytes'] / common.MB:,.0f} MB to moto")
        url = s3.upload(data["dir"], "bench", "big")
        keys = [f"big/{Path(p).name}" for p in data["shards"]]
        urls = [f"s3://bench/{k}" for k in keys]
        cases = {
            "boto3 get_object + iter_chunks loop (1 process)": (
                here + "case_boto3", {"bucket": "bench", "keys": keys}, env),
            'wdstream, opener "sdk" (default)': (
                here + "case_wdstream", {"source": url, "opener": "sdk", "decode": False,
                                         "expected": samples}, env),
            S3_TENSOR: (
                here + "case_wdstream", {"source": url, "opener": "sdk", "decode": False,
                                         "bytes_as": "tensor", "expected": samples}, env),
            'wdstream, opener "fsspec"': (
                here + "case_wdstream", {"source": url, "opener": "fsspec", "decode": False,
                                         "expected": samples}, env),
            'wdstream, opener "cli" (aws s3 cp)': (
                here + "case_wdstream", {"source": url, "opener": "cli", "decode": False,
                                         "expected": samples}, env),
            "webdataset, pipe:aws s3 cp": (
                here + "case_webdataset_s3", {"urls": urls, "expected": samples}, env),
        }
        results = common.repeat(cases, progress=common.log)
        plane = "moto itself" if env is s3.env else "nginx in front of moto (data_plane.py)"
        long_results = None if long is None else _s3_long(long, env)
    names = list(cases)
    base = _mbps(results[names[0]], data["bytes"])
    rows += _mbps_rows(T_S3, results, names, data["bytes"], "÷ boto3", base)
    steady = _steady_columns(rows[1:], results, data["bytes"], base)
    long_vs_boto3 = None
    if long_results is not None:
        long_rows, long_vs_boto3 = _s3_long_rows(long, long_results)
        rows += long_rows
    rows.append(_note(T_S3, f"{samples} samples of 1 MiB in {len(keys)} shards "
                      f"({data['bytes'] / common.MB:,.0f} MB). Times run from creating the "
                      "dataset (or the boto3 client) to the last byte, so client set-up and the "
                      f"manifest fetch count. Data plane: {plane}. nginx serves the shards' GETs "
                      "and HEADs from files, at almost no CPU per byte, where it is installed "
                      "(as in the link suite); without it moto serves every byte, on the same "
                      "2 cores as the readers, and these ratios are mostly moto's. moto keeps "
                      "each object's value whole, so that a ranged GET it serves costs it its "
                      "range, as on S3." + _long_note(long)))
    summary = {
        "vs_boto3": ratio(_mbps(results[names[1]], data["bytes"]), base),
        "ttfb": results[names[1]].get("ttfb_s"),
        "tensor_vs_boto3": ratio(_mbps(results[S3_TENSOR], data["bytes"]), base),
        "steady_vs_boto3": ratio(steady[names[1]], base),
        "peer_ttfb": results["webdataset, pipe:aws s3 cp"].get("ttfb_s"),
        "long_vs_boto3": long_vs_boto3,
    }
    return rows, summary


S3_LONG = ("boto3 get_object + iter_chunks loop (1 process), 8x the data",
           'wdstream, opener "sdk" (default), 8x the data')


def _s3_long(long: dict, env: dict) -> dict:
    """The boto3 loop and the default loader over the long read (``bench/long``)."""
    keys = [f"long/{Path(p).name}" for p in long["shards"]]
    cases = {S3_LONG[0]: (f"{__name__}:case_boto3", {"bucket": "bench", "keys": keys}, env),
             S3_LONG[1]: (f"{__name__}:case_wdstream", {
                 "source": "s3://bench/long/", "opener": "sdk", "decode": False,
                 "expected": long["samples"]}, env)}
    return common.repeat(cases, progress=common.log)


def _long_note(long: dict | None) -> str:
    if long is None:
        return " Without nginx, the long read ('8x the data') is left out."
    return (f" '8x the data': {long['samples']:,} samples of 1 MiB in {len(long['shards'])} "
            f"shards ({long['bytes'] / common.MB:,.0f} MB) that nginx alone serves (moto "
            "holds no copy: it would take about twice their bytes of its memory), read after "
            "the other cases: a read long enough for the loader's start to weigh little.")


def _s3_long_rows(long: dict, results: dict) -> tuple[list[dict], float | None]:
    """The long read's rows of the S3 table, and the loader's MB/s ÷ the boto3 loop's."""
    base = _mbps(results[S3_LONG[0]], long["bytes"])
    rows = _mbps_rows(T_S3, results, S3_LONG, long["bytes"], "÷ boto3", base)
    _steady_columns(rows[1:], results, long["bytes"], base)
    return rows, rows[1]["÷ boto3"]


def _steady_columns(rows: list[dict], results: dict, nbytes: int, base) -> dict:
    """The DataLoader rows' MB/s from their first batch on (a boto3 loop has no start), and
    that ÷ ``base``, added to each row; returned by reader."""
    steady = {}
    for row in rows:
        steady[row["reader"]] = row["MB/s after first batch"] = common.steady_mbps(
            results[row["reader"]], nbytes, BATCH)
        row["after first batch ÷ boto3"] = ratio(steady[row["reader"]], base)
    return steady


@contextlib.contextmanager
def _s3_plane(folder: Path, root: Path, s3, why: str | None, long: str | None = None):
    """The environment the S3 cases read with: nginx serving ``folder`` as ``bench/big`` (and
    ``long``, if given, as ``bench/long``) in front of moto (``data_plane.NginxPlane``,
    unshaped), or moto itself where nginx cannot run (``why``, ``data_plane.missing``'s
    answer, which the log gives)."""
    from .data_plane import NginxPlane

    if why is not None:
        common.log(f"read: {why}: the S3 cases read from moto itself")
        yield s3.env
        return
    plane = NginxPlane(root / "plane", s3.port)
    plane.mirror(folder, "bench", "big")
    if long is not None:
        plane.mirror(long, "bench", "long")
    with plane:
        yield dict(s3.env, AWS_ENDPOINT_URL=plane.endpoint("s3", None))


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    with common.scratch() as root:
        small_rows, small = _small(root, sizes)
        large_rows, large = _large_and_memory(root, sizes)
        s3_rows, s3 = _s3(root, sizes)
    goals = [
        goal("small records, JSON parsed: wdstream ÷ webdataset",
             small["json"]["vs_webdataset"], 1.0),
        goal("small records, no decoding: wdstream ÷ webdataset",
             small["none"]["vs_webdataset"], 1.0),
        goal(f"small records, no decoding: wdstream ÷ best peer ({small['none']['best']})",
             small["none"]["vs_best"], 2.0),
        goal(f"small records, JSON parsed: wdstream ÷ best peer ({small['json']['best']})",
             small["json"]["vs_best"], 1.5),
        # goals met the way the docs give for large samples (bytes_as="tensor");
        # the same targets for members delivered as bytes (the default) are tracked beside them
        goal("small records, every default (shuffle on, JSON parsed) ÷ LitData not decoding",
             small["defaults_vs_litdata_raw"], 1.5),
        goal("small records, every default (shuffle on, JSON parsed) ÷ the DataLoader's floor",
             small["defaults_vs_floor"], 0.95),
        goal('1 MiB samples, bytes_as="tensor": wdstream MB/s ÷ cat',
             large["tensor_vs_cat"], 0.5),
        goal("1 MiB samples as bytes (default): wdstream MB/s ÷ cat", large["vs_cat"], 0.5),
        goal("1 MiB samples, pages touched: wdstream MB/s ÷ cat", large["touched_vs_cat"], 0.5),
        goal('1 MiB samples, bytes_as="tensor", pages touched: MB/s ÷ cat',
             large["tensor_touched_vs_cat"], 0.5),
        goal("1 MiB samples, pages touched: shuffle on ÷ shuffle off, 4x the data",
             large["shuffle_on_vs_off"], 0.9),
        goal('S3: opener "sdk" (default), bytes_as="tensor": MB/s ÷ boto3 loop',
             s3["tensor_vs_boto3"], 0.8),
        goal('S3: opener "sdk" (default), as bytes (default): MB/s ÷ boto3 loop', s3["vs_boto3"],
             0.8),
        goal('S3: opener "sdk" (default), as bytes, after its first batch: MB/s ÷ boto3 loop',
             s3["steady_vs_boto3"], 0.8),
        goal('S3: opener "sdk" (default), as bytes, 8x the data (nginx alone): MB/s ÷ boto3 '
             "loop", s3["long_vs_boto3"], 0.8),
        goal("S3: first batch, wdstream ÷ webdataset (pipe:aws)",
             ratio(s3["ttfb"], s3["peer_ttfb"]), 1.0, higher_is_better=False),
        goal("peak RSS: 4× the data ÷ 1× (wdstream)", large["rss_growth"], 1.1,
             higher_is_better=False),
        goal("peak RSS: wdstream ÷ webdataset (same run)", large["rss_vs_webdataset"], 1.0,
             higher_is_better=False),
        goal("peak PSS (shared pages counted once): wdstream ÷ webdataset (same run)",
             large["pss_vs_webdataset"], 1.0, higher_is_better=False),
    ]
    return goals + small_rows + large_rows + s3_rows
