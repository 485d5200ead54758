"""Elastic resume of a packed mixture of pre-tokenized shards under torchrun (gloo, CPU):
2 ranks x 2 workers, rank 1 killed with SIGKILL, the job restarted on 1 rank x 3 workers from
rank 0's checkpoint; every token id of the dataset occurs once, so the logs tell exactly which
tokens were trained on. The job is tests/support/ddp_llm_job.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, script
from tests.support.llm_data import write_token_sources
from tests.support.servers import free_port
from wdstream.stream.load.ranks import ranks_of

pytestmark = pytest.mark.slow

JOB = script("ddp_llm_job.py")
COUNTS = {"x": [30, 25, 41], "y": [22, 35]}
PER_EPOCH, SEQ, BATCH, EVERY, DIE_AT = 80, 16, 2, 4, 10


def torchrun(data, nproc, out, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--monitor_interval=0.1",
           JOB, "--data", str(data), "--out", str(out), "--per-epoch", str(PER_EPOCH),
           "--seq-len", str(SEQ), "--batch-size", str(BATCH), *map(str, args)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return result, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"


def batches(out, rank, upto=None):
    found = {}
    for line in Path(out, f"rank-{rank}.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        if upto is None or record["batch"] <= upto:
            found[record["batch"]] = record["ids"]
    return found


def test_killed_rank_then_elastic_restart_trains_every_token_once(tmp_path):
    data = tmp_path / "data"
    docs = [d for ds in write_token_sources(data, COUNTS).values() for d in ds]

    result, output = torchrun(data, 2, tmp_path / "run0", "--workers", 2, "--checkpoint",
                              tmp_path / "ckpt.json", "--every", EVERY, "--die-at", DIE_AT)
    assert result.returncode != 0 and "SIGKILL" in output, output
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    assert saved["batch"] == 8  # the last checkpoint before the kill
    state = saved["loader"]
    assert (state["world"], state["workers"]) == (2, 2)
    assert all(len(ranks_of(p)) == 2 for p in state["positions"])  # every rank's, gathered
    before = [batches(tmp_path / "run0", r, upto=saved["batch"]) for r in range(2)]
    assert [sorted(b) for b in before] == [list(range(1, 9))] * 2

    result, output = torchrun(data, 1, tmp_path / "run1", "--workers", 3,
                              "--resume", tmp_path / "ckpt.json")
    assert result.returncode == 0, output
    after = batches(tmp_path / "run1", 0)
    meta = json.loads((tmp_path / "run1" / "meta-0.json").read_text())
    assert meta["resumed_from"] == 8
    assert sorted(after) == list(range(9, 9 + len(after)))
    # the epoch's sequences: 2 ranks x 8 batches x 2, then the rest on one rank
    assert (2 * 8 + len(after)) * BATCH == PER_EPOCH

    ids = [i for part in before for b in part.values() for i in b]
    ids += [i for b in after.values() for i in b]
    counts = Counter(i for i in ids if i != 0)
    # every token once: the documents in progress at the cut go on from there on the new
    # layout; every document begun is trained on whole, but for the last of each of the 3
    # streams (cut by the end of the epoch)
    assert max(counts.values()) == 1
    partial = [d for d in docs if 0 < sum(int(t) in counts for t in d) < len(d)]
    assert len(partial) <= 3
    assert sum(len(d) for d in docs if all(int(t) in counts for t in d)) > 0.8 * len(counts)
