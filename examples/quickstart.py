"""wdstream end to end on this machine, no cloud account needed.

1. starts a local S3 endpoint (a moto server on 127.0.0.1);
2. writes a Parquet folder and a JSON Lines folder to s3://demo/ (nothing packed);
3. for each, trains in a separate process that streams it with wdstream.DataLoader (2
   workers) and saves a checkpoint (the loader's state_dict() as JSON) every 10 batches;
   kills that process with SIGKILL half-way through the epoch, starts a fresh one on 1
   worker from the last checkpoint, and checks that the rows delivered up to the
   checkpoint and those delivered after the resume are every row of the epoch, each once;
4. then the packed path: `wdstream pack` turns JSON Lines into tar shards in s3://demo/,
   streamed, killed and resumed the same way.

Batches delivered after the last checkpoint, before the kill, are delivered again after
the resume, as the model's own steps since that checkpoint are: a checkpoint is where
training resumes from. Exits 1 if any row is missing or repeated.

Run it with `tox -e demo` (or `python examples/quickstart.py` where wdstream[demo] is
installed). `python examples/quickstart.py train SOURCE ...` is the training process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter

from rich.console import Console
from rich.table import Table

console = Console()

BATCH_SIZE = 32
CHECKPOINT_EVERY = 10  # batches
STEP_SECONDS = 0.02  # what a training step takes here, so that the kill lands mid-epoch
WORKERS, RESUMED_WORKERS = 2, 1
SEED = 17
WORDS = "stream shard epoch token batch resume seed rank worker model".split()


# ---- the training process ------------------------------------------------------------------

def train(argv: list[str]) -> int:
    """A small training loop: stream SOURCE, log each batch's keys to --log, checkpoint every
    CHECKPOINT_EVERY batches to --checkpoint, and resume from it if it exists."""
    parser = argparse.ArgumentParser(prog="quickstart.py train")
    parser.add_argument("source")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)

    import torch

    import wdstream

    dataset = wdstream.StreamingDataset(args.source, shuffle=True, seed=SEED)
    loader = wdstream.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=args.workers)
    model = torch.nn.Linear(1, 1)  # stepped by hand: torch.optim imports torch._dynamo (2.5 s)
    done = 0
    if os.path.exists(args.checkpoint):
        with open(args.checkpoint) as file:
            checkpoint = json.load(file)
        loader.load_state_dict(checkpoint["loader"])
        model.load_state_dict({k: torch.tensor(v) for k, v in checkpoint["model"].items()})
        done = checkpoint["batches"]

    with open(args.log, "a") as log:
        for batch in loader:
            keys = list(batch["__key__"])
            lengths = torch.tensor([[float(len(key))] for key in keys])
            model.zero_grad()
            model(lengths).pow(2).mean().backward()
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter -= 0.01 * parameter.grad
            time.sleep(STEP_SECONDS)
            done += 1
            log.write(json.dumps(keys) + "\n")
            log.flush()  # in the kernel's hands: survives SIGKILL
            if done % CHECKPOINT_EVERY == 0:
                save_checkpoint(args.checkpoint, {
                    "batches": done, "loader": loader.state_dict(),
                    "model": {k: v.tolist() for k, v in model.state_dict().items()}})
    return 0


def save_checkpoint(path: str, checkpoint: dict) -> None:
    with open(path + ".tmp", "w") as file:
        json.dump(checkpoint, file)
    os.replace(path + ".tmp", path)  # a kill never leaves half a checkpoint


# ---- the demo ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_local_s3():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update({  # inherited by the training processes and `wdstream`
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    })
    import boto3

    boto3.client("s3").create_bucket(Bucket="demo")
    return server


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))


def upload(folder: str, prefix: str) -> str:
    import boto3

    client = boto3.client("s3")
    for name in sorted(os.listdir(folder)):
        client.upload_file(os.path.join(folder, name), "demo", f"{prefix}/{name}")
    return f"s3://demo/{prefix}/"


def write_parquet(folder: str, files: int = 4, rows: int = 600) -> set[str]:
    """Parquet files of ``rows`` rows in row groups of 100; the keys wdstream gives them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, keys = random.Random(0), set()
    os.makedirs(folder)
    for f in range(files):
        name = f"part-{f:05d}.parquet"
        table = pa.table({"id": [f * rows + i for i in range(rows)],
                          "text": [text(rng) for _ in range(rows)]})
        pq.write_table(table, os.path.join(folder, name), row_group_size=100)
        keys.update(f"{name}:{i}" for i in range(rows))
    return keys


