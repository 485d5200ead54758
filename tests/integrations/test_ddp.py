"""Multi-process DDP runs under torchrun (gloo, CPU), reading from the moto S3 server:
one epoch on 2 ranks x 2 workers, a rank killed with SIGKILL and the job resumed from its
checkpoint, and elastic resume on 1 rank x 3 workers and 3 ranks x 1 worker.

The job itself is tests/support/ddp_job.py; each run leaves per-rank logs of the keys of every batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, script
from tests.support.servers import free_port
from tests.support.shard_data import all_keys, sample_key, write_dataset
from wdstream.stream.plan.epoch import EpochPlan, HistorySegment, PlanOptions, batches_in_stream

pytestmark = pytest.mark.slow

JOB = script("ddp_job.py")

# Uneven shards (3 to 60 samples); 277 samples in all, so 2 ranks drop 1 and 3 ranks 1.
COUNTS = [60, 6, 45, 12, 31, 8, 50, 20, 35, 10]
SEED, WINDOW, BATCH = 11, 8, 4
EVERY = 5  # rank 0 checkpoints every 5 batches
RUN_TIMEOUT = 150


@pytest.fixture(scope="module")
def s3_data(moto_server, tmp_path_factory):
    """The dataset uploaded to the moto server with boto3; its s3:// prefix."""
    folder = tmp_path_factory.mktemp("ddp-data")
    write_dataset(folder, COUNTS)
    return moto_server.upload(folder, f"ddp-{os.getpid()}", "data")


def torchrun(moto_server, url, nproc, out, *args, expect_ok=True, window=WINDOW):
    env = dict(os.environ)
    env.update(moto_server.env)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--monitor_interval=0.1",
           JOB, "--url", url, "--out", str(out), "--seed", str(SEED), "--window", str(window),
           "--batch-size", str(BATCH), *map(str, args)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT)
    output = f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n" \
             f"{result.stderr[-8000:]}"
    if expect_ok:
        assert result.returncode == 0, output
    return result, output


def read_run(out, world):
    """Per rank: its meta, its batches {index: keys} (a torn last line is ignored) and, if
    the run ended cleanly, its done record."""
    runs = []
    for rank in range(world):
        meta = json.loads(Path(out, f"meta-{rank}.json").read_text())
        batches = {}
        lines = Path(out, f"rank-{rank}.jsonl").read_text().split("\n")
        for number, line in enumerate(lines):
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                assert number == len(lines) - 1, f"rank {rank}: torn line in the middle"
                continue
            assert record["batch"] not in batches, f"rank {rank}: batch logged twice"
            batches[record["batch"]] = record["keys"]
        done = Path(out, f"done-{rank}.json")
        runs.append({"meta": meta, "batches": batches,
                     "done": json.loads(done.read_text()) if done.exists() else None})
    return runs


def batch_lists(run, upto=None):
    """Per rank, the list of batches (keys) in batch order, up to index ``upto``."""
    lists = []
    for rank in run:
        indices = sorted(i for i in rank["batches"] if upto is None or i <= upto)
        if indices:
            assert indices == list(range(indices[0], indices[-1] + 1)), "a batch is missing"
        lists.append([rank["batches"][i] for i in indices])
    return lists


def plan_for(world, workers, history=(), window=WINDOW, start=None):
    options = PlanOptions(seed=SEED, shuffle=True, window=window, remainder="drop",
                          start=start)
    return EpochPlan(COUNTS, 0, world, workers, options, history)


def rank_batches(plan):
    return sum(batches_in_stream(n, BATCH, False) for n in plan.stream_samples)


def assert_exactly_once(*parts, remainder):
    """Every sample of the epoch exactly once across ``parts`` (lists of batches of keys),
    except ``remainder`` samples left out."""
    seen = Counter(key for part in parts for batch in part for key in batch)
    twice = sorted(k for k, n in seen.items() if n > 1)
    assert not twice, f"{len(twice)} samples delivered more than once: {twice[:10]}"
    assert set(seen) <= all_keys(COUNTS)
    missing = all_keys(COUNTS) - set(seen)
    assert len(missing) == remainder, f"missing {sorted(missing)[:10]}, expected {remainder}"


