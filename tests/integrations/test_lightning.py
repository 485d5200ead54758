"""``lightning.Trainer`` (the real package) with a ``wdstream.DataLoader``: the loader's state is
in every checkpoint and ``fit(ckpt_path=...)`` resumes exactly, on 1 process and under
torchrun with 2 ranks (DDP, gloo). The job is tests/support/lightning_job.py."""

from __future__ import annotations

import pytest

from tests.support.jobs import run_job, script
from tests.support.shard_data import all_keys, write_dataset

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

JOB = script("lightning_job.py")
COUNTS = [30, 7, 25, 18]  # 80 samples: 20 batches of 4 per epoch on 1 rank, 10 on 2


def run(data, work, nproc, *options):
    job = [JOB, "--data", str(data), "--work", str(work), *options]
    return run_job(job if nproc == 1 else [*job, "--workers", "0"], nproc, work)


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


def test_a_mix_under_ddp_resumes_every_rank_from_rank_0s_checkpoint(tmp_path):
    """Lightning writes rank 0's checkpoint and every rank loads it: a Mix's positions are
    the same on every rank, so rank 1 resumes from it too, exactly."""
    write_dataset(tmp_path / "data" / "a", COUNTS)
    write_dataset(tmp_path / "data" / "b", [11, 13])
    records = run(tmp_path / "data", tmp_path / "work", 2, "--mix")
    for record in records:
        assert len(record["reference"]) > 6
        assert record["resumed"] == record["reference"][6:]
    first, second = (set(map(tuple, r["reference"])) for r in records)
    assert not first & second  # the ranks read different samples
