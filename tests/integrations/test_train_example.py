"""The LM training example against the local S3 endpoint: killed with SIGKILL and resumed, it
reproduces the uninterrupted loss curve; and the Hugging Face Trainer recipe of docs/llm.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_lm.py"
# 20 steps over 3 epochs of 8 steps; the kill after step 11 falls in the second epoch, and the
# resume starts from the checkpoint after step 10.
SMALL = ["--steps", "20", "--steps-per-epoch", "8", "--batch-size", "4", "--seq-len", "32",
         "--documents", "120", "--checkpoint-every", "5"]


def start(workdir, bucket, *extra):
    return subprocess.Popen([sys.executable, str(EXAMPLE), "--workdir", str(workdir),
                             "--bucket", bucket, *SMALL, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, expected_returncode=0) -> dict[int, float]:
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == expected_returncode, stderr[-3000:]
    return {int(step): float(loss) for step, loss in re.findall(r"^step (\d+) loss (\S+)$",
                                                                stdout, re.M)}


@pytest.mark.slow
def test_killed_and_resumed_run_matches_the_uninterrupted_loss_curve(s3_bucket, tmp_path):
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_tiny_lm
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    train_tiny_lm.prepare(s3_bucket, str(tmp_path / "data"), 120)  # once, before both runs

    uninterrupted = start(tmp_path / "a", s3_bucket)
    killed = start(tmp_path / "b", s3_bucket, "--die-at", "11")
    reference = finish(uninterrupted)
    before = finish(killed, expected_returncode=-9)  # SIGKILL after step 11
    after = finish(start(tmp_path / "b", s3_bucket, "--resume"))

    assert sorted(reference) == list(range(1, 21))
    assert sorted(before) == list(range(1, 12))
    assert sorted(after) == list(range(11, 21))  # from the checkpoint after step 10
    assert reference[20] < reference[1] - 1  # it learns
    for step, loss in [*before.items(), *after.items()]:
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=1e-7), f"step {step}"


@pytest.mark.slow
def test_hugging_face_trainer_recipe(tmp_path, monkeypatch):
    """docs/llm.md's recipe: the Trainer trains from a wdstream.DataLoader (max_steps from
    len(loader)), saves the loader state in each checkpoint, and resumes exactly."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    import wdstream
    from tests.support.llm_data import documents, train_tokenizer, write_text_dataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    train_tokenizer(tmp_path / "tokenizer.json", documents(5, 200))
    write_text_dataset(tmp_path / "web", [40, 40], seed=3)

    def loader():
        dataset = wdstream.from_config({
            "seed": 1, "seq_len": 16, "tokenizer": str(tmp_path / "tokenizer.json"),
            "eos": "<eos>", "sequences_per_epoch": 40,
            "datasets": [{"path": str(tmp_path / "web"), "text_field": "text"}]})
        return wdstream.DataLoader(dataset, batch_size=4, num_workers=0)

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(128, 16)
            self.head = torch.nn.Linear(16, 128)
            self.seen: list[list[int]] = []

        def forward(self, input_ids, labels, position_ids):
            self.seen.extend(input_ids.tolist())
            logits = self.head(self.embed(input_ids))
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128),
                                                     labels[:, 1:].reshape(-1))
            return {"loss": loss}

    class LoaderState(transformers.TrainerCallback):
        """Saves the loader's state into every checkpoint folder."""

        def __init__(self, loader):
            self.loader = loader

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (folder / "wdstream_loader.json").write_text(json.dumps(self.loader.state_dict()))

    class StreamingTrainer(transformers.Trainer):
        def __init__(self, *args, loader, **kwargs):
            super().__init__(*args, callbacks=[LoaderState(loader)], **kwargs)
            self.loader = loader

        def get_train_dataloader(self):
            return self.loader  # the wdstream loader itself, not rebuilt by accelerate

    def trainer(loader, model):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=len(loader) + 4, save_steps=6,
            per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=100,
            report_to=[], ignore_data_skip=True, use_cpu=True, seed=0)
        return StreamingTrainer(model=model, args=args, loader=loader)

    torch.manual_seed(0)
    reference_loader = loader()
    steps = len(reference_loader) + 4  # crosses into the second epoch
    reference = TinyLM()
    trainer(reference_loader, reference).train()
    assert len(reference.seen) == steps * 4

    resumed_loader = loader()
    checkpoint = tmp_path / "out" / "checkpoint-6"
    resumed_loader.load_state_dict(json.loads((checkpoint / "wdstream_loader.json").read_text()))
    resumed = TinyLM()
    trainer(resumed_loader, resumed).train(resume_from_checkpoint=str(checkpoint))
    assert resumed.seen == reference.seen[6 * 4:]
    assert os.path.exists(tmp_path / "out" / f"checkpoint-{steps}")