@pytest.fixture(scope="module")
def uninterrupted(moto_server, s3_data, tmp_path_factory):
    """One whole epoch at 2 ranks x 2 workers (the reference for the other runs)."""
    out = tmp_path_factory.mktemp("ddp-full")
    torchrun(moto_server, s3_data, 2, out, "--workers", 2, "--checkpoint", out / "ckpt.json",
             "--every", EVERY, "--keep-checkpoints")
    return read_run(out, 2), out


def test_one_epoch_two_ranks_every_sample_once(uninterrupted):
    run, _out = uninterrupted
    plan = plan_for(2, 2)
    assert plan.remainder_samples == 1 and rank_batches(plan) == 36
    lists = batch_lists(run)
    for rank, batches in zip(run, lists, strict=True):
        assert rank["meta"]["len_loader"] == len(batches) == rank_batches(plan)
        assert rank["meta"]["len_dataset"] == plan.rank_samples
        assert rank["meta"]["remainder"] == plan.remainder_samples
        assert rank["done"]["delivered"] == len(batches)
    assert_exactly_once(*lists, remainder=plan.remainder_samples)
    # the uneven shards really are spread over both ranks and both workers' streams
    assert all(len({k[:4] for b in batches for k in b}) >= 3 for batches in lists)


def test_sigkill_mid_epoch_then_resume_from_checkpoint(moto_server, s3_data, uninterrupted,
                                                       tmp_path):
    """Rank 1 is killed after batch 23 (last checkpoint: 20); the job resumes from it, and
    that run loses rank 0 right after batch 30, before it could checkpoint it (last: 25); a
    third run resumes from there and finishes the epoch."""
    runs, starts = [], [0]
    for number, (die_at, die_rank, saved_at) in enumerate([(23, 1, 20), (30, 0, 25), (None,) * 3]):
        out, checkpoint = tmp_path / f"run{number}", tmp_path / f"ckpt{number}.json"
        args = ["--workers", 2, "--checkpoint", checkpoint, "--every", EVERY]
        if number:
            args += ["--resume", tmp_path / f"ckpt{number - 1}.json"]
        if die_at is not None:
            args += ["--die-at", die_at, "--die-rank", die_rank]
        result, output = torchrun(moto_server, s3_data, 2, out, *args, expect_ok=die_at is None)
        run = read_run(out, 2)
        for rank in run:
            assert rank["meta"]["resumed_from"] == starts[-1]
            assert min(rank["batches"]) == starts[-1] + 1
            assert rank["meta"]["len_loader"] == rank_batches(plan_for(2, 2))
        if die_at is not None:
            assert result.returncode != 0, output
            assert "(SIGKILL)" in output, output
            assert run[die_rank]["done"] is None and max(run[die_rank]["batches"]) == die_at
            saved = json.loads(checkpoint.read_text())
            assert saved["batch"] == saved_at, "not the last checkpoint before the kill"
            # both ranks logged past the checkpoint: those batches are read again
            assert all(max(rank["batches"]) > saved_at for rank in run)
            starts.append(saved_at)
        runs.append(run)

    parts = [batch_lists(run, upto=stop) for run, stop in
             zip(runs, starts[1:] + [None], strict=True)]
    per_rank = [[batch for part in parts for batch in part[rank]] for rank in range(2)]
    assert [len(batches) for batches in per_rank] == [rank_batches(plan_for(2, 2))] * 2
    assert_exactly_once(*per_rank, remainder=plan_for(2, 2).remainder_samples)
    # and exactly the batches of the uninterrupted run, in order, on every rank
    assert per_rank == batch_lists(uninterrupted[0])


ELASTIC_AT = 15  # mid-window: 8 and 7 batches of 4 from the two streams, window 8