def write_jsonl(folder: str, files: int = 3, rows: int = 500) -> set[str]:
    rng, keys = random.Random(1), set()
    os.makedirs(folder)
    for f in range(files):
        name = f"part-{f:05d}.jsonl"
        with open(os.path.join(folder, name), "w") as out:
            for i in range(rows):
                out.write(json.dumps({"id": f"doc{f * rows + i:06d}", "text": text(rng)}) + "\n")
        keys.update(f"{name}:{i}" for i in range(rows))
    return keys


def wdstream_command(*args: str) -> None:
    exe = shutil.which("wdstream", path=os.path.dirname(sys.executable)) or "wdstream"
    console.print(f"[bold]$ wdstream {' '.join(args)}[/bold]")
    subprocess.run([exe, *args], check=True)


def workers(count: int) -> str:
    return f"{count} worker" + ("s" if count != 1 else "")


def read_log(path: str) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.endswith("\n")]


class Run:
    """One source trained on in a process killed mid-epoch, then in a fresh one resumed from
    the last checkpoint on another number of workers."""

    def __init__(self, name: str, source: str, keys: set[str], workdir: str):
        self.name, self.source, self.keys = name, source, keys
        self.epoch = -(-len(keys) // BATCH_SIZE)  # batches
        self.kill_at = self.epoch // 2 + CHECKPOINT_EVERY // 2  # between two checkpoints
        path = os.path.join(workdir, name)
        self.checkpoint = path + ".checkpoint.json"
        self.logs = {"killed": path + ".killed.log", "resumed": path + ".resumed.log"}
        self.errors = open(path + ".stderr", "w+")  # the processes' output, shown if one fails
        self.process: subprocess.Popen | None = None

    def start(self, run: str, workers: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "train", self.source, "--workers",
             str(workers), "--checkpoint", self.checkpoint, "--log", self.logs[run]],
            stdout=self.errors, stderr=self.errors)

    def kill_when_due(self) -> bool:
        """SIGKILL the process once it trained on ``kill_at`` batches; whether it is dead."""
        if self.process.poll() is not None:
            self.fail(f"the training process ended before the kill (exit "
                      f"{self.process.returncode})")
        if len(read_log(self.logs["killed"])) < self.kill_at:
            return False
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        with open(self.checkpoint) as file:
            self.saved = json.load(file)["batches"]
        self.killed = read_log(self.logs["killed"])
        console.print(f"  {self.name}: pid {self.process.pid} ({workers(WORKERS)}) killed with "
                      f"SIGKILL after batch {len(self.killed)} of {self.epoch}; last "
                      f"checkpoint: batch {self.saved}")
        return True

    def finish(self) -> dict:
        """Wait for the resumed process; what it and the killed one delivered."""
        if self.process.wait(timeout=300) != 0:
            self.fail(f"the resumed process failed (exit {self.process.returncode})")
        resumed = read_log(self.logs["resumed"])
        console.print(f"  {self.name}: pid {self.process.pid} ({workers(RESUMED_WORKERS)}) "
                      f"resumed from batch {self.saved}, delivered {len(resumed)} more")
        return {"name": self.name, "epoch": self.epoch, "killed": len(self.killed),
                "saved": self.saved, **tally(self.keys, self.killed[:self.saved], resumed)}

    def fail(self, why: str):
        self.errors.seek(0)
        raise SystemExit(f"{self.name} ({self.source}): {why}:\n{self.errors.read()}")


