"""The loader's resume state: a few integers, JSON-serialisable, whatever the dataset size.

Per worker stream, the position the training loop has received and the batches it has had;
the epoch, the layout (world size, workers, batch size, ``drop_last``) and the segments of
this epoch consumed under other layouts (``HistorySegment``). ``make_state`` writes one,
``check_loadable`` decides whether a dataset can resume from one, every value of it bounded
by what the dataset allows before any plan is made (``check_bounds``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from wdstream.errors import StateError
from wdstream.stream.load.contract import Trackable
from wdstream.stream.plan.epoch import (
    COUNT_LIMIT,
    EPOCH_LIMIT,
    RANKS,
    HistorySegment,
    PlanOptions,
    is_count,
)

STATE_FORMAT = "wdstream.loader"  # the state format's name, not the module path
STATE_VERSION = 1
# The streams (world x workers) of all of a state's layouts together: a job of 8192 ranks x 8
# workers, few enough that an elastic re-plan over them ends within a minute (docs/security.md).
MAX_STREAMS = 1 << 16
MAX_DEPTH = 16  # how deeply a state's values may nest (positions of stages over stages)

_STATE_TYPES = {
    "format": str, "version": int, "fingerprint": str, "seed": int, "epoch": int, "world": int,
    "workers": int, "batch_size": int, "drop_last": bool, "positions": list, "batches": list,
    "history": list,
}


def make_state(dataset: Trackable, *, epoch: int, world: int, workers: int, batch_size: int,
               drop_last: bool, positions: Sequence, batches: Sequence[int],
               history: Sequence[HistorySegment], rank: int) -> dict:
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": dataset.fingerprint(),
        "seed": dataset.options.seed,
        "epoch": epoch,
        "world": world,
        "workers": workers,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "positions": list(positions),
        "batches": list(batches),
        "history": [segment.to_list() for segment in history],
        "rank": rank,
    }


def resume_history(state: dict, world: int, workers: int, batch_size: int,
                   drop_last: bool) -> tuple[tuple[HistorySegment, ...], bool]:
    """The segments of the state's epoch that a resume on this layout leaves out: the state's
    history, and its own segment if the layout changed; and whether it changed."""
    history = tuple(HistorySegment.from_list(s) for s in state["history"])
    saved = (state["world"], state["workers"], state["batch_size"], state["drop_last"])
    changed = saved != (world, workers, batch_size, drop_last)
    if changed:
        history += (HistorySegment(state["world"], state["workers"], state["batch_size"],
                                   tuple(state["positions"])),)
    return history, changed


def check_loadable(state, dataset: Trackable, *, world: int, rank: int, workers: int,
                   batch_size: int) -> None:
    """Refuse a malformed state, or one of another dataset or seed, or one this dataset cannot
    resume on this layout (``StateError``). Everything a resume loops over is bounded here,
    before any plan is made."""
    validate(state)
    if state["seed"] != dataset.options.seed:
        raise StateError(f"the state was saved with seed {state['seed']}, this dataset "
                         f"uses seed {dataset.options.seed}")
    if state["fingerprint"] != dataset.fingerprint():
        raise StateError("the state belongs to another dataset or other shuffle options "
                         f"(fingerprint {state['fingerprint']} != {dataset.fingerprint()})")
    check_bounds(state, dataset)
    layout_changed = (state["world"], state["workers"], state["batch_size"]) != (
        world, workers, batch_size)
    if (state["history"] or layout_changed) and not dataset.has_counts \
            and not getattr(dataset, "resumes_unsized", False):
        needs = getattr(dataset, "counts_setting", "a manifest")
        raise StateError(f"{dataset.source}: resuming on another layout needs {needs}")
    elastic = getattr(dataset, "elastic", None)
    if elastic is None:
        elastic = all(isinstance(p, int) for p in state["positions"])
    if layout_changed and not elastic:
        raise StateError("this pipeline's positions are not sample counts: resume it with "
                         f"the layout it was saved with ({state['world']} ranks x "
                         f"{state['workers']} workers, batch {state['batch_size']})")
    per_rank = getattr(dataset, "positions_per_rank", False)  # else the same on every rank
    if not layout_changed and state.get("rank", rank) != rank and per_rank and \
            not all(isinstance(p, int) or _gathered(p) for p in state["positions"]):
        raise StateError(f"this is rank {state['rank']}'s state, and this pipeline's "
                         "positions are each rank's own (not sample counts): load rank "
                         f"{rank}'s own state here")


def _gathered(position) -> bool:
    """A position that holds every rank's (a stage's, see ``stream.load.ranks.gather_positions``)."""
    return isinstance(position, dict) and RANKS in position


def check_bounds(state: dict, dataset: Trackable) -> None:
    """The layouts of a (valid) state within what the dataset allows, and every position one
    the dataset can start from (its ``check_position``, when it has one)."""
    samples = dataset_samples(dataset)
    layouts = [("", state["world"], state["workers"])] + [
        (f"history[{i}] ", segment[0], segment[1]) for i, segment in enumerate(state["history"])]
    for where, world, workers in layouts:
        for key, value in (("world", world), ("workers", workers)):
            if samples is not None and value > max(samples, 1):
                raise StateError(f"loader state: {where}{key!r} is {value}, more than the "
                                 f"{samples} samples of an epoch of {dataset.source}")
    streams = sum(world * workers for _where, world, workers in layouts)
    if streams > MAX_STREAMS:
        raise StateError(f"loader state: its layouts have {streams} streams (world x workers) "
                         f"in all, more than {MAX_STREAMS}")
    check = getattr(dataset, "check_position", None)
    if check is None:
        return
    for position in state["positions"]:
        check(position, state["world"])
    for segment in state["history"]:
        for position in segment[3]:
            check(position, segment[0])


def dataset_samples(dataset) -> int | None:
    """Samples of an epoch of the ``StreamingDataset``s the dataset reads, or None if one
    has no manifest."""
    counts = [d.epoch_samples() for d in _streaming_datasets(dataset)]
    if not counts or None in counts:
        return None
    return sum(counts)


def validate(state) -> None:
    """The state's keys, their types and their consistency (``StateError``)."""
    if not isinstance(state, dict):
        raise StateError(f"a loader state is a dict, not {type(state).__name__}")
    for key, kind in _STATE_TYPES.items():
        if key not in state:
            raise StateError(f"loader state: missing key {key!r}")
        if type(state[key]) is not kind:
            raise StateError(f"loader state: {key!r} must be {kind.__name__}, "
                             f"not {type(state[key]).__name__}")
    if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
        raise StateError(f"not a wdstream loader state (format {state['format']!r:.80}, "
                         f"version {state['version']})")
    for key in ("seed", "batch_size", *(("rank",) if "rank" in state else ())):
        _check_count(key, state[key])
    _check_count("epoch", state["epoch"], EPOCH_LIMIT)
    _check_layout("", state["world"], state["workers"])
    if "rank" in state and state["rank"] >= state["world"]:
        raise StateError(f"loader state: 'rank' is {state['rank']}, not below 'world' "
                         f"({state['world']})")
    for key in ("positions", "batches"):
        if len(state[key]) != state["workers"]:
            raise StateError(f"loader state: {key!r} needs one entry per worker "
                             f"({state['workers']}), not {len(state[key])}")
    for batches in state["batches"]:
        _check_count("batches", batches)
    _check_values("positions", state["positions"])
    for index, segment in enumerate(state["history"]):
        _check_segment(f"history[{index}]", segment)


