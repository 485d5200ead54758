"""The Hugging Face ``Trainer`` on a wdstream loader through
``wdstream.integrations.hf_trainer.use_loader`` (no subclass, no callback of the user's own),
run by tests/integrations/test_hf_trainer.py directly or under torchrun (gloo, CPU):

    python tests/support/hf_trainer_job.py --work DIR [--workers N]

Trains a tiny model for 2 epochs (``max_steps`` left to the Trainer: 2 x ``len(loader)``),
checkpointing every 3 steps; then a fresh trainer, model and loader resume from
``checkpoint-3`` in the same process. Writes ``DIR/rank-R.json``: the sequences each run fed
the model, ``len(loader)``, the steps the Trainer planned and what the checkpoint holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformers  # noqa: E402
from ddp_steps import exit_done, leave_group  # noqa: E402

import wdstream  # noqa: E402
from wdstream.integrations.hf_trainer import use_loader  # noqa: E402


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(128, 16)
        self.head = torch.nn.Linear(16, 128)
        self.seen: list[list[int]] = []

    def forward(self, input_ids, labels, position_ids=None):
        self.seen.extend(input_ids.tolist())
        logits = self.head(self.embed(input_ids))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128),
                                                 labels[:, 1:].reshape(-1))
        return {"loss": loss}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    work = args.work

    def loader():
        dataset = wdstream.from_config({
            "seed": 1, "sequence_len": 16, "tokenizer": os.path.join(work, "tokenizer.json"),
            "eos": "<eos>", "sequences_per_epoch": 24,
            "datasets": [{"path": os.path.join(work, "web"), "type": "completion",
                          "field": "text"}]})
        return wdstream.DataLoader(dataset, batch_size=2, num_workers=args.workers)

    def trainer(model, data):
        arguments = transformers.TrainingArguments(
            output_dir=os.path.join(work, "out"), num_train_epochs=2, save_steps=3,
            per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=100,
            report_to=[], use_cpu=True, seed=0, save_only_model=False)
        return use_loader(transformers.Trainer(model=model, args=arguments), data)

    reference, data = TinyLM(), loader()
    first = trainer(reference, data)
    first.train()
    resumed = TinyLM()
    checkpoint = os.path.join(work, "out", "checkpoint-3")
    trainer(resumed, loader()).train(resume_from_checkpoint=checkpoint)
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(work, f"rank-{rank}.json"), "w") as f:
        json.dump({"reference": reference.seen, "resumed": resumed.seen, "len": len(data),
                   "max_steps": first.state.max_steps,
                   "saved": sorted(os.listdir(checkpoint))}, f)
    leave_group()


if __name__ == "__main__":
    main()
    exit_done()
