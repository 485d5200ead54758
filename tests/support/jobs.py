"""Job scripts run as a training job runs: one process, or ranks under torchrun (gloo on
127.0.0.1), in an environment without the test process's own rank variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.servers import free_port

ROOT = str(Path(__file__).resolve().parents[2])


def script(name: str) -> str:
    """The path of a job script of this folder (``ddp_job.py``...), as torchrun is given it."""
    return str(Path(__file__).with_name(name))


def run_job(job: list[str], nproc: int, out, timeout: float = 180) -> list[dict]:
    """Run ``job`` (a script and its arguments) in one process when ``nproc`` is 1, else under
    torchrun with ``nproc`` ranks; each rank writes ``out/rank-R.json``, returned in rank
    order. A job that fails fails the test with the end of its stderr."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, *job] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--monitor_interval=0.1",
        *job]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-6000:]
    return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in range(nproc)]
