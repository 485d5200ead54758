"""Resumption costs: time to first batch after ``load_state_dict``, plan time, state size.

- Resume at 10% and at 90% of an epoch (local shards, then the same shards on a moto S3 server),
  each in a fresh process as after a restart: time from building the dataset to the first
  batch. The resume cost must not grow with the position (goal: 90% ÷ 10% ≤ 1.2). The first
  batch is checked against the uninterrupted run's batch at that point.
- ``wdstream.stream.plan.epoch.EpochPlan`` for 100,000 shards / 100 M samples: the time to plan an epoch and
  take one worker's spans, and the memory it needs.
- ``len(json.dumps(loader.state_dict()))``: the size of a checkpoint's loader state.
- Time to the first batch of an epoch for ~1 MiB samples (local, then moto S3), shuffle off,
  shuffle on with windows of one size (``shuffle_start=None``: how wdstream read before its
  windows grew) and with growing windows (the default), and where the first batch's samples
  sit in their stream (the cost in shuffle quality).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import common
from .common import quiet_logs, ratio
from .read import goal

TITLE = "Resumption"
WORKERS = 2
BATCH = 32
FRACTIONS = (0.1, 0.9)
SEED = 17

FULL = {"samples": 100_000, "per_shard": 1000, "plan_shards": 100_000, "plan_per_shard": 1000}
QUICK = {"samples": 10_000, "per_shard": 250, "plan_shards": 100_000, "plan_per_shard": 1000}

T_RESUME = "time to first batch after load_state_dict, 2 workers, batch 32, shuffled"
T_PLAN = "epoch plan: 100,000 shards × 1,000 samples (100 M samples)"
T_GOALS = "goals"
T_FIRST = "time to the first batch of an epoch, ~1 MiB samples, 2 workers, batch 32"

BLOBS = {"samples": 1024, "per_shard": 64, "bytes": 1 << 20}
QUICK_BLOBS = {"samples": 512, "per_shard": 64, "bytes": 1 << 20}
SHAPED = (25, 20)  # MB/s per connection, ms of delay: a cloud link (benchmarks/shaped_link.py)
FIRST_CASES = {  # name -> StreamingDataset options
    "shuffle off": {"shuffle": False},
    "shuffle on, windows of one size (shuffle_start=None)": {"shuffle_start": None},
    "shuffle on, growing windows (default)": {},
}


# =========================================================================== cases (child side)


def _loader(source: str, workers: int = WORKERS):
    import wdstream

    dataset = wdstream.StreamingDataset(source, shuffle=True, seed=SEED)
    return wdstream.DataLoader(dataset, batch_size=BATCH, num_workers=workers)


def case_states(source: str, out: str) -> dict:
    """Read one whole epoch; save the loader state after 10% and 90% of its batches, with the
    keys of the batch that comes next."""
    quiet_logs()
    loader = _loader(source)
    total = len(loader)
    stops = {round(total * f): f for f in FRACTIONS}
    saved, pending = {}, None
    for index, batch in enumerate(loader):
        if pending is not None:
            saved[str(pending)]["next_keys"] = list(batch["__key__"])
            pending = None
        if index + 1 in stops:
            fraction = stops[index + 1]
            saved[str(fraction)] = {"state": loader.state_dict(), "batches_done": index + 1}
            pending = fraction
    Path(out).write_text(json.dumps(saved))
    return {"batches": total}


def case_resume(source: str, states: str | None, fraction: float | None,
                workers: int = WORKERS) -> dict:
    """Time from building the dataset (after imports) to the first batch, after loading the
    state saved at ``fraction`` (None: a fresh start)."""
    quiet_logs()
    import wdstream.stream.load.dataset  # noqa: F401 - torch imported before the clock
    import wdstream.stream.load.loader  # noqa: F401

    saved = json.loads(Path(states).read_text())[str(fraction)] if fraction is not None else None
    started = common.start_clock()
    loader = _loader(source, workers)
    if saved is not None:
        loader.load_state_dict(saved["state"])
    iterator = iter(loader)
    batch = next(iterator)
    ttfb = time.perf_counter() - started
    result = {"ttfb_s": ttfb, "state_bytes": len(json.dumps(loader.state_dict()))}
    if saved is not None and workers == saved["state"]["workers"]:
        result["exact"] = "yes" if list(batch["__key__"]) == saved["next_keys"] else "NO"
    del iterator
    return result


def case_plan(shards: int, per_shard: int, world: int, workers: int,
              elastic: bool = False) -> dict:
    """Plan an epoch, take rank 0 / worker 0's spans and its first window order."""
    import tracemalloc

    import numpy as np

    from wdstream.stream.plan.epoch import EpochPlan, HistorySegment, PlanOptions

    counts = np.full(shards, per_shard, dtype=np.int64)
    options = PlanOptions(seed=SEED, shuffle=True, window=1000)
    history = ()
    if elastic:  # the same epoch resumed on another layout, after 37% on 4 x 2 streams
        consumed = int(shards * per_shard * 0.37) // 8
        history = (HistorySegment(4, 2, BATCH, (consumed, consumed)),)
    def plan_once():
        plan = EpochPlan(counts, 0, world, workers, options, history)
        spans = plan.stream_spans(0, 0)
        plan.window_order(0, 0, 0, options.schedule.size(0))
        return plan, spans

    started = common.start_clock()
    plan, spans = plan_once()
    seconds = time.perf_counter() - started
    del plan, spans
    tracemalloc.start()  # a second time for the memory: tracing slows allocation severalfold
    plan, spans = plan_once()
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": seconds, "traced_mb": peak / common.MB, "spans": len(spans),
            "rank_samples": plan.rank_samples}


