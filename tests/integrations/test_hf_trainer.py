"""``wdstream.integrations.hf_trainer.use_loader`` with the real Hugging Face ``Trainer``: the
loader state in every checkpoint, restored by ``resume_from_checkpoint`` (no epoch replay),
``max_steps`` from ``len(loader)`` and the epochs; on 1 process and under torchrun with 2 ranks.

The job is tests/support/hf_trainer_job.py."""

from __future__ import annotations

import pytest

from tests.support.jobs import run_job, script

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.slow

JOB = script("hf_trainer_job.py")


@pytest.fixture
def work(tmp_path):
    from tests.support.llm_data import documents, train_tokenizer, write_text_dataset

    train_tokenizer(tmp_path / "tokenizer.json", documents(5, 200))
    write_text_dataset(tmp_path / "web", [40, 40], seed=3)
    return tmp_path


def run(work, nproc, *args):
    return run_job([JOB, "--work", str(work), *args], nproc, work)


@pytest.mark.parametrize("nproc,workers", [(1, "1"), (2, "0")])
def test_trainer_checkpoints_and_resumes_the_loader(work, nproc, workers):
    records = run(work, nproc, "--workers", workers)
    sequences = []
    for record in records:
        per_epoch = 24 // nproc // 2  # sequences per rank / batch size
        assert record["len"] == per_epoch
        assert record["max_steps"] == 2 * per_epoch  # from len(loader) and 2 epochs
        assert len(record["reference"]) == 2 * per_epoch * 2
        assert record["resumed"] == record["reference"][3 * 2:]  # after step 3, no replay
        assert f"wdstream_loader-rank{nproc - 1}.json" in record["saved"]
        sequences += record["reference"]
    if nproc == 2:  # the ranks read different sequences
        first_epoch = [tuple(s) for r in records for s in r["reference"][:len(r["reference"]) // 2]]
        assert len(set(first_epoch)) == len(first_epoch)


def test_a_dataset_gets_a_loader_with_the_trainers_settings(tmp_path, monkeypatch):
    import torch
    import transformers

    import wdstream
    from tests.support.shard_data import write_dataset
    from wdstream.integrations.hf_trainer import use_loader

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    write_dataset(tmp_path / "data", [10, 6])

    def collator(samples):
        return {"x": torch.ones(len(samples), 1)}

    def trainer(**extra):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, report_to=[],
            use_cpu=True, **extra)
        return transformers.Trainer(model=torch.nn.Linear(1, 1), args=args,
                                    data_collator=collator)

    made = use_loader(trainer(), wdstream.StreamingDataset(str(tmp_path / "data")))
    loader = made.wdstream_loader
    assert isinstance(loader, wdstream.DataLoader) and loader.batch_size == 4
    assert loader.user_collate is collator and made.args.ignore_data_skip
    assert made.get_train_dataloader() is loader  # prepared by the trainer's accelerator
    unsized = wdstream.StreamingDataset(sorted(str(p) for p in (tmp_path / "data").glob("*.tar")))
    with pytest.raises(ValueError, match="set max_steps"):
        use_loader(trainer(), unsized)
    # with max_steps, fine: the Trainer sees one epoch that never ends, pass after pass, so
    # no rank ends an epoch at a step the others do not
    passes = use_loader(trainer(max_steps=3), unsized).get_train_dataloader()
    assert not transformers.trainer_utils.has_length(passes) and passes.batch_size == 4
    batches = iter(passes)
    assert [len(next(batches)["x"]) for _ in range(9)] == [4] * 9  # a pass: 4 batches of 4


def test_passes_of_an_empty_stream_end():
    from wdstream.integrations.hf_trainer import Passes

    assert list(Passes([])) == []
