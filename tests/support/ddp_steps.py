"""The steps the torchrun job scripts (ddp_job.py, ddp_llm_job.py) share: join the gloo group,
resume from rank 0's checkpoint, advance in lockstep, log each batch durably, die on cue,
write a file atomically, and finish together; the trainer jobs (hf_trainer_job.py,
lightning_job.py) leave the group and the process as these do."""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from typing import NoReturn


def join_group(timeout: float = 60.0) -> tuple[int, int]:
    """Join the gloo process group torchrun describes; (rank, world size)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()


def resume(loader, checkpoint: str | None) -> int:
    """Load rank 0's checkpointed loader state (on every rank); the batch it was taken after
    (0 without a checkpoint)."""
    if not checkpoint:
        return 0
    with open(checkpoint) as f:
        saved = json.load(f)
    loader.load_state_dict(saved["loader"])
    return int(saved["batch"])


def lockstep(value: float) -> float:
    """The sum of ``value`` over the ranks, as DDP's gradient sync would meet them."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value])
    dist.all_reduce(tensor)
    return float(tensor.item())


def log_line(log, record: dict) -> None:
    """One JSON line, flushed and fsynced before the next batch."""
    log.write(json.dumps(record) + "\n")
    log.flush()
    os.fsync(log.fileno())


def die_on_cue(die_at: int | None, die_rank: int, index: int, rank: int) -> None:
    """SIGKILL this rank right after batch ``die_at`` when it is ``die_rank``."""
    if die_at == index and rank == die_rank:
        os.kill(os.getpid(), signal.SIGKILL)


def write_json_atomic(path: str, value) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def leave_group() -> None:
    """Wait for the other ranks and leave the process group, if this process is in one:
    gloo's threads then end cleanly, not at exit."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_done() -> NoReturn:
    """End a job whose results are written and whose group is left, without the interpreter's
    teardown: torch's C++ threads (gloo's, the store's) can still be joinable then, which
    aborts the process (std::terminate, SIGABRT) after a job that succeeded."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def finish(path: str, record: dict) -> int:
    """Write this rank's ``done`` record, wait for the others, leave the group; 0."""
    write_json_atomic(path, record)
    leave_group()
    return 0
