"""Packing throughput: ``wdstream.pack`` against a bare loop over ``webdataset.ShardWriter``, and
``workers=2`` against ``workers=1``; packing from S3 to S3 against local disk to local disk, and
peak memory for 200 MB and 1 GB of input.

Input: generated JSON Lines of ~1 KiB records (200 MB; quick: 20 MB), read from the page cache.
Both packers cut shards every 10,000 records (quick: 2,000). The ShardWriter loop is what a user would write:
each line, as bytes, becomes a ``.json`` member (no parsing); wdstream also parses every line to
reject malformed JSON. Every case runs in a fresh process (the pool's start-up is included),
``common.RUNS`` runs interleaved, medians.

Shards are written to tmpfs (``/dev/shm``) when there is one, so that the figures measure
packing rather than the disk: on a disk that syncs at ~300 MB/s, writing ~400 MB of tar is
itself a floor of over a second. ``WDSTREAM_BENCH_PACK_OUT`` names another folder.

Cloud inputs: the same records as ``.jsonl.zst`` (200 MB uncompressed; quick: 20 MB) on a
moto server on 127.0.0.1, packed with 2 workers into the same server, against that file
packed from local disk to local disk (the tmpfs folder above). moto runs on the same cores, so
its own CPU time (receiving every shard, serving the input) is part of the S3 figure; the
"server CPU s" column is that time (the server process's, read from /proc). With
``WDSTREAM_BENCH_S3RVER`` naming the ``s3rver`` command (``npm install s3rver``: a Node.js S3
server), the S3 case also runs against it, to tell wdstream's cost from the server's (s3rver
takes about as much CPU time as moto for this load: both compute every shard's MD5 ETag). Peak RSS
(the packing process and its workers) of the S3 case for 200 MB and for 1 GB of input (the
200 MB file five times; quick: 20 and 100 MB) shows that memory does not grow with the input.

``python -m benchmarks.pack [--quick]`` runs it alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .read import goal

TITLE = "Packing throughput"
ONE, TWO, PEER = "wdstream, 1 worker", "wdstream, 2 workers", "ShardWriter loop"
RECORD_BYTES = 1024
FULL = {"bytes": 200 * 1000**2, "per_shard": 10_000, "times": 5}
QUICK = {"bytes": 20 * 1000**2, "per_shard": 2_000, "times": 5}
LOCAL_ZST, S3_ZST, S3_BIG = ("wdstream .zst local → local, 2 workers",
                             "wdstream .zst S3 → S3, 2 workers", "wdstream .zst S3 → S3, 5× input")
S3RVER_ZST = "wdstream .zst S3 → S3 (s3rver), 2 workers"
S3RVER_VARIABLE = "WDSTREAM_BENCH_S3RVER"


# =========================================================================== cases (child side)


def _cpu_seconds(who) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int | None) -> float | None:
    """CPU seconds a process (the S3 server) has used so far, from /proc; None if unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _forkserver_cpu() -> float:
    """CPU seconds of the pool workers started from multiprocessing's fork server (as they are
    when the packer has threads, e.g. after listing an S3 input): they are the server's
    children, not this process's, so RUSAGE_CHILDREN misses them; the server reaps them."""
    import multiprocessing.forkserver as forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def case_wdstream(source: str, output: str, workers: int, per_shard: int,
                  server_pid: int | None = None) -> dict:
    from wdstream.write.packer import pack

    server_cpu = _process_cpu(server_pid)
    started = common.start_clock()
    main_cpu, workers_cpu = _cpu_seconds(resource.RUSAGE_SELF), _cpu_seconds(resource.RUSAGE_CHILDREN)
    manifest = pack([source], output, max_count=per_shard, workers=workers, overwrite=True)
    seconds = time.perf_counter() - started
    main_cpu = _cpu_seconds(resource.RUSAGE_SELF) - main_cpu
    workers_cpu = _cpu_seconds(resource.RUSAGE_CHILDREN) - workers_cpu  # the pool, once joined
    time.sleep(0.2)  # for the fork server to reap the workers (outside the time measured)
    workers_cpu += _forkserver_cpu()
    result = {"seconds": seconds, "records": manifest.samples, "tar_bytes": manifest.bytes,
              "main_cpu_s": main_cpu, "cpu_s": main_cpu + workers_cpu}
    if server_cpu is not None:
        result["server_cpu_s"] = _process_cpu(server_pid) - server_cpu
    return result