def _check_count(key: str, value, limit: int = COUNT_LIMIT, least: int = 0) -> None:
    if not is_count(value) or not least <= value < limit:
        raise StateError(f"loader state: {key!r} must be an integer from {least} to "
                         f"{limit - 1}, not {value!r:.40}")


def _check_layout(where: str, world, workers) -> None:
    _check_count(f"{where}world", world, least=1)
    _check_count(f"{where}workers", workers, least=1)


def _check_segment(where: str, segment) -> None:
    """A history segment: ``[world, workers, batch size, one position per worker]``."""
    if not isinstance(segment, list) or len(segment) != 4 or not isinstance(segment[3], list):
        raise StateError(f"loader state: {where} must be [world, workers, batch size, "
                         f"positions], not {segment!r:.80}")
    world, workers, batch_size, consumed = segment
    _check_layout(f"{where} ", world, workers)
    _check_count(f"{where} batch size", batch_size)
    if len(consumed) != workers:
        raise StateError(f"loader state: {where} needs one position per worker ({workers}), "
                         f"not {len(consumed)}")
    _check_values(where, consumed)


def _check_values(key: str, value) -> None:
    """Positions hold counts, ``"end"`` and packed strings, ``None`` (a rank's missing entry),
    lists and ``{"ranks": ...}``, at most ``MAX_DEPTH`` deep: nothing else."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise StateError(f"loader state: {key!r} is nested more than {MAX_DEPTH} deep")
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict) and list(item) == [RANKS]:
            stack.append((item[RANKS], depth + 1))
        elif not (is_count(item) or item is None or isinstance(item, str)):
            raise StateError(f"loader state: {key!r} holds {item!r:.40}, not a count from 0 "
                             f"to {COUNT_LIMIT - 1} or a position")


def _streaming_datasets(dataset) -> Iterator:
    """The datasets with an epoch plan's options, ``dataset`` itself or those its stages read."""
    if isinstance(getattr(dataset, "options", None), PlanOptions):
        yield dataset
    inner = getattr(dataset, "inner", None)
    if callable(inner):
        for d in inner():
            yield from _streaming_datasets(d)
