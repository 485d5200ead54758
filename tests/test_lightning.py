"""``lightning.Trainer`` (the real package) with a ``wdstream.DataLoader``: the loader's state is
in every checkpoint and ``fit(ckpt_path=...)`` resumes exactly, on 1 process and under
torchrun with 2 ranks (DDP, gloo). The job is tests/lightning_job.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import all_keys, write_dataset
from servers import free_port

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

JOB = str(Path(__file__).with_name("lightning_job.py"))
ROOT = str(Path(__file__).resolve().parent.parent)
COUNTS = [30, 7, 25, 18]  # 80 samples: 20 batches of 4 per epoch on 1 rank, 10 on 2


def run(data, work, nproc):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    job = [JOB, "--data", str(data), "--work", str(work)]
    cmd = [sys.executable, *job] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--monitor_interval=0.1",
        *job, "--workers", "0"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-6000:]
    return [json.loads(Path(work, f"rank-{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.parametrize("nproc", [1, 2])
def test_fit_checkpoints_the_loader_and_resumes_exactly(tmp_path, nproc):
    write_dataset(tmp_path / "data", COUNTS)
    records = run(tmp_path / "data", tmp_path / "work", nproc)
    per_epoch = sum(COUNTS) // nproc // 4
    first_epoch = []
    for record in records:
        assert len(record["reference"]) == 2 * per_epoch
        assert record["resumed"] == record["reference"][6:]  # after step 6, nothing replayed
        [state] = record["saved"]  # the wdstream loader's state, by Lightning itself
        assert state["format"] == "wdstream.loader" and sum(state["batches"]) == 6
        first_epoch += [key for batch in record["reference"][:per_epoch] for key in batch]
    assert len(first_epoch) == len(set(first_epoch)) == sum(COUNTS)
    assert set(first_epoch) == all_keys(COUNTS)
