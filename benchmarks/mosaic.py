"""Mosaic streaming as a peer: ~1 KiB JSON samples, wdstream against mosaicml-streaming read by
the interpreter of a virtualenv of Mosaic's own, same records, same run.

mosaicml-streaming does not install beside the suite's environment (it pins ``numpy<2.2`` and
``transformers<5``), so the benchmark builds a virtualenv for it in its work folder at run time:
``torch==2.13.0`` (checked first with ``pip install --dry-run``: no other torch, no CUDA package)
and mosaicml-streaming's requirements except torchvision, whose only wheel for torch 2.13.0 is a
CUDA build that does not load beside the CPU torch (see ``benchmarks/mosaic_venv.py``). The
records are converted to MDS there with Mosaic's ``MDSWriter`` (untimed); each Mosaic case runs
``StreamingDataset(local=..., shuffle=...)`` under a torch DataLoader in that interpreter.
``WDSTREAM_BENCH_MOSAIC_VENV`` names an existing virtualenv to use instead (one this benchmark
built before: it is reused as it is).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .common import consume, quiet_logs, ratio

TITLE = "Mosaic streaming as a peer"
WORKERS = 2
BATCH = 32
TORCH = "torch==2.13.0"
MOSAIC = "mosaicml-streaming==0.13.0"
VENV_VARIABLE = "WDSTREAM_BENCH_MOSAIC_VENV"
LEFT_OUT = {"torchvision"}
SCRIPT = Path(__file__).with_name("mosaic_venv.py")

FULL = {"samples": 100_000, "per_shard": 1000}
QUICK = {"samples": 8_000, "per_shard": 250}

T_SMALL = "~1 KiB JSON samples, local, 2 workers, batch 32, consumer touching every page"


class VenvError(RuntimeError):
    """The virtualenv for Mosaic could not be built (the message says which step and why)."""


# =========================================================================== the virtualenv


def _pip(python: Path, *args: str, timeout: float = 1200) -> str:
    process = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                             timeout=timeout)
    if process.returncode != 0:
        tail = " | ".join((process.stderr or process.stdout).strip().splitlines()[-4:])
        raise VenvError(f"pip {' '.join(args[:2])} ... failed (exit {process.returncode}): "
                        f"{tail}")
    return process.stdout


def _requirements(python: Path) -> list[str]:
    """mosaicml-streaming's own requirements (no extras), as installed ``--no-deps``."""
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps(m.requires('mosaicml-streaming') or []))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    kept = []
    for requirement in json.loads(out.stdout):
        if ";" in requirement and "extra" in requirement.split(";", 1)[1]:
            continue
        name = requirement.split(";")[0].strip()
        bare = name.split("<")[0].split(">")[0].split("=")[0].split("!")[0].split("~")[0]
        if bare.strip().lower() in LEFT_OUT:
            continue
        kept.append(name if not bare.strip().lower() == "torch" else TORCH)
    if TORCH not in kept:
        kept.append(TORCH)
    return kept


def _check_report(report: Path) -> None:
    """Refuse an install plan with another torch or any CUDA package."""
    planned = json.loads(report.read_text()).get("install", [])
    for item in planned:
        name = item["metadata"]["name"].lower()
        version = item["metadata"]["version"]
        if name == "torch" and not version.startswith("2.13.0"):
            raise VenvError(f"pip would install torch {version}, not {TORCH}")
        if name.startswith(("nvidia-", "triton")) or name in LEFT_OUT or "cuda" in name:
            raise VenvError(f"pip would install {name} {version} (a CUDA package)")


def build_venv(folder: Path) -> tuple[Path, dict]:
    """A virtualenv with torch 2.13.0 and mosaicml-streaming in ``folder``; returns its
    interpreter and what was installed (versions, seconds)."""
    reuse = os.environ.get(VENV_VARIABLE)
    if reuse:
        python = Path(reuse) / "bin" / "python"
        if not python.exists():
            raise VenvError(f"{VENV_VARIABLE}={reuse}: no bin/python there")
        return python, {"built_s": None, **_versions(python)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, capture_output=True)
    python = folder / "bin" / "python"
    common.log(f"mosaic: pip install --no-deps {MOSAIC} into {folder}")
    _pip(python, "install", "-q", "--no-deps", MOSAIC)
    requirements = _requirements(python)
    report = folder / "pip-report.json"
    common.log(f"mosaic: pip install --dry-run {' '.join(requirements)}")
    _pip(python, "install", "-q", "--dry-run", "--report", str(report), *requirements)
    _check_report(report)
    common.log("mosaic: installing (torch 2.13.0 CPU, numpy 2.1, ...)")
    _pip(python, "install", "-q", *requirements)
    return python, {"built_s": time.perf_counter() - started, **_versions(python)}


