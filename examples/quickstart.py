"""wdstream end to end on this machine, no cloud account needed.

1. starts a local S3 endpoint (a moto server on 127.0.0.1),
2. generates a small text dataset as JSON Lines,
3. packs it into WebDataset shards in s3://demo/text/ with the `wdstream pack` command,
4. streams it back through wdstream.DataLoader (2 workers, batches of 32),
5. "crashes" half-way through the next epoch, resumes from the saved state, and checks that
   the resumed run delivers exactly the batches the uninterrupted one does.

Run it with `tox -e demo` (or `python examples/quickstart.py` where wdstream[demo] is
installed).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

console = Console()


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
    os.environ.update({
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    })
    import boto3

    boto3.client("s3").create_bucket(Bucket="demo")
    return server


def generate_jsonl(path: str, records: int) -> None:
    words = "stream shard epoch token batch resume seed rank worker model".split()
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(records):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 200)))
            f.write(json.dumps({"id": f"doc{i:06d}", "text": text}) + "\n")


def wdstream_command(*args: str) -> None:
    exe = shutil.which("wdstream", path=os.path.dirname(sys.executable)) or "wdstream"
    console.print(f"[bold]$ wdstream {' '.join(args)}[/bold]")
    subprocess.run([exe, *args], check=True)


def main() -> int:
    import wdstream

    server = start_local_s3()
    workdir = tempfile.mkdtemp(prefix="wdstream-demo-")
    try:
        source = os.path.join(workdir, "docs.jsonl")
        generate_jsonl(source, 5000)
        url = "s3://demo/text/"
        wdstream_command("pack", source, "--output", url, "--key", "id",
                         "--field", "text=txt", "--max-count", "500")
        wdstream_command("verify", url)

        dataset = wdstream.StreamingDataset(url, shuffle=True, seed=17)
        loader = wdstream.DataLoader(dataset, batch_size=32, num_workers=2)
        started = time.perf_counter()
        first_batch = None
        reference = []
        for batch in loader:
            first_batch = first_batch or time.perf_counter() - started
            reference.append(list(batch["__key__"]))
        elapsed = time.perf_counter() - started
        samples = sum(len(b) for b in reference)

        table = Table(title=f"streamed {url} (epoch 0)")
        for column in ("batches", "samples", "samples/s", "first batch"):
            table.add_column(column, justify="right")
        table.add_row(str(len(reference)), str(samples), f"{samples / elapsed:,.0f}",
                      f"{first_batch:.2f} s")
        console.print(table)

        # Epoch 1, uninterrupted, then the same epoch with a crash half-way and a resume.
        uninterrupted = [list(b["__key__"]) for b in loader]
        crashed = wdstream.DataLoader(wdstream.StreamingDataset(url, seed=17), batch_size=32,
                                      num_workers=2)
        crashed.dataset.set_epoch(1)
        before = []
        for batch in crashed:
            before.append(list(batch["__key__"]))
            if len(before) == len(uninterrupted) // 2:
                break
        state = json.dumps(crashed.state_dict())
        console.print(f"saved loader state after {len(before)} batches: {state}")

        resumed = wdstream.DataLoader(wdstream.StreamingDataset(url, seed=17), batch_size=32,
                                      num_workers=2)
        resumed.load_state_dict(json.loads(state))
        after = [list(b["__key__"]) for b in resumed]
        identical = before + after == uninterrupted
        console.print(f"resumed {len(after)} batches; identical to the uninterrupted epoch: "
                      f"[bold]{identical}[/bold]")
        return 0 if identical and samples == 5000 else 1
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
