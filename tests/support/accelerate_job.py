"""A custom training loop through Hugging Face Accelerate over a ``wdstream.DataLoader``, run
by tests/integrations/test_accelerate.py directly (one process) or under torchrun (gloo, CPU):

    python tests/support/accelerate_job.py --data DIR --out OUT [--save-at K] [--resume CKPT]

``accelerator.prepare(model, optimizer, loader)`` then ``prepare_loader(accelerator, loader)``; one epoch of training steps. Writes
``OUT/rank-R.json``: whether prepare returned the loader itself, ``len`` of the prepared
loader, the device of every batch's tensor and each batch's keys. ``--save-at K``:
``accelerator.save_state(OUT/ckpt)`` after batch K (the epoch goes on); ``--resume CKPT``:
``accelerator.load_state(CKPT)`` before iterating.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ddp_steps import exit_done, leave_group  # noqa: E402

import wdstream  # noqa: E402
from wdstream.integrations.accelerate import prepare_loader  # noqa: E402


def features(sample):
    record = sample["json"]
    return {"__key__": sample["__key__"],
            "x": np.array([record["shard"], record["index"]], dtype=np.float32)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--resume")
    args = p.parse_args()

    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = wdstream.StreamingDataset(args.data, seed=5, shuffle_window=8, map=features)
    loader = wdstream.DataLoader(dataset, batch_size=4, num_workers=args.workers)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    prepared = prepare_loader(accelerator, prepared)
    if args.resume:
        accelerator.load_state(args.resume)
    record = {"same": prepared is loader, "len": len(prepared), "devices": [], "keys": [],
              "world": accelerator.num_processes}
    for step, batch in enumerate(prepared, start=1):
        loss = model(batch["x"]).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        record["devices"].append(str(batch["x"].device))
        record["keys"].append(list(batch["__key__"]))
        if step == args.save_at:
            accelerator.save_state(os.path.join(args.out, "ckpt"))
    rank = accelerator.process_index
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(record, f)
    leave_group()
    accelerator.end_training()


if __name__ == "__main__":
    main()
    exit_done()
