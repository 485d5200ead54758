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
from wdstream.limits import json_loads, size_limit, size_variable
from wdstream.sources.local_files import read_regular
from wdstream.stream.load.contract import world_info

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
    size. A state file is read as data (``_read``); a state the loader refuses is a
    ``StateError`` naming the file.

    Args:
        loader (wdstream.DataLoader): the loader to resume.
        folder (path): the checkpoint folder ``save_loader_state`` wrote into.
    """
    rank, world = world_info()
    path = state_path(folder, rank)
    own = _read(path, required=False)
    if own is None or own.get("world") != world:
        path = state_path(folder, 0)
        own = _read(path, required=True)
    try:
        loader.load_state_dict(own)
    except StateError as error:
        raise StateError(f"{path}: {error}") from error


def _read(path: str, required: bool) -> dict | None:
    """The JSON object in the state file at ``path``, read within bounds: a regular file only
    (opened without blocking: a FIFO there cannot hang the resume), of at most the "object"
    size limit (checked before it is read), nested at most ``limits.MAX_DEPTH`` levels; a
    ``StateError`` naming the file for anything else."""
    if not required and not os.path.lexists(path):
        return None
    if not os.path.lexists(path):
        raise StateError(f"{path}: no wdstream loader state in this checkpoint")
    try:
        data = read_regular(path, size_limit("object"), error=StateError,
                            what="a loader state", setting=size_variable("object"))
        state = json_loads(data)
    except (ValueError, RecursionError) as error:  # not UTF-8 or JSON, nested too deep
        raise StateError(f"{path}: cannot read the loader state: {error}") from error
    if not isinstance(state, dict):
        raise StateError(f"{path}: a loader state is a JSON object, not "
                         f"{type(state).__name__}")
    return state