def crash_and_resume(runs: list[Run]) -> list[dict]:
    """Every run's training process started at once, each killed mid-epoch, then each
    resumed in a fresh process."""
    try:
        for run in runs:
            run.start("killed", WORKERS)
        waiting = list(runs)
        while waiting:
            waiting = [run for run in waiting if not run.kill_when_due()]
            time.sleep(0.01)
        for run in runs:
            run.start("resumed", RESUMED_WORKERS)
        return [run.finish() for run in runs]
    finally:  # a run that failed leaves no other training process behind
        for run in runs:
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()
            run.errors.close()


def tally(keys: set[str], before: list[list[str]], after: list[list[str]]) -> dict:
    """Rows delivered up to the checkpoint and after the resume, against every row."""
    counts = Counter(key for batch in before + after for key in batch)
    return {"rows": len(keys), "before": sum(map(len, before)), "after": sum(map(len, after)),
            "repeated": sum(n - 1 for n in counts.values() if n > 1),
            "missing": len(keys - counts.keys()), "unknown": len(counts.keys() - keys),
            "once": counts.keys() == keys and all(n == 1 for n in counts.values())}


def report(results: list[dict]) -> Table:
    table = Table(title="every row of the epoch, exactly once?", caption=(
        "killed: the batch SIGKILL came after, of the epoch's; saved: the last checkpoint's "
        "batch; before: rows up to it; after: rows the resumed process delivered; twice, "
        "missing: rows delivered twice, or never"))
    for column in ("source", "rows", "killed", "saved", "before", "after", "twice",
                   "missing", "once"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for r in results:
        table.add_row(r["name"], str(r["rows"]), f"{r['killed']}/{r['epoch']}", str(r["saved"]),
                      str(r["before"]), str(r["after"]), str(r["repeated"]),
                      str(r["missing"] + r["unknown"]),
                      "[green]yes[/green]" if r["once"] else "[red]NO[/red]")
    return table


def demo() -> int:
    started = time.perf_counter()
    server = start_local_s3()
    workdir = tempfile.mkdtemp(prefix="wdstream-demo-")
    try:
        parquet = write_parquet(os.path.join(workdir, "parquet"))
        jsonl = write_jsonl(os.path.join(workdir, "jsonl"))
        runs = [Run("parquet", upload(os.path.join(workdir, "parquet"), "parquet"), parquet,
                    workdir),
                Run("jsonl", upload(os.path.join(workdir, "jsonl"), "jsonl"), jsonl, workdir)]
        console.print("[bold]1. Raw files, streamed where they lie[/bold] (no pack step): "
                      f"{runs[0].source} ({len(parquet)} rows of Parquet), {runs[1].source} "
                      f"({len(jsonl)} rows of JSON Lines)")

        console.print("[bold]2. Packed shards[/bold]: the JSON Lines rows packed into tar shards")
        documents = os.path.join(workdir, "docs.jsonl")
        with open(documents, "w") as out:
            for name in sorted(os.listdir(os.path.join(workdir, "jsonl"))):
                with open(os.path.join(workdir, "jsonl", name)) as part:
                    out.write(part.read())
        wdstream_command("pack", documents, "--output", "s3://demo/shards/", "--key", "id",
                         "--field", "text=txt", "--max-count", "300")
        runs.append(Run("shards", "s3://demo/shards/",
                        {f"doc{i:06d}" for i in range(len(jsonl))}, workdir))

        console.print(f"[bold]3. Training[/bold] on each source in a process of its own "
                      f"(batches of {BATCH_SIZE}, {workers(WORKERS)}, a checkpoint every "
                      f"{CHECKPOINT_EVERY} batches), killed mid-epoch, resumed in a fresh "
                      f"process on {workers(RESUMED_WORKERS)} from the last checkpoint")
        results = crash_and_resume(runs)
        console.print(report(results))
        ok = all(r["once"] for r in results)
        console.print(f"every row of the epoch exactly once: [bold]{ok}[/bold] "
                      f"({time.perf_counter() - started:.0f} s)")
        return 0 if ok else 1
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        sys.exit(train(sys.argv[2:]))
    sys.exit(demo())
