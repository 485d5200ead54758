"""The loader's state in a framework's checkpoint folder: one file per rank.

Under DDP ranks consume batches in lockstep, so for a ``StreamingDataset`` rank 0's state
describes every rank; the positions of stages such as ``PackedSequences`` and ``Mix`` are
each rank's own, though. So every rank writes its state (``wdstream_loader-rank{R}.json``), and
on resume a rank loads its own when the world size is the same, else rank 0's (elastic resume,
which stages refuse with a ``StateError``)."""

from __future__ import annotations

import json
import os

from wdstream.errors import StateError
from wdstream.stream.contract import world_info

STATE_NAME = "wdstream_loader-rank{rank}.json"


def state_path(folder, rank: int) -> str:
    return os.path.join(os.fspath(folder), STATE_NAME.format(rank=rank))


def save_loader_state(loader, folder) -> str:
    """Write this rank's loader state into ``folder`` (atomically); returns the path.

    Args:
        loader (wdstream.DataLoader): the loader whose ``state_dict()`` is written.
        folder (path): the checkpoint folder; the file is ``wdstream_loader-rank{R}.json``.
    """
    rank, _world = world_info()
    path = state_path(folder, rank)
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(loader.state_dict(), f)
    os.replace(temporary, path)
    return path


def load_loader_state(loader, folder) -> None:
    """Load into ``loader`` this rank's state from ``folder``, or rank 0's on another world
    size.

    Args:
        loader (wdstream.DataLoader): the loader to resume.
        folder (path): the checkpoint folder ``save_loader_state`` wrote into.
    """
    rank, world = world_info()
    own = _read(state_path(folder, rank), required=False)
    if own is not None and own.get("world") == world:
        loader.load_state_dict(own)
        return
    first = _read(state_path(folder, 0), required=True)
    loader.load_state_dict(first)


def _read(path: str, required: bool) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        if not required:
            return None
        raise StateError(f"{path}: no wdstream loader state in this checkpoint") from None
    except (OSError, ValueError) as error:
        raise StateError(f"{path}: cannot read the loader state: {error}") from error
