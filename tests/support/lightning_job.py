"""``lightning.Trainer.fit`` on a ``wdstream.DataLoader``, run by tests/integrations/test_lightning.py
directly or under torchrun (gloo, CPU):

    python tests/support/lightning_job.py --data DIR --work OUT [--mix]

Fits 2 epochs, checkpointing every 3 steps; then a fresh model and loader resume from the
checkpoint after step 6 (``ckpt_path``) in the same process. Writes ``OUT/rank-R.json``: the
keys of every batch each fit trained on, and the loader state the checkpoint holds.
"""

from __future__ import annotations

import argparse
import json
import os

import lightning
import numpy as np
import torch
from ddp_steps import exit_done, leave_group

import wdstream


def features(sample):
    record = sample["json"]
    return {"__key__": sample["__key__"],
            "x": np.array([record["shard"], record["index"]], dtype=np.float32)}


class Model(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[list[str]] = []

    def training_step(self, batch, index):
        self.seen.append(list(batch["__key__"]))
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--mix", action="store_true", help="a Mix of DATA/a and DATA/b")
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    checkpoints = os.path.join(args.work, "checkpoints")

    def loader():
        if args.mix:
            dataset = wdstream.Mix([wdstream.StreamingDataset(
                os.path.join(args.data, name), seed=5, shuffle_window=8, map=features)
                for name in ("a", "b")], [0.6, 0.4], seed=7, stop="cycle")
        else:
            dataset = wdstream.StreamingDataset(args.data, seed=5, shuffle_window=8,
                                                map=features)
        return wdstream.DataLoader(dataset, batch_size=4, num_workers=args.workers)

    def trainer():
        every = lightning.pytorch.callbacks.ModelCheckpoint(
            dirpath=checkpoints, every_n_train_steps=3, save_top_k=-1, filename="{step}")
        return lightning.Trainer(
            max_epochs=2, accelerator="cpu", devices=world,
            strategy="ddp" if world > 1 else "auto", logger=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=args.work, callbacks=[every])

    reference = Model()
    trainer().fit(reference, loader())
    resumed = Model()
    checkpoint = os.path.join(checkpoints, "step=6.ckpt")
    trainer().fit(resumed, loader(), ckpt_path=checkpoint)
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(args.work, f"rank-{rank}.json"), "w") as f:
        json.dump({"reference": reference.seen, "resumed": resumed.seen,
                   "saved": saved.get("combined_loader")}, f)
    leave_group()


if __name__ == "__main__":
    main()
    exit_done()