@pytest.fixture(scope="module")
def saved_at_2x2(uninterrupted):
    """The checkpoint the uninterrupted 2 ranks x 2 workers run saved after batch 15 (with
    batches in flight in the workers), and what that run delivered up to it."""
    run, out = uninterrupted
    checkpoint = out / f"ckpt-{ELASTIC_AT}.json"
    saved = json.loads(checkpoint.read_text())
    assert saved["batch"] == ELASTIC_AT
    return checkpoint, saved, batch_lists(run, upto=ELASTIC_AT)


@pytest.mark.parametrize("world,workers", [(1, 3), (3, 1)])
def test_elastic_resume_on_another_layout(moto_server, s3_data, saved_at_2x2, tmp_path,
                                          world, workers):
    checkpoint, saved, before = saved_at_2x2
    assert [len(b) for b in before] == [ELASTIC_AT] * 2
    state = saved["loader"]
    assert (state["world"], state["workers"]) == (2, 2)
    assert any(p % WINDOW for p in state["positions"]), "meant to stop inside a window"
    out = tmp_path / "resumed"
    torchrun(moto_server, s3_data, world, out, "--workers", workers, "--resume", checkpoint)
    run = read_run(out, world)
    after = batch_lists(run)
    history = [HistorySegment.from_list(s) for s in state["history"]]
    history.append(HistorySegment(2, 2, BATCH, tuple(state["positions"])))
    plan = plan_for(world, workers, history)
    assert plan.total == sum(COUNTS) - 2 * ELASTIC_AT * BATCH  # full batches so far
    expected = rank_batches(plan)
    assert [len(a) for a in after] == [expected] * world, "unequal batch counts across ranks"
    for rank in run:
        assert rank["done"]["delivered"] == expected
        assert rank["meta"]["len_loader"] == expected  # the rest of the epoch
    assert plan.remainder_samples < world
    assert_exactly_once(*before, *after, remainder=plan.remainder_samples)


GROWING = {"window": 64, "start": 2}  # a stream's windows: 2, 4, 8, 16, 32, then 64 samples


def test_crash_inside_growing_windows_then_elastic_resume(moto_server, s3_data, tmp_path):
    """2 ranks x 2 workers with windows that grow; rank 1 is killed after batch 7 (the last
    checkpoint, after batch 5, has its streams inside their windows of 8 samples); the job
    resumes on 3 ranks x 1 worker and delivers every sample of the epoch exactly once."""
    window, start = GROWING["window"], GROWING["start"]
    checkpoint = tmp_path / "ckpt.json"
    result, output = torchrun(moto_server, s3_data, 2, tmp_path / "crashed", "--workers", 2,
                              "--checkpoint", checkpoint, "--every", EVERY, "--die-at", 7,
                              "--die-rank", 1, "--shuffle-start", start, expect_ok=False,
                              window=window)
    assert result.returncode != 0 and "(SIGKILL)" in output, output
    saved = json.loads(checkpoint.read_text())
    assert saved["batch"] == EVERY
    state = saved["loader"]
    assert state["positions"] == [12, 8]  # inside the window [6, 14) of both streams
    before = batch_lists(read_run(tmp_path / "crashed", 2), upto=EVERY)
    out = tmp_path / "resumed"
    torchrun(moto_server, s3_data, 3, out, "--workers", 1, "--resume", checkpoint,
             "--shuffle-start", start, window=window)
    after = batch_lists(read_run(out, 3))
    plan = plan_for(3, 1, [HistorySegment(2, 2, BATCH, tuple(state["positions"]))],
                    window=window, start=start)
    assert [len(a) for a in after] == [rank_batches(plan)] * 3
    assert_exactly_once(*before, *after, remainder=plan.remainder_samples)
    # the first run's batches follow the growing windows: a stream's first batch is its
    # first window (2 samples) and 2 picks of its second (positions 2 to 5)
    first = plan_for(2, 2, window=window, start=start).stream_spans(0, 0)
    positions = [sample_key(s.shard, i) for s in first for i in range(s.start, s.stop)]
    batch = before[0][0]
    assert set(batch[:2]) == set(positions[:2]) and set(batch[2:]) <= set(positions[2:6])
