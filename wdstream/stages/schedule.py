"""Mixture schedules: the weights of a ``Mix`` changing over training.

A schedule is a list of stages, each a start and weights: ``[{"start": 0, "weights": [7, 3]},
{"start": 900_000, "weights": [1, 1]}]``. ``start`` counts the samples the mixture drew in
the epoch, over every rank and worker (for a packed mixture, documents): progress that is the
same on every rank and does not depend on the layout, so a schedule resumes across a stage
boundary on another world size or worker count too.

A stream draws in blocks of ``mix.BLOCK`` draws; a block takes the weights of the stage in
force at its first draw, that is at global sample ``before + block * BLOCK * world * workers``
(``before``: the samples drawn on earlier layouts this epoch). Stages switch at a block
boundary, within ``BLOCK * world * workers`` samples of their start.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np

from wdstream.errors import InputError


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


class Schedule:
    """Stages ``(start, weights)`` (pairs, ``{"start", "weights"}`` mappings, or one mapping
    {start: weights}), the starts increasing from 0; weights normalised."""

    def __init__(self, stages, count: int):
        if isinstance(stages, Schedule):
            stages = [(s, w.tolist()) for s, w in zip(stages.starts, stages.weights, strict=True)]
        items = list(stages.items()) if isinstance(stages, Mapping) else list(stages)
        if not items:
            raise InputError("schedule: needs at least one stage")
        parsed = []
        for index, stage in enumerate(items):
            if isinstance(stage, Mapping):
                unknown = set(stage) - {"start", "weights"}
                if unknown:
                    raise InputError(f"schedule[{index}]: unknown key {sorted(unknown)[0]!r} "
                                     "(a stage has 'start' and 'weights')")
                if "weights" not in stage:
                    raise InputError(f"schedule[{index}]: 'weights' is missing")
                start, weights = stage.get("start", 0), stage["weights"]
            else:
                try:
                    start, weights = stage
                except (TypeError, ValueError):
                    raise InputError(f"schedule[{index}]: a stage is {{start, weights}} or a "
                                     f"(start, weights) pair, not {stage!r:.80}") from None
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise InputError(f"schedule[{index}]: 'start' must be an integer >= 0 "
                                 f"(samples drawn), not {start!r}")
            parsed.append((start, normalise(weights, count, f"schedule[{index}]")))
        starts = [s for s, _ in parsed]
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            raise InputError(f"schedule: the starts must begin at 0 and increase, not {starts}")
        self.starts = starts
        self.weights = [w for _, w in parsed]

    def stage_at(self, progress: int) -> int:
        return bisect.bisect_right(self.starts, progress) - 1

    def weights_at(self, progress: int) -> np.ndarray:
        return self.weights[self.stage_at(progress)]

    def identity(self) -> list:
        """What the fingerprint records."""
        return [[s, w.tolist()] for s, w in zip(self.starts, self.weights, strict=True)]

    def ever_positive(self) -> np.ndarray:
        return np.any(np.stack(self.weights) > 0, axis=0)


def make_schedule(schedule, count: int):
    """A ``Schedule`` from stages, or a ``ProgressSchedule`` from a callable."""
    if callable(schedule) and not isinstance(schedule, Schedule):
        return ProgressSchedule(schedule, count)
    return Schedule(schedule, count)


def normalise(weights: Sequence[float] | None, count: int, what: str = "Mix") -> np.ndarray:
    if weights is None:
        return np.full(count, 1.0 / count)
    values = list(weights)
    if len(values) != count:
        raise InputError(f"{what}: {len(values)} weights for {count} datasets")
    for index, weight in enumerate(values):
        if isinstance(weight, bool) or not isinstance(weight, int | float) \
                or not math.isfinite(weight) or weight < 0:
            raise InputError(f"{what}: weight {index} must be a finite number >= 0, not "
                             f"{weight!r}")
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
            raise InputError(f"{label}: a stage is a mapping with 'start' and 'weights' "
                             "{dataset name: weight}")
        unknown = [name for name in stage["weights"] if name not in names]
        if unknown:
            raise InputError(f"{label}: no dataset named {unknown[0]!r} (names: {list(names)})")
        weights_by_name = [stage["weights"].get(name, 0) for name in names]
        parsed.append({"start": stage.get("start", 0), "weights": weights_by_name})
    try:
        return {"weights": None, "schedule": Schedule(parsed, len(names))}
    except InputError as error:
        raise InputError(f"{where}: {error}") from None
