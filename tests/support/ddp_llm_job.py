"""A DDP-style loop over packed pre-tokenized documents, run by tests/integrations/test_ddp_llm.py under
torchrun (gloo, CPU):

    python -m torch.distributed.run --nproc_per_node=N --master_addr=127.0.0.1 \
        --master_port=PORT tests/support/ddp_llm_job.py --data DIR --out DIR [options]

Every rank builds ``PackedSequences`` over a ``Mix`` of the token datasets under DIR (``x``
and ``y``, ``tokens.npy`` members), optionally loads rank 0's checkpointed loader state, and
iterates one epoch in lockstep (an ``all_reduce`` per batch, as DDP's gradient sync). Each
batch's token ids go to ``rank-RANK.jsonl`` (``{"batch": i, "ids": [...]}``, fsynced).
Every ``--every`` batches every rank calls ``loader.state_dict()`` (it gathers the ranks'
positions) and rank 0 writes ``{"batch": i, "loader": state}`` to ``--checkpoint``.
``--die-at N --die-rank R``: rank R kills itself with SIGKILL right after batch N.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ddp_steps import die_on_cue, finish, join_group, lockstep, log_line, resume, write_json_atomic


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--per-epoch", type=int, default=80)
    p.add_argument("--checkpoint")
    p.add_argument("--every", type=int, default=0)
    p.add_argument("--resume")
    p.add_argument("--die-at", type=int)
    p.add_argument("--die-rank", type=int, default=1)
    args = p.parse_args(argv)
    import wdstream

    rank, world = join_group()
    os.makedirs(args.out, exist_ok=True)
    sources = [wdstream.StreamingDataset(os.path.join(args.data, name), seed=3 + i,
                                         shuffle_window=5) for i, name in enumerate("xy")]
    mixture = wdstream.Mix(sources, [0.6, 0.4], seed=2, names=["x", "y"])
    packed = wdstream.PackedSequences(mixture, None, args.seq_len, eos=0,
                                      text_field="tokens.npy", sequences_per_epoch=args.per_epoch)
    loader = wdstream.DataLoader(packed, batch_size=args.batch_size, num_workers=args.workers)
    index = resume(loader, args.resume)  # rank 0's state, on every rank
    with open(os.path.join(args.out, f"meta-{rank}.json"), "w") as f:
        json.dump({"len_loader": len(loader), "resumed_from": index}, f)
    with open(os.path.join(args.out, f"rank-{rank}.jsonl"), "a") as log:
        for batch in loader:
            index += 1
            if lockstep(1.0) != world:
                return 3
            log_line(log, {"batch": index, "ids": batch["input_ids"].flatten().tolist()})
            die_on_cue(args.die_at, args.die_rank, index, rank)
            if args.checkpoint and args.every and index % args.every == 0:
                state = loader.state_dict()  # every rank: it gathers their positions
                if rank == 0:
                    write_json_atomic(args.checkpoint, {"batch": index, "loader": state})
    if lockstep(0.0) != 0:
        return 3
    return finish(os.path.join(args.out, f"done-{rank}.json"), {"last_batch": index})


if __name__ == "__main__":
    sys.exit(main())
