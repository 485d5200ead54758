"""A DDP-style training loop over wdstream, run by tests/integrations/test_ddp.py under torchrun:

    python -m torch.distributed.run --nproc_per_node=N --master_addr=127.0.0.1 \
        --master_port=PORT tests/support/ddp_job.py --url s3://bucket/prefix/ --out DIR [options]

Every rank (gloo backend, CPU) builds the same ``StreamingDataset`` and ``DataLoader``,
optionally loads rank 0's checkpointed loader state, and iterates one epoch. After each batch
the ranks do an ``all_reduce`` as DDP's gradient sync would: the ranks advance in lockstep,
and a rank that runs out of batches early is detected (it contributes 0 where the others
contribute 1) instead of hanging. Outputs, in DIR:

- ``meta-RANK.json``: world size, workers, ``len(loader)``, ``len(dataset)``, the remainder
  of a whole epoch on this layout, and the batch index the run resumed from; written before
  the first batch.
- ``rank-RANK.jsonl``: one line ``{"batch": i, "keys": [...]}`` per batch, flushed and fsynced
  before the next one. ``i`` counts batches of the epoch across resumed runs (1-based).
- ``done-RANK.json``: batches delivered by this run, written after the epoch ended cleanly.
- the checkpoint (``--checkpoint``): rank 0 writes ``{"batch": i, "loader": state}``
  atomically (temporary file + ``os.replace``) every ``--every`` batches; with
  ``--keep-checkpoints`` also a copy per checkpoint, ``NAME-BATCH.json``.

``--die-at N --die-rank R``: rank R kills itself with SIGKILL right after logging batch N.
"""

from __future__ import annotations

import argparse
import os
import sys

from ddp_steps import die_on_cue, finish, join_group, lockstep, log_line, resume, write_json_atomic


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True, help="folder for the per-rank logs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=8, help="shuffle_window")
    p.add_argument("--shuffle-start", type=int, default=None,
                   help="shuffle_start (default: the dataset's)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--checkpoint", help="JSON checkpoint file rank 0 writes")
    p.add_argument("--every", type=int, default=0, help="checkpoint every K batches (0: never)")
    p.add_argument("--resume", help="load the loader state from this checkpoint on every rank")
    p.add_argument("--die-at", type=int, default=None)
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="also keep each checkpoint as NAME-BATCH.json")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    p.add_argument("--share", default=None,
                   help="share_manifest's folder (default: the dataset's default)")
    return p.parse_args(argv)


def count_footers() -> list[str]:
    """The Parquet footers this process reads from now on (their URLs)."""
    from wdstream.tables import parquet

    read, footers = parquet.read_footer, []

    def counted(file, access):
        footers.append(file.url)
        return read(file, access)

    parquet.read_footer = counted
    return footers


def main(argv=None) -> int:
    args = parse_args(argv)
    import wdstream

    rank, world = join_group(args.timeout)
    os.makedirs(args.out, exist_ok=True)

    start = {} if args.shuffle_start is None else {"shuffle_start": args.shuffle_start}
    if args.share is not None:
        start["share_manifest"] = args.share
    footers = count_footers()
    ds = wdstream.StreamingDataset(args.url, seed=args.seed, shuffle_window=args.window,
                                   **start)
    loader = wdstream.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    resumed_from = resume(loader, args.resume)  # rank 0's state, on every rank
    write_json_atomic(os.path.join(args.out, f"meta-{rank}.json"), {
        "rank": rank, "world": world, "workers": args.workers, "len_loader": len(loader),
        "len_dataset": len(ds), "resumed_from": resumed_from, "footers_read": len(footers),
        # the remainder of a whole epoch on this layout, as the plan reports it
        "remainder": ds.plan(ds.next_epoch(), world, max(1, args.workers)).remainder_samples})

    index, delivered = resumed_from, 0
    with open(os.path.join(args.out, f"rank-{rank}.jsonl"), "a") as log:
        for batch in loader:
            index += 1
            delivered += 1
            # Every rank contributes 1 per batch; a rank already past its last batch
            # contributes 0 below, so unequal batch counts show up as a sum below `world`.
            if lockstep(1.0) != world:
                print(f"rank {rank}: another rank ran out of batches before batch {index}",
                      file=sys.stderr, flush=True)
                return 3
            log_line(log, {"batch": index, "keys": list(batch["__key__"])})
            die_on_cue(args.die_at, args.die_rank, index, rank)
            if rank == 0 and args.checkpoint and args.every and index % args.every == 0:
                checkpoint = {"batch": index, "loader": loader.state_dict()}
                write_json_atomic(args.checkpoint, checkpoint)
                if args.keep_checkpoints:
                    base, ext = os.path.splitext(args.checkpoint)
                    write_json_atomic(f"{base}-{index}{ext}", checkpoint)
    if lockstep(0.0) != 0:
        print(f"rank {rank}: ran out of batches after {delivered} while another rank had more",
              file=sys.stderr, flush=True)
        return 3
    return finish(os.path.join(args.out, f"done-{rank}.json"),
                  {"rank": rank, "delivered": delivered, "last_batch": index})


if __name__ == "__main__":
    sys.exit(main())
