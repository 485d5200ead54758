"""The loader's resume state: a few integers, JSON-serialisable, whatever the dataset size.

Per worker stream, the position the training loop has received and the batches it has had;
the epoch, the layout (world size, workers, batch size, ``drop_last``) and the segments of
this epoch consumed under other layouts (``HistorySegment``). ``make_state`` writes one,
``check_loadable`` decides whether a dataset can resume from one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from wdstream.errors import StateError
from wdstream.stream.contract import Trackable
from wdstream.stream.plan import HistorySegment, PlanOptions

STATE_FORMAT = "wdstream.loader"  # the state format's name, not the module path
STATE_VERSION = 1

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


def check_loadable(state, dataset: Trackable, *, world: int, rank: int, workers: int,
                   batch_size: int) -> None:
    """Refuse a malformed state, or one of another dataset or seed, or one this dataset cannot
    resume on this layout (``StateError``)."""
    validate(state)
    if state["seed"] != dataset.options.seed:
        raise StateError(f"the state was saved with seed {state['seed']}, this dataset "
                         f"uses seed {dataset.options.seed}")
    if state["fingerprint"] != dataset.fingerprint():
        if saved_with_fixed_windows(state["fingerprint"], dataset):
            raise StateError(OLDER_ORDER)
        raise StateError("the state belongs to another dataset or other shuffle options "
                         f"(fingerprint {state['fingerprint']} != {dataset.fingerprint()})")
    layout_changed = (state["world"], state["workers"], state["batch_size"]) != (
        world, workers, batch_size)
    if (state["history"] or layout_changed) and not dataset.has_counts:
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
    """A position that holds every rank's (a stage's, see ``stages.base.gather_positions``)."""
    from wdstream.stages.base import RANKS

    return isinstance(position, dict) and RANKS in position


def validate(state) -> None:
    """The state's keys, their types and their consistency (``StateError``)."""
    if not isinstance(state, dict):
        raise StateError(f"a loader state is a dict, not {type(state).__name__}")
    for key, kind in _STATE_TYPES.items():
        if key not in state:
            raise StateError(f"loader state: missing key {key!r}")
        if not isinstance(state[key], kind) or (kind is int and isinstance(state[key], bool)):
            raise StateError(f"loader state: {key!r} must be {kind.__name__}, "
                             f"not {type(state[key]).__name__}")
    if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
        raise StateError(f"not a wdstream loader state (format {state['format']!r}, "
                         f"version {state['version']})")
    if state["world"] < 1 or state["workers"] < 1 or state["epoch"] < 0:
        raise StateError("loader state: world, workers must be >= 1 and epoch >= 0")
    for key in ("positions", "batches"):
        if len(state[key]) != state["workers"]:
            raise StateError(f"loader state: {key!r} needs one entry per worker")
    if not all(isinstance(b, int) and b >= 0 for b in state["batches"]):
        raise StateError("loader state: 'batches' must be counts >= 0")
    for segment in state["history"]:
        try:
            parsed = HistorySegment.from_list(segment)
        except (TypeError, ValueError) as error:
            raise StateError(f"loader state: bad history segment {segment!r}") from error
        if len(parsed.consumed) != parsed.workers or parsed.world < 1:
            raise StateError(f"loader state: bad history segment {segment!r}")


OLDER_ORDER = (
    "the state was saved by an older wdstream, whose shuffle order differs: its shuffle "
    "windows all held shuffle_window samples, while this one's windows grow from shuffle_start "
    "samples at the start of each stream. To resume this state exactly where it stopped, build "
    "the dataset(s) with shuffle_start=None (windows of one size, the older order); or start "
    "the epoch again without the state")


def saved_with_fixed_windows(fingerprint: str, dataset) -> bool:
    """Whether ``fingerprint`` is what a wdstream whose shuffle windows did not grow gave
    ``dataset`` (its ``StreamingDataset``s, also inside stages, built with
    ``shuffle_start=None``), while ``dataset`` itself has growing windows."""
    growing = [d for d in _streaming_datasets(dataset) if d.options.schedule.growing]
    if not growing:
        return False
    kept = [d.options for d in growing]
    try:
        for d in growing:
            d.options = replace(d.options, start=None)
        return fingerprint == dataset.fingerprint()
    finally:
        for d, options in zip(growing, kept, strict=True):
            d.options = options


def _streaming_datasets(dataset) -> Iterator:
    """The datasets with an epoch plan's options, ``dataset`` itself or those its stages read."""
    if isinstance(getattr(dataset, "options", None), PlanOptions):
        yield dataset
    inner = getattr(dataset, "inner", None)
    if callable(inner):
        for d in inner():
            yield from _streaming_datasets(d)