def case_shardwriter(source: str, output: str, per_shard: int) -> dict:
    import webdataset

    os.makedirs(output, exist_ok=True)
    started = common.start_clock()
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


def make_zst(source: Path, path: Path, times: int = 1) -> int:
    """``source`` ``times`` over, zstd-compressed into ``path``; returns the uncompressed bytes."""
    import zstandard

    written = 0
    with open(path, "wb") as out, zstandard.ZstdCompressor(level=3).stream_writer(out) as sink:
        for _ in range(times):
            with open(source, "rb") as file:
                while block := file.read(8 << 20):
                    sink.write(block)
                    written += len(block)
    return written


class S3rver(common.LocalS3):
    """An s3rver (Node.js) S3 server on 127.0.0.1, storing under a temporary folder (on
    tmpfs when there is one); the same interface as ``common.LocalS3``."""

    def __init__(self, command: str):
        super().__init__()
        self.command = command
        self.env = {**self.env, "AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
        self._data = tempfile.mkdtemp(prefix="wdstream-bench-s3rver-", dir=_output_parent())

    def __enter__(self) -> S3rver:
        import socket
        import subprocess

        self.process = subprocess.Popen(
            [self.command, "-d", self._data, "-a", "127.0.0.1", "-p", str(self.port), "-s",
             "--allow-mismatched-signatures", "--no-vhost-buckets"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"s3rver exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("s3rver did not start") from None
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        shutil.rmtree(self._data, ignore_errors=True)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="S3RVER",
                            aws_secret_access_key="S3RVER", region_name="us-east-1")


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

        zst, big = folder / "records.jsonl.zst", folder / "big.jsonl.zst"
        make_zst(source, zst)
        big_bytes = make_zst(source, big, sizes["times"])
        try:
            with contextlib.ExitStack() as servers:
                s3 = servers.enter_context(common.LocalS3())
                s3rver_command = os.environ.get(S3RVER_VARIABLE)
                lighter = servers.enter_context(S3rver(s3rver_command)) if s3rver_command \
                    else None
                common.log("pack: uploading the .zst inputs to the S3 server(s)")
                for server in (s3, lighter) if lighter else (s3,):
                    client = server.client()
                    client.create_bucket(Bucket="bench")
                    client.upload_file(str(zst), "bench", "raw/records.jsonl.zst")
                s3.client().upload_file(str(big), "bench", "raw/big.jsonl.zst")  # moto only
                per_shard = sizes["per_shard"]
                cases = {
                    ONE: ("benchmarks.pack:case_wdstream", args("one", workers=1)),
                    TWO: ("benchmarks.pack:case_wdstream", args("two", workers=2)),
                    PEER: ("benchmarks.pack:case_shardwriter", args("peer")),
                    LOCAL_ZST: ("benchmarks.pack:case_wdstream",
                                {**args("zst", workers=2), "source": str(zst)}),
                    S3_ZST: ("benchmarks.pack:case_wdstream",
                             {"source": "s3://bench/raw/records.jsonl.zst",
                              "output": "s3://bench/out/", "workers": 2, "per_shard": per_shard,
                              "server_pid": s3.process.pid},
                             s3.env),
                    S3_BIG: ("benchmarks.pack:case_wdstream",
                             {"source": "s3://bench/raw/big.jsonl.zst",
                              "output": "s3://bench/big/", "workers": 2, "per_shard": per_shard,
                              "server_pid": s3.process.pid},
                             s3.env),
                }
                if lighter:
                    cases[S3RVER_ZST] = (
                        "benchmarks.pack:case_wdstream",
                        {"source": "s3://bench/raw/records.jsonl.zst", "output": "s3://bench/out/",
                         "workers": 2, "per_shard": per_shard, "server_pid": lighter.process.pid},
                        lighter.env)
                results = common.repeat(cases, progress=lambda text: common.log(f"pack: {text}"))
        finally:
            shutil.rmtree(outputs, ignore_errors=True)

    table = f"~1 KiB JSON records, {data['bytes'] / common.MB:.0f} MB, {data['records']:,} records"
    rows = []
    for name, result in results.items():
        row = {"table": table, "packer": name}
        expected = data["records"] * (sizes["times"] if name == S3_BIG else 1)
        if name == S3_BIG:
            row["table"] = (f"{big_bytes / common.MB:.0f} MB of the same records "
                            f"({expected:,}), for memory")
        if "error" in result or result["records"] != expected:
            rows.append({**row, "error": result.get("error") or f"packed {result['records']}"})
            continue
        seconds = result["seconds"]
        size = big_bytes if name == S3_BIG else data["bytes"]
        rows.append({**row, "MB/s": size / common.MB / seconds,
                     "records/s": expected / seconds, "seconds": seconds,
                     "CPU s": result.get("cpu_s"), "server CPU s": result.get("server_cpu_s"),
                     "tar MB": result["tar_bytes"] / common.MB,
                     "peak RSS MB": result.get("peak_rss_mb")})
    output = _output_parent() or "the system's temporary folder"
    rows.append({"table": table, "note": f"Shards written under {output}; input read from the "
                                         "page cache; wdstream also parses every line."})
    one, two = results[ONE], results[TWO]
    if "cpu_s" in one and "cpu_s" in two:
        # What 2 idle cores would give: the 2-worker run's CPU time spread over both cores,
        # unless its reading process alone takes longer. Wall-clock ratios need an idle machine.
        bound = max(two["cpu_s"] / 2, two["main_cpu_s"])
        rows.append({"table": table, "note": (
            f"CPU time: 1 worker {one['cpu_s']:.2f} s; 2 workers {two['cpu_s']:.2f} s in all, "
            f"{two['main_cpu_s']:.2f} s of it reading. On 2 idle cores that bounds the 2-worker "
            f"speed-up at {one['cpu_s'] / bound:.2f}x.")})

    def speed_goal(name: str, faster: str, slower: str, target: float) -> dict:
        return goal(name, common.ratio(results[slower].get("seconds"),
                                       results[faster].get("seconds")), target, table="Goals")

    big, small = results[S3_BIG].get("peak_rss_mb"), results[S3_ZST].get("peak_rss_mb")
    memory = common.ratio(big, small)
    # no S3 server here takes the shards without CPU of its own per byte on the packer's 2
    # cores (moto and s3rver both compute every shard's MD5): wdstream's own CPU compared too
    cpu = common.ratio(results[S3_ZST].get("cpu_s"), results[LOCAL_ZST].get("cpu_s"))
    lighter_goal = [speed_goal(".zst S3 → S3 ÷ local → local speed, 2 workers, on s3rver",
                               S3RVER_ZST, LOCAL_ZST, 0.8)] if S3RVER_ZST in results else []
    return [
        speed_goal("wdstream (1 worker) speed ÷ ShardWriter loop", ONE, PEER, 1.0),
        speed_goal("wdstream 2 workers ÷ 1 worker", TWO, ONE, 1.6),
        speed_goal(".zst S3 → S3 ÷ local → local speed, 2 workers", S3_ZST, LOCAL_ZST, 0.8),
        *lighter_goal,
        goal(".zst S3 → S3 ÷ local → local, wdstream's CPU (its processes, the same records "
             "and shards), 2 workers", cpu, 1.2, higher_is_better=False, table="Goals"),
        goal(f"peak RSS, {sizes['times']}× input ÷ 1× (S3 → S3)", memory, 1.1,
             higher_is_better=False, table="Goals"),
        *rows,
    ]


def main(argv: list[str] | None = None) -> int:
    from .__main__ import run_alone

    return run_alone("pack", TITLE, run, argv)


if __name__ == "__main__":
    sys.exit(main())