def _versions(python: Path) -> dict:
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
            "('mosaicml-streaming', 'torch', 'numpy')}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def in_venv(python: str, command: str, args: dict, timeout: float = common.CASE_TIMEOUT) -> dict:
    """``benchmarks/mosaic_venv.py COMMAND`` in Mosaic's interpreter; its result dict."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        out_path = out.name
    try:
        process = subprocess.run([python, str(SCRIPT), command, json.dumps(args), out_path],
                                 capture_output=True, text=True, timeout=timeout,
                                 env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        text = Path(out_path).read_text()
    finally:
        os.unlink(out_path)
    if process.returncode != 0 or not text:
        tail = " | ".join(process.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"Mosaic {command}: exit {process.returncode}: {tail}")
    return json.loads(text)


# =========================================================================== cases (child side)


def case_wdstream(source: str, decode: bool, shuffle: bool, expected: int) -> dict:
    quiet_logs()
    import torch.utils.data  # noqa: F401 - torch imported before the clock, as for Mosaic

    import wdstream

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, shuffle=shuffle, decode=decode)
    loader = wdstream.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return consume(loader, started, expected, touch=True)


def case_mosaic(python: str, directory: str, decode: bool, shuffle: bool,
                expected: int) -> dict:
    """Mosaic's case, timed inside its own interpreter (a child of this process, so the
    memory sampler counts it and its workers)."""
    return in_venv(python, "read", {"directory": directory, "decode": decode,
                                    "shuffle": shuffle, "workers": WORKERS, "batch": BATCH,
                                    "expected": expected})


# =========================================================================== the suite (parent)


def _rate(result: dict):
    seconds = result.get("seconds")
    return result["samples"] / seconds if seconds and result.get("samples") else None


SETTINGS = (("JSON parsed, shuffle off", True, False),
            ("JSON parsed, shuffle on", True, True),
            ("none (raw bytes), shuffle off", False, False))


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    samples = sizes["samples"]
    with common.scratch("wdstream-bench-mosaic-") as root:
        common.log(f"mosaic: writing {samples:,} ~1 KiB JSON samples")
        data = common.json_dataset(root / "small", samples, sizes["per_shard"])
        try:
            python, installed = build_venv(root / "mosaic-venv")
            mds = str(root / "small-mds")
            converted = in_venv(str(python), "convert", {"jsonl": data["jsonl"], "output": mds})
            if converted["samples"] != samples:
                raise VenvError(f"MDS conversion wrote {converted['samples']} samples")
        except (VenvError, subprocess.SubprocessError, RuntimeError, OSError) as error:
            common.log(f"mosaic: not measured: {error}")
            return [{"table": T_SMALL, "loader": "Mosaic streaming", "error": str(error)}]
        here = f"{__name__}:"
        cases = {}
        for label, decode, shuffle in SETTINGS:
            cases[("wdstream", label)] = (here + "case_wdstream", {
                "source": data["dir"], "decode": decode, "shuffle": shuffle,
                "expected": samples})
            cases[("Mosaic streaming", label)] = (here + "case_mosaic", {
                "python": str(python), "directory": mds, "decode": decode, "shuffle": shuffle,
                "expected": samples})
        results = common.repeat({f"{k[0]} / {k[1]}": v for k, v in cases.items()},
                                progress=common.log)
    by_key = {key: results[f"{key[0]} / {key[1]}"] for key in cases}
    rows = []
    for label, _decode, _shuffle in SETTINGS:
        mosaic = _rate(by_key[("Mosaic streaming", label)])
        for loader in ("wdstream", "Mosaic streaming"):
            result = by_key[(loader, label)]
            rate = _rate(result)
            rows.append({"table": T_SMALL, "loader": loader, "decode, order": label,
                         "samples/s": rate, "÷ Mosaic": ratio(rate, mosaic),
                         "first batch s": result.get("ttfb_s"),
                         "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                         "error": result.get("error")})
    built = installed.get("built_s")
    rows.append({"table": T_SMALL, "note": (
        f"{samples:,} samples in {len(data['shards'])} shards "
        f"({data['bytes'] / common.MB:.0f} MB of tar); Mosaic reads the same records converted "
        f"to MDS by its MDSWriter (columns key: str, json: bytes; 64 MB shards) in "
        f"{converted['seconds']:.0f} s, untimed. Each with a torch DataLoader of 2 workers, "
        "batch 32, the default collate; 'JSON parsed': json.loads in Mosaic's __getitem__, "
        "wdstream's decode=True. The consumer reads one byte of every 4 KiB page of every "
        "bytes payload of each batch.")})
    rows.append({"table": T_SMALL, "note": (
        f"Mosaic's virtualenv: mosaicml-streaming {installed['mosaicml-streaming']}, torch "
        f"{installed['torch']}, numpy {installed['numpy']}, no torchvision"
        + (f", built in {built:.0f} s by the run" if built else f", reused ({VENV_VARIABLE})")
        + "; Mosaic's peak RSS includes the launcher process of its case (~20 MB).")})
    return rows
