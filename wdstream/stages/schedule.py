"""Mixture schedules: the weights of a ``Mix`` changing over training, by stages ``{"start":
samples drawn over the job, "weights": [...]}`` (progress that is the same on every rank and
layout, so a schedule resumes elastically), applied per block of draws; or by tokens
(``"start_tokens"``), counted by the ``TokenClock`` of a ``PackedSequences`` over the
mixture, the stage in force taken at each draw. See docs/llm.md."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np

from wdstream.errors import InputError
from wdstream.printable import short_repr

_LARGEST = float(1 << 63)  # a weight's largest value: an int beyond a float's range overflows


class ProgressSchedule:
    """Weights given by a function of progress (samples drawn over the job), called once per
    block of draws: ``lambda drawn: [0.7, 0.3] if drawn < 10**6 else [0.5, 0.5]``. It must be
    a pure function (every rank and worker calls it); the fingerprint records its name only."""

    def __init__(self, function, count: int):
        self.function, self.count = function, count
        self.weights = [normalise(function(0), count, "schedule(0)")]

    def weights_at(self, progress: int) -> np.ndarray:
        return normalise(self.function(progress), self.count, f"schedule({progress})")

    def identity(self) -> str:
        f = self.function
        return f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', type(f).__name__)}"

    def ever_positive(self) -> np.ndarray:
        return np.ones(self.count, dtype=bool)  # unknown: any source may come


START_KEYS = {"start": "samples", "start_tokens": "tokens"}  # a stage's start, by its unit


def _stage(index: int, stage, count: int) -> tuple:
    """``(start, normalised weights, unit or None)`` of stage ``index``: a mapping or a
    pair."""
    unit = None
    if isinstance(stage, Mapping):
        unknown = set(stage) - {"weights", *START_KEYS}
        if unknown:
            shown = short_repr(min(unknown, key=str), 80)
            raise InputError(f"schedule[{index}]: unknown key {shown} "
                             "(a stage has 'start' or 'start_tokens', and 'weights')")
        if "weights" not in stage:
            raise InputError(f"schedule[{index}]: 'weights' is missing")
        keys = [k for k in START_KEYS if k in stage]
        if len(keys) > 1:
            raise InputError(f"schedule[{index}]: 'start' or 'start_tokens', not both")
        unit = START_KEYS[keys[0]] if keys else None
        start, weights = stage.get(keys[0], 0) if keys else 0, stage["weights"]
    else:
        try:
            start, weights = stage
        except (TypeError, ValueError):
            raise InputError(f"schedule[{index}]: a stage is {{start, weights}} or a "
                             f"(start, weights) pair, not {short_repr(stage, 80)}") from None
    return _start(index, start), normalise(weights, count, f"schedule[{index}]"), unit


def _start(index: int, start) -> int:
    if isinstance(start, float) and start.is_integer():
        start = int(start)  # 2e9 tokens
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise InputError(f"schedule[{index}]: the start must be an integer >= 0 "
                         f"(samples drawn or tokens delivered), not {short_repr(start, 80)}")
    return start


class Schedule:
    """Stages ``(start, weights)`` (pairs, ``{"start", "weights"}`` mappings, or one mapping
    {start: weights}), the starts increasing from 0; weights normalised. ``unit``: what the
    starts count, ``"samples"`` drawn (``start``) or ``"tokens"`` delivered (``start_tokens``,
    in sequences packed from the mixture by ``PackedSequences``)."""

    def __init__(self, stages, count: int, unit: str | None = None):
        if isinstance(stages, Schedule):
            unit = stages.unit
            stages = [(s, w.tolist()) for s, w in zip(stages.starts, stages.weights, strict=True)]
        items = list(stages.items()) if isinstance(stages, Mapping) else list(stages)
        if not items:
            raise InputError("schedule: needs at least one stage")
        parsed = [_stage(index, stage, count) for index, stage in enumerate(items)]
        units = {u for _, _, u in parsed if u is not None}
        if unit is not None:
            if unit not in START_KEYS.values():
                raise InputError(f"schedule_by: 'samples' or 'tokens', not {unit!r}")
            units.add(unit)
        if len(units) > 1:
            raise InputError("schedule: the stages' starts count samples ('start') or tokens "
                             "('start_tokens'), not both")
        starts = [s for s, _, _ in parsed]
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            raise InputError(f"schedule: the starts must begin at 0 and increase, not {starts}")
        self.unit: str = units.pop() if units else "samples"
        self.starts: list[int] = starts
        self.weights: list[np.ndarray] = [w for _, w, _ in parsed]

    def stage_at(self, progress: int) -> int:
        return bisect.bisect_right(self.starts, progress) - 1

    def weights_at(self, progress: int) -> np.ndarray:
        return self.weights[self.stage_at(progress)]

    def identity(self) -> list:
        """What the fingerprint records: the stages, and the unit unless it is samples."""
        stages = [[s, w.tolist()] for s, w in zip(self.starts, self.weights, strict=True)]
        return stages if self.unit == "samples" else [self.unit, stages]

    def ever_positive(self) -> np.ndarray:
        return np.any(np.stack(self.weights) > 0, axis=0)


def make_schedule(schedule, count: int, unit: str | None = None):
    """A ``Schedule`` from stages, or a ``ProgressSchedule`` from a callable (of samples)."""
    if callable(schedule) and not isinstance(schedule, Schedule):
        if unit not in (None, "samples"):
            raise InputError("schedule: a function of progress counts samples drawn; a "
                             "schedule by tokens is a list of stages {start_tokens, weights}")
        return ProgressSchedule(schedule, count)
    return Schedule(schedule, count, unit)


class TokenClock:
    """How far a packing stream is, for a ``Mix`` whose schedule counts tokens: the stage in
    force for the stream's next draw. The packing stage sets ``stage`` at each sequence it
    delivers, from the tokens delivered over the job, counted as ``before + sequences *
    step`` (``step``: seq_len x world x workers; ``before``: the tokens delivered on earlier
    layouts), the same on every rank for the same stream and count."""

    __slots__ = ("schedule", "before", "step", "stage", "sequences", "_next")

    def __init__(self, schedule: Schedule, before: int, step: int):
        self.schedule, self.before, self.step = schedule, before, step
        self.stage, self.sequences, self._next = 0, 0, 0
        self.at(0)

    def stage_at(self, sequences: int) -> int:
        return self.schedule.stage_at(self.before + sequences * self.step)

    def at(self, sequences: int) -> None:
        """The stream has delivered ``sequences`` (never fewer than at the last call): the
        stage from now on."""
        self.sequences = sequences
        if sequences >= self._next:
            self.stage = self.stage_at(sequences)
            starts = self.schedule.starts
            if self.stage + 1 < len(starts):  # the first count of the next stage
                self._next = -(-(starts[self.stage + 1] - self.before) // self.step)
            else:
                self._next = 1 << 62


def normalise(weights: Sequence[float] | None, count: int, what: str = "Mix") -> np.ndarray:
    if weights is None:
        return np.full(count, 1.0 / count)
    values = list(weights)
    if len(values) != count:
        raise InputError(f"{what}: {len(values)} weights for {count} datasets")
    for index, weight in enumerate(values):
        if isinstance(weight, bool) or not isinstance(weight, int | float) \
                or not 0 <= weight <= _LARGEST:  # also NaN and infinities
            raise InputError(f"{what}: weight {index} must be a finite number >= 0 (at most "
                             f"2**63), not {short_repr(weight, 80)}")
    total = float(sum(values))
    if total <= 0:
        raise InputError(f"{what}: the weights must add up to a positive number")
    return np.asarray(values, dtype=np.float64) / total


def mixture_weights(config: Mapping, names: Sequence[str], weights: Sequence[float],
                    where: str) -> dict:
    """The ``Mix`` arguments for a config's weights: the datasets' ``weight``s, or a top-level
    ``schedule`` whose stages give ``weights`` by dataset name (a source a stage does not
    name gets 0)::

        schedule:
          - {start: 0, weights: {web: 0.9, code: 0.1}}
          - {start: 2000000, weights: {web: 0.5, code: 0.5}}

    (``start_tokens`` in place of ``start``: by tokens delivered, for a packed mixture.)
    """
    stages = config.get("schedule")
    if stages is None:
        return {"weights": list(weights)}
    if not isinstance(stages, list) or not stages:
        raise InputError(f"{where}: 'schedule' must be a non-empty list of stages")
    parsed = []
    for index, stage in enumerate(stages):
        label = f"{where}: schedule[{index}]"
        if not isinstance(stage, Mapping) or not isinstance(stage.get("weights"), Mapping):
            raise InputError(f"{label}: a stage is a mapping with 'start' (or "
                             "'start_tokens') and 'weights' "
                             "{dataset name: weight}")
        unknown = [name for name in stage["weights"] if name not in names]
        if unknown:
            raise InputError(f"{label}: no dataset named {unknown[0]!r} (names: {list(names)})")
        weights_by_name = [stage["weights"].get(name, 0) for name in names]
        starts = {key: stage[key] for key in START_KEYS if key in stage}
        unknown_keys = set(stage) - {"weights", *START_KEYS}
        if unknown_keys:
            shown = short_repr(min(unknown_keys, key=str), 80)
            raise InputError(f"{label}: unknown key {shown} (a stage has "
                             "'start' or 'start_tokens', and 'weights')")
        parsed.append({**(starts or {"start": 0}), "weights": weights_by_name})
    try:
        return {"weights": None, "schedule": Schedule(parsed, len(names))}
    except InputError as error:
        raise InputError(f"{where}: {error}") from None