def case_first_batch(source: str, options: dict, per_shard: int, workers: int = WORKERS) -> dict:
    """Time from building the dataset to the first batch of an epoch; where that batch's
    samples sit in worker 0's stream in plan order (its shards' samples in order: what no
    shuffle within windows would give). Keys are global sample numbers, ``per_shard`` a
    shard."""
    quiet_logs()
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - torch imported before the clock starts
    import wdstream.stream.load.loader  # noqa: F401

    if source.startswith("s3://"):
        import botocore.session  # noqa: F401 - as the other cases import it before their clock

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, seed=SEED, **options)
    loader = wdstream.DataLoader(dataset, batch_size=BATCH, num_workers=workers)
    iterator = iter(loader)
    batch = next(iterator)
    ttfb = time.perf_counter() - started
    del iterator
    spans = dataset.plan(0, 1, workers).stream_spans(0, 0)
    order = [span.shard * per_shard + i for span in spans for i in range(span.start, span.stop)]
    where = {sample: position for position, sample in enumerate(order)}
    positions = [where[int(key)] for key in batch["__key__"]]
    return {"ttfb_s": ttfb, "window": dataset.options.window,
            "first_window": dataset.options.schedule.size(0),
            "spread": max(positions) + 1,
            "displacement": sum(abs(p - i) for i, p in enumerate(positions)) / len(positions)}


