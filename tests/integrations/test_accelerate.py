"""Accelerate's ``prepare`` with a ``wdstream.DataLoader`` (the real package): on 1 process and
2 (torchrun, gloo), the loader comes back as it is, ``prepare_loader`` puts batches on the device, every sample once,
equal batches per rank, ``len`` right, and ``save_state``/``load_state`` resume exactly.

The job is tests/support/accelerate_job.py."""

from __future__ import annotations

import os

import pytest

from tests.support.jobs import run_job, script
from tests.support.shard_data import all_keys, write_dataset
from wdstream.errors import OptionError
from wdstream.integrations.accelerate import prepare_loader

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

JOB = script("accelerate_job.py")
COUNTS = [30, 7, 25, 18]  # 80 samples
BATCH, SAVE_AT = 4, 3


def run(nproc, data, out, *args):
    os.makedirs(out, exist_ok=True)
    return run_job([JOB, "--data", str(data), "--out", str(out), *map(str, args)], nproc, out,
                   timeout=120)


@pytest.mark.parametrize("nproc", [1, 2])
def test_prepare_keeps_the_loader_and_save_state_resumes_it(tmp_path, nproc):
    write_dataset(tmp_path / "data", COUNTS)
    full = run(nproc, tmp_path / "data", tmp_path / "a", "--save-at", SAVE_AT)
    per_rank = sum(COUNTS) // nproc // BATCH
    keys = []
    for record in full:
        assert record["same"] and record["world"] == nproc
        assert record["len"] == len(record["keys"]) == per_rank  # 20 or 10 batches, all full
        assert set(record["devices"]) == {"cpu"}
        keys += [key for batch in record["keys"] for key in batch]
    assert len(keys) == len(set(keys)) and set(keys) == all_keys(COUNTS)  # every sample once

    resumed = run(nproc, tmp_path / "data", tmp_path / "b", "--resume", tmp_path / "a" / "ckpt")
    for before, after in zip(full, resumed, strict=True):
        assert after["keys"] == before["keys"][SAVE_AT:]  # exactly the rest of the epoch
    checkpoint = sorted(os.listdir(tmp_path / "a" / "ckpt"))
    assert [f"wdstream_loader-rank{r}.json" in checkpoint for r in range(nproc)] == [True] * nproc


def test_split_batches_is_refused_with_a_way_out(tmp_path, monkeypatch):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    import wdstream

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    write_dataset(tmp_path / "data", COUNTS)
    loader = wdstream.DataLoader(wdstream.StreamingDataset(str(tmp_path / "data")), batch_size=4)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        split_batches=True))
    with pytest.raises(ValueError, match="batch_size=global_batch // num_processes"):
        prepare_loader(accelerator, loader)


def test_a_loader_prepared_by_accelerate_alone_says_what_to_call(tmp_path, monkeypatch):
    """Without prepare_loader its state would not be checkpointed: the first batch is refused,
    naming the call, rather than a resume that silently starts over."""
    from accelerate import Accelerator

    import wdstream

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    write_dataset(tmp_path / "data", COUNTS)
    loader = wdstream.DataLoader(wdstream.StreamingDataset(str(tmp_path / "data")), batch_size=4)
    accelerator = Accelerator(cpu=True)
    assert accelerator.prepare(loader) is loader
    with pytest.raises(OptionError, match=r"prepare_loader\(accelerator, loader\)"):
        next(iter(loader))
    assert prepare_loader(accelerator, loader) is loader
    assert len(next(iter(loader))["__key__"]) == 4
