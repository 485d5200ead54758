"""Large manifests: building a ``StreamingDataset`` on 100,000 and 1,000,000 shards, and the
epoch plan, time and memory per rank.

Every case runs in a fresh process that imports wdstream (and torch) before its clock. It
reports the seconds to build the dataset (read ``index.json`` from local disk, parse it, the
shard table) and to compute one epoch's plan for 8 ranks of 4 workers, the resident memory the
dataset keeps (RSS after it is built minus RSS before) and the peak above the RSS before.
Manifests are written by ``Manifest.to_json`` (one shard per line, the layout ``wdstream pack``
and ``wdstream index`` write); the same 1,000,000 shards as one-line JSON take the general
parser (one ``ShardInfo`` per shard), as every manifest did before.
"""

from __future__ import annotations

import hashlib
import json
import resource
import time
from pathlib import Path

from . import common
from .read import goal

TITLE = "Large manifests"
FULL = {"sizes": (100_000, 1_000_000)}
QUICK = {"sizes": (100_000, 1_000_000)}
T_LOAD = "large manifests: StreamingDataset(prefix) on a local index.json, then one epoch's plan"
T_GOALS = "goals (issue 18)"


def _rss_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * resource.getpagesize() / common.MB


def _reset_peak() -> None:
    """Make the kernel's peak RSS (VmHWM) start again from the current RSS."""
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")


def _peak_mb() -> float:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / common.MB
    return 0.0


def case_manifest(source: str) -> dict:
    import wdstream
    import wdstream.stream.dataset  # noqa: F401 - torch imported before the clock

    before = _rss_mb()
    _reset_peak()
    started = time.perf_counter()
    dataset = wdstream.StreamingDataset(source, shuffle=True)
    loaded = time.perf_counter()
    plan = dataset.plan(0, 8, 4)
    planned = time.perf_counter()
    spans = plan.stream_spans(3, 2)
    after = _rss_mb()
    peak = _peak_mb()
    return {"load_s": loaded - started, "plan_s": planned - loaded, "kept_mb": after - before,
            "peak_mb": peak - before, "shards": len(dataset.shards.urls),
            "samples": len(dataset), "stream_spans": len(spans),
            "compact": type(dataset.manifest.shards).__name__ == "ShardArrays"}


def write_manifests(folder: Path, count: int) -> dict[str, str]:
    from wdstream.shards.manifest import Manifest, ShardInfo

    infos = [ShardInfo(f"shard-{i:07d}.tar", 1000, 1_100_000 + i,
                       hashlib.sha256(i.to_bytes(8, "little")).hexdigest())
             for i in range(count)]
    text = Manifest(infos, extensions=["json"]).to_json()
    lines = folder / f"lines-{count}"
    lines.mkdir(parents=True)
    (lines / "index.json").write_text(text)
    out = {"to_json layout": str(lines)}
    if count >= 1_000_000:
        one = folder / f"one-line-{count}"
        one.mkdir()
        (one / "index.json").write_text(json.dumps(json.loads(text)))
        out["one-line JSON (general parser)"] = str(one)
    return out


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    rows, goals = [], []
    with common.scratch() as root:
        cases = {}
        for count in sizes["sizes"]:
            common.log(f"manifest: writing {count:,} shards")
            for layout, folder in write_manifests(root, count).items():
                cases[f"{count:,} shards, {layout}"] = (f"{__name__}:case_manifest",
                                                        {"source": folder})
        results = common.repeat(cases, progress=common.log)
    for name, result in results.items():
        rows.append({"table": T_LOAD, "manifest": name, "load s": result.get("load_s"),
                     "plan s (8 ranks x 4 workers)": result.get("plan_s"),
                     "kept MB": result.get("kept_mb"), "peak MB above start": result.get("peak_mb"),
                     "as arrays": result.get("compact"), "runs": result.get("runs"),
                     "error": result.get("error")})
    million = results.get("1,000,000 shards, to_json layout", {})
    goals.append(goal("1,000,000 shards: StreamingDataset built, s", million.get("load_s"), 2.0,
                      higher_is_better=False, table=T_GOALS))
    goals.append(goal("1,000,000 shards: memory kept per rank, MB", million.get("kept_mb"), 200,
                      higher_is_better=False, table=T_GOALS))
    goals.append(goal("1,000,000 shards: the epoch plan, s", million.get("plan_s"), 1.0,
                      higher_is_better=False, table=T_GOALS))
    rows.append({"table": T_LOAD, "note": (
        "Each shard: a 17-character name, counts and a sha256 (144 MB of index.json for a "
        "million). 'kept' is the RSS the dataset holds once built; 'peak' includes the file's "
        "text while it is parsed. DataLoader workers inherit the arrays by fork: a few large "
        "objects whose pages reference counting does not touch (by design; not measured here).")})
    return goals + rows