def _first_batch_rows(where: str, source: str, per_shard: int, env: dict | None) -> list[dict]:
    here = f"{__name__}:"
    cases = {name: (here + "case_first_batch",
                    {"source": source, "options": options, "per_shard": per_shard}, env)
             for name, options in FIRST_CASES.items()}
    rows = []
    for name, result in common.repeat(cases, progress=common.log).items():
        rows.append({"table": T_FIRST, "shards": where, "case": name,
                     "first batch s": result.get("ttfb_s"),
                     "windows": None if "window" not in result else
                     f"{result['first_window']} → {result['window']}",
                     "first batch from positions": result.get("spread"),
                     "mean displacement": result.get("displacement"),
                     "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                     "error": result.get("error")})
    return rows


def first_batch_rows(quick: bool) -> list[dict]:
    sizes = QUICK_BLOBS if quick else BLOBS
    rows: list[dict] = []
    with common.scratch() as root:
        common.log(f"resume: writing {sizes['samples']:,} samples of 1 MiB")
        data = common.blob_dataset(root / "blobs", sizes["samples"], sizes["per_shard"],
                                   sizes["bytes"])
        rows += _first_batch_rows("local", data["dir"], sizes["per_shard"], None)
        with common.LocalS3(whole_once=True) as s3:
            common.log("resume: uploading the 1 MiB samples to moto")
            url = s3.upload(data["dir"], "first", "blobs")
            rows += _first_batch_rows("S3 (moto)", url, sizes["per_shard"], s3.env)
            from .shaped_link import ShapedProxy

            rate, delay = SHAPED
            with ShapedProxy(s3.port, rate * 1e6, delay / 1000) as proxy:
                env = {**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}
                rows += _first_batch_rows(f"S3, shaped link ({rate} MB/s per connection, "
                                          f"{delay} ms)", url, sizes["per_shard"], env)
    rows.append({"table": T_FIRST, "note":
                 f"{data['samples']:,} samples of 1 MiB in shards of {sizes['per_shard']}, "
                 f"seed {SEED}, every other option the default (shuffle_window 1000, bounded "
                 "by shuffle_bytes=256 MiB to 255 samples). Times run from building the "
                 "dataset (after imports) to the first batch, in a fresh process; moto keeps "
                 "each object's value whole, so that a ranged GET costs it its range, as on S3 "
                 "(the link benchmark's server). "
                 "'shuffle_start=None' reads as wdstream did before its windows grew. 'first "
                 "batch from positions': the first batch's samples come from the first N "
                 "positions of worker 0's stream (its shards' samples in order); 'mean "
                 "displacement': how far, on average, a sample of that batch sits from its "
                 "place in that order."})
    return rows


# =========================================================================== the suite (parent)


def _resume_rows(where: str, source: str, states: str, env: dict | None) -> tuple[list, dict]:
    here = f"{__name__}:"
    cases = {"fresh start (no state)": (here + "case_resume",
                                        {"source": source, "states": None, "fraction": None},
                                        env)}
    for fraction in (0.1, 0.9):
        cases[f"resumed at {fraction:.0%}"] = (
            here + "case_resume", {"source": source, "states": states, "fraction": fraction},
            env)
    cases["resumed at 90% on 3 workers (elastic)"] = (
        here + "case_resume", {"source": source, "states": states, "fraction": 0.9,
                               "workers": 3}, env)
    results = common.repeat(cases, progress=common.log)
    at10 = results["resumed at 10%"].get("ttfb_s")
    rows = []
    for name, result in results.items():
        rows.append({"table": T_RESUME, "shards": where, "start": name,
                     "first batch s": result.get("ttfb_s"),
                     "÷ at 10%": ratio(result.get("ttfb_s"), at10),
                     "same batch as uninterrupted": result.get("exact"),
                     "state bytes": result.get("state_bytes"),
                     "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                     "error": result.get("error")})
    return rows, {"growth": ratio(results["resumed at 90%"].get("ttfb_s"), at10),
                  "state_bytes": max((r.get("state_bytes") or 0) for r in results.values())}


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    rows: list[dict] = []
    summary = {}
    with common.scratch() as root:
        common.log(f"resume: writing {sizes['samples']:,} ~1 KiB JSON samples")
        data = common.json_dataset(root / "data", sizes["samples"], sizes["per_shard"],
                                   jsonl=False)
        states = str(root / "states.json")
        made = common.run_case(f"{__name__}:case_states", {"source": data["dir"], "out": states})
        if "error" in made:
            rows.append({"table": T_RESUME, "error": f"saving states: {made['error']}"})
        else:
            local, summary["local"] = _resume_rows("local", data["dir"], states, None)
            rows += local
            with common.LocalS3() as s3:
                common.log("resume: uploading the shards to moto")
                url = s3.upload(data["dir"], "resume", "data")
                remote, summary["s3"] = _resume_rows("S3 (moto)", url, states, s3.env)
            rows += remote
        rows.append({"table": T_RESUME, "note":
                     f"{data['samples']:,} samples in {len(data['shards'])} shards of "
                     f"{sizes['per_shard']}, seed {SEED}, shuffle window 1000; the states were "
                     "saved during one uninterrupted epoch, with the keys of the batch that came "
                     "next. Times run from building the dataset (after imports) to the first "
                     "batch, in a fresh process. The elastic row loads the 2-worker state into "
                     "a 3-worker loader: the rest of the epoch is re-planned, and the "
                     "unconsumed positions of each stream's current shuffle window become "
                     "spans of their own."})
    here = f"{__name__}:"
    layouts = {
        "1 rank × 2 workers": {"world": 1, "workers": 2},
        "8 ranks × 8 workers": {"world": 8, "workers": 8},
        "elastic: 4×2 → 8×8 after 37%": {"world": 8, "workers": 8, "elastic": True},
    }
    plan_cases = {name: (here + "case_plan", {"shards": sizes["plan_shards"],
                                              "per_shard": sizes["plan_per_shard"], **layout})
                  for name, layout in layouts.items()}
    plans = common.repeat(plan_cases, progress=common.log)
    for name, result in plans.items():
        rows.append({"table": T_PLAN, "layout": name, "plan s": result.get("seconds"),
                     "traced MB": result.get("traced_mb"), "spans of one worker":
                     result.get("spans"), "samples per rank": result.get("rank_samples"),
                     "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                     "error": result.get("error")})
    rows.append({"table": T_PLAN, "note": "EpochPlan(...) + stream_spans(rank 0, worker 0) + "
                 "its first window order, as each DataLoader worker (and the main process) "
                 "computes at the start of an epoch; traced MB is tracemalloc's peak during a "
                 "second, untimed planning."})
    rows += first_batch_rows(quick)
    worst_plan = max((r.get("seconds") or 0) for r in plans.values()) or None
    goals = [
        goal("resume at 90% ÷ at 10%, first batch, local", summary.get("local", {}).get("growth"),
             1.2, higher_is_better=False, table=T_GOALS),
        goal("resume at 90% ÷ at 10%, first batch, S3", summary.get("s3", {}).get("growth"),
             1.2, higher_is_better=False, table=T_GOALS),
        goal("plan time for 100,000 shards / 100 M samples, s (slowest layout)", worst_plan, 1.0,
             higher_is_better=False, table=T_GOALS),
        goal("loader state, bytes of JSON", max(
            (s.get("state_bytes") or 0) for s in summary.values()) or None, 4096,
             higher_is_better=False, table=T_GOALS),
    ]
    return goals + rows
