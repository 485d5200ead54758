"""Packing throughput: ``wdstream.pack`` against a bare loop over ``webdataset.ShardWriter``, and
``workers=2`` against ``workers=1``.

Input: generated JSON Lines of ~1 KiB records (200 MB; quick: 20 MB), read from the page cache.
Both packers cut shards every 10,000 records (quick: 2,000). The ShardWriter loop is what a user would write:
each line, as bytes, becomes a ``.json`` member (no parsing); wdstream also parses every line to
reject malformed JSON. Every case runs in a fresh process (the pool's start-up is included),
``common.RUNS`` runs interleaved, medians.

Shards are written to tmpfs (``/dev/shm``) when there is one, so that the figures measure
packing rather than the disk: on a disk that syncs at ~300 MB/s, writing ~400 MB of tar is
itself a floor of over a second. ``WDSTREAM_BENCH_PACK_OUT`` names another folder.

``python -m benchmarks.pack [--quick]`` runs it alone.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import common

TITLE = "Packing throughput"
ONE, TWO, PEER = "wdstream, 1 worker", "wdstream, 2 workers", "ShardWriter loop"
RECORD_BYTES = 1024
FULL = {"bytes": 200 * 1000**2, "per_shard": 10_000}
QUICK = {"bytes": 20 * 1000**2, "per_shard": 2_000}


# =========================================================================== cases (child side)


def case_wdstream(source: str, output: str, workers: int, per_shard: int) -> dict:
    from wdstream.pack.packer import pack

    started = time.perf_counter()
    manifest = pack([source], output, max_count=per_shard, workers=workers, overwrite=True)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "records": manifest.samples, "tar_bytes": manifest.bytes}


def case_shardwriter(source: str, output: str, per_shard: int) -> dict:
    import webdataset

    os.makedirs(output, exist_ok=True)
    started = time.perf_counter()
    records = 0
    with webdataset.ShardWriter(os.path.join(output, "shard-%06d.tar"), maxcount=per_shard,
                                maxsize=1e15, verbose=0) as sink, open(source, "rb") as lines:
        for records, line in enumerate(lines, 1):
            sink.write({"__key__": f"{records - 1:010d}", "json": line.rstrip(b"\n")})
    seconds = time.perf_counter() - started
    tar_bytes = sum(p.stat().st_size for p in Path(output).glob("*.tar"))
    return {"seconds": seconds, "records": records, "tar_bytes": tar_bytes}


# =========================================================================== parent side


def make_jsonl(path: Path, target_bytes: int) -> dict:
    """~1 KiB JSON records, deterministic, until ``target_bytes``."""
    rng = random.Random(3)
    words = ["stream", "shard", "token", "epoch", "sample", "model", "batch", "worker", "cloud",
             "bucket", "resume", "order", "plan", "window", "reader", "tensor", "value", "data"]
    written = records = 0
    with open(path, "w") as file:
        while written < target_bytes:
            record = {"id": records, "source": "bench", "tags": rng.sample(words, 3), "text": ""}
            room = RECORD_BYTES - 1 - len(json.dumps(record))
            text = " ".join(rng.choice(words) for _ in range(room // 5))
            record["text"] = text[:room].ljust(room, ".")
            line = json.dumps(record) + "\n"
            file.write(line)
            written += len(line)
            records += 1
    return {"records": records, "bytes": written}


def _output_parent() -> str | None:
    chosen = os.environ.get("WDSTREAM_BENCH_PACK_OUT")
    if chosen:
        return chosen
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def run(quick: bool) -> list[dict]:
    with common.scratch("wdstream-bench-pack-") as folder:
        source = folder / "records.jsonl"
        sizes = QUICK if quick else FULL
        data = make_jsonl(source, sizes["bytes"])
        outputs = Path(tempfile.mkdtemp(prefix="wdstream-bench-pack-out-", dir=_output_parent()))

        def args(name: str, **extra) -> dict:
            return {"source": str(source), "output": str(outputs / name),
                    "per_shard": sizes["per_shard"], **extra}

        try:
            cases = {
                ONE: ("benchmarks.pack:case_wdstream", args("one", workers=1)),
                TWO: ("benchmarks.pack:case_wdstream", args("two", workers=2)),
                PEER: ("benchmarks.pack:case_shardwriter", args("peer")),
            }
            results = common.repeat(cases)
        finally:
            shutil.rmtree(outputs, ignore_errors=True)

    rows = []
    for name, result in results.items():
        row = {"case": name, "records": data["records"], "input_mb": data["bytes"] / common.MB}
        if "error" in result:
            rows.append({**row, "error": result["error"]})
            continue
        if result["records"] != data["records"]:
            rows.append({**row, "error": f"packed {result['records']} records"})
            continue
        seconds = result["seconds"]
        rows.append({**row, "seconds": seconds, "mb_per_s": data["bytes"] / common.MB / seconds,
                     "records_per_s": data["records"] / seconds,
                     "tar_mb": result["tar_bytes"] / common.MB,
                     "peak_rss_mb": result.get("peak_rss_mb")})
    by_name = {row["case"]: row for row in rows}

    def speedup(label: str, faster: str, slower: str, goal: float) -> dict:
        value = common.ratio(by_name[slower].get("seconds"), by_name[faster].get("seconds"))
        return {"case": label, "ratio": value, "goal": goal,
                "met": value is not None and value >= goal}

    rows.append(speedup("1 worker / ShardWriter", ONE, PEER, 1.0))
    rows.append(speedup("2 workers / 1 worker", TWO, ONE, 1.6))
    return rows


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=TITLE)
    for column in ("case", "MB/s", "records/s", "seconds", "tar MB", "peak RSS MB", "ratio",
                   "goal"):
        table.add_column(column, justify="left" if column == "case" else "right")

    def number(value, digits=1):
        return "" if value is None else f"{value:,.{digits}f}"

    for row in rows:
        if "error" in row:
            table.add_row(row["case"], f"error: {row['error']}", *[""] * 6)
        elif "ratio" in row:
            verdict = "" if row["ratio"] is None else (" ok" if row["met"] else " missed")
            table.add_row(row["case"], "", "", "", "", "", number(row["ratio"], 2),
                          f"≥ {row['goal']}{verdict}")
        else:
            table.add_row(row["case"], number(row["mb_per_s"]), number(row["records_per_s"], 0),
                          number(row["seconds"], 2), number(row["tar_mb"]),
                          number(row.get("peak_rss_mb"), 0), "", "")
    Console(width=max(Console().width, 110)).print(table)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    print_table(run(quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
