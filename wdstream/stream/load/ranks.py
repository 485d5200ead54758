"""Positions gathered from every rank: a stage whose positions differ between ranks (packing)
has the loader gather them into its state (``gather_positions``), packed into one compact
string per stream, so that rank 0's state describes the whole job; each rank then starts from
its own entry (``rank_position``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

from wdstream.errors import StateError
from wdstream.stream.plan.epoch import RANKS, STREAM_END


def rank_position(value, rank: int):
    """This rank's start position: ``value`` itself, or its entry of a gathered position."""
    if not isinstance(value, dict):
        return value
    ranks = ranks_of(value)
    if not isinstance(ranks, list) or not 0 <= rank < len(ranks) or ranks[rank] is None:
        raise StateError(f"the state has no position for rank {rank}: save it with "
                         "loader.state_dict() called on every rank (it gathers them)")
    return ranks[rank]


def gather_positions(positions: Sequence, rank: int, world: int) -> list:
    """Every rank's positions, per stream, for a stage whose positions differ between ranks
    (packing): ``{"ranks": [rank 0's, rank 1's, ...]}``, so that rank 0's state describes
    the whole job. A collective under ``torch.distributed`` (every rank calls it, as it calls
    ``state_dict()``); without a process group only this rank's entry is known."""
    local = [rank_position(p, rank) for p in positions]
    if world == 1:
        return local
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gathered = all_gather_json(local, world)
    else:
        gathered = [local if r == rank else None for r in range(world)]
    return [{RANKS: pack_positions([g[k] if g is not None else None for g in gathered])}
            for k in range(len(local))]


# The tensors of the last gather, kept until the next: a gloo process group's thread lets go of
# a collective's tensors after the call has returned, and when it holds the last reference,
# freeing them takes the interpreter lock. A process that destroys the group meanwhile (a
# gc.collect after training, with the lock held) waits for that thread: a deadlock, which
# ``dist.all_gather_object``'s own tensors could cause.
_last_gather: list = []


def all_gather_json(value, world: int) -> list:
    """Every rank's ``value`` (JSON: nested lists, numbers, strings, None), in rank order."""
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":  # a collective of NCCL's takes tensors on the GPU
        device = torch.device("cuda", torch.cuda.current_device())
    data = json.dumps(value).encode()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    lengths = [int(n.item()) for n in sizes]
    longest = max(lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    mine = mine.to(device)
    gathered = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine)
    _last_gather[:] = [size, sizes, mine, gathered]
    return [json.loads(bytes(t[:n].cpu().numpy())) for t, n in
            zip(gathered, lengths, strict=True)]


# Gathered positions are stored packed: every rank's position of a stream (nested lists of
# integers >= 0, "end", None) as one string of varints, base64 without padding. Tags: 0 a
# list starts, 1 it ends, 2 "end", 3 None, n + 4 the integer n.
_BASE64_PAD = ("", "!", "==", "=")  # by length % 4; "!": no such length


def pack_positions(value) -> list | str:
    """``value`` as one compact string, or as it is if it holds anything else."""
    out = bytearray()

    def put(item) -> bool:
        if isinstance(item, list):
            out.append(0)
            if not all(put(v) for v in item):
                return False
            out.append(1)
        elif item is None or item == STREAM_END:
            out.append(3 if item is None else 2)
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            n = item + 4
            while n >= 0x80:
                out.append(n & 0x7F | 0x80)
                n >>= 7
            out.append(n)
        else:
            return False
        return True

    if not put(value):
        return value
    return base64.urlsafe_b64encode(bytes(out)).decode("ascii").rstrip("=")


def unpack_positions(text: str):
    """The value ``pack_positions`` packed into ``text``."""
    try:
        data = base64.urlsafe_b64decode(text + _BASE64_PAD[len(text) % 4])
    except (ValueError, TypeError):
        raise StateError(f"not a packed position: {text!r:.80}") from None
    stack: list[list] = [[]]
    index = 0
    while index < len(data):
        byte = data[index]
        index += 1
        if byte == 0:
            stack.append([])
        elif byte == 1:
            if len(stack) < 2:
                raise StateError(f"not a packed position: {text!r:.80}")
            done = stack.pop()
            stack[-1].append(done)
        elif byte in (2, 3):
            stack[-1].append(STREAM_END if byte == 2 else None)
        else:
            n, shift = 0, 0
            while byte & 0x80:
                if index >= len(data) or shift > 63:
                    raise StateError(f"not a packed position: {text!r:.80}")
                n |= (byte & 0x7F) << shift
                shift += 7
                byte = data[index]
                index += 1
            stack[-1].append((n | byte << shift) - 4)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise StateError(f"not a packed position: {text!r:.80}")
    return stack[0][0]


def ranks_of(value):
    """Every rank's positions in a gathered entry ``{"ranks": ...}`` (packed or a list)."""
    ranks = value.get(RANKS) if isinstance(value, dict) else None
    return unpack_positions(ranks) if isinstance(ranks, str) else ranks


def rank_entry(value, rank: int):
    """A position of ``rank`` in a (possibly gathered) entry; None if it has none."""
    if isinstance(value, dict):
        ranks = ranks_of(value) or []
        return ranks[rank] if rank < len(ranks) else None
    return None if value == STREAM_END else value
