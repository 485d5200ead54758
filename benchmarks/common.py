"""Shared helpers of the benchmark suite.

Cases in fresh interpreters
    ``run_case("benchmarks.read:case_wdstream", {...})`` runs one case in a new Python process
    (``python -m benchmarks.common``), so every case starts cold and its memory is its own. The
    parent samples the resident memory of the case's whole process tree (the case and its
    DataLoader workers) with psutil and keeps the peak; without psutil the case reports
    ``getrusage`` figures itself (its own peak plus its largest worker's). ``repeat`` runs a set
    of cases ``RUNS`` times, interleaved (case A, case B, ..., then again) so that the machine's
    drift hits every case alike, and ``medians`` reduces the runs.

Data
    ``json_dataset`` and ``blob_dataset`` write shards with wdstream's ``TarWriter`` plus an
    ``index.json`` manifest (and JSONL copies of the JSON records for peers that read JSONL).

S3
    ``LocalS3`` (``local_servers``, shared with the tests) starts a moto server on 127.0.0.1 on
    a free port and gives the environment a client needs; every request stays on the loopback
    interface.

Peers installed outside the environment
    ``WDSTREAM_BENCH_SITE`` (paths separated by ``os.pathsep``) is appended to ``sys.path`` in
    every case process: a peer that cannot be installed cleanly beside torch (LitData pulls a
    CUDA torchvision) can be installed with ``pip install --no-deps --target DIR`` and measured
    without touching the environment.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from .local_servers import LocalS3 as LocalS3  # the suite's common.LocalS3

REPO = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("WDSTREAM_BENCH_RUNS", "3"))  # set by ``--runs``
CASE_TIMEOUT = 600.0
SITE_VARIABLE = "WDSTREAM_BENCH_SITE"
MB = 1e6  # throughput in MB/s, memory in MB: powers of 1000


_T0 = time.monotonic()


def log(message: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(f"[{time.monotonic() - _T0:6.0f} s] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- statistics


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def medians(results: list[dict]) -> dict:
    """One dict from the runs of a case: the median of every numeric field, the first value of
    the others; ``runs`` counts the runs that succeeded, ``error`` is the first failure."""
    good = [r for r in results if "error" not in r]
    out: dict = {"runs": len(good)}
    if not good:
        out["error"] = results[0]["error"] if results else "not run"
        return out
    for key in good[0]:
        values = [r.get(key) for r in good]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = median(values)
        else:
            out[key] = values[0]
    failed = [r for r in results if "error" in r]
    if failed:
        out["failed_runs"] = len(failed)
        out["error"] = failed[0]["error"]
    return out


# --------------------------------------------------------------------------- cases


class _MemorySampler:
    """Peak RSS of a process and its descendants and, if ``pss`` (it costs tens of ms of CPU
    per sample for a loader's processes, taken from the cores the case runs on), peak PSS
    where /proc has smaps_rollup. ``cpu_s``: the CPU the sampling took."""

    def __init__(self, pid: int, interval: float = 0.05, pss: bool = False):
        self.pid = pid
        self.interval = interval
        self.pss = pss
        self.peak_rss = 0
        self.peak_pss = 0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        try:
            import psutil
        except ImportError:
            self.available = False
            return
        self.available = True
        self._psutil = psutil
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self):
        root = self._psutil.Process(self.pid)
        return [root, *root.children(recursive=True)]

    def _run(self) -> None:
        try:
            self._sample()
        finally:
            self.cpu_s = time.thread_time()

    def _sample(self) -> None:
        psutil = self._psutil
        # PSS is dearer: every 4th sample. The walk of /proc for new descendants (about 1 ms)
        # is made at every sample too: a loader's workers may live for less than 4 samples
        every, tick = 4, 0
        while not self._stop.is_set():
            try:
                processes = self._tree()
            except psutil.Error:
                return
            rss = pss = 0
            for process in processes:
                try:
                    rss += process.memory_info().rss
                except psutil.Error:
                    continue
                if self.pss and tick % every == 0:
                    pss += _pss(process.pid)
            self.peak_rss = max(self.peak_rss, rss)
            if self.pss and tick % every == 0:
                self.peak_pss = max(self.peak_pss, pss)
            tick += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(2.0)


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as file:
            for line in file:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONHASHSEED", "0")
    env.update(extra or {})
    return env


def run_case(target: str, args: dict | None = None, *, env: dict | None = None,
             timeout: float = CASE_TIMEOUT, pss: bool = False) -> dict:
    """Run ``"module:function"(**args)`` in a fresh interpreter and return its dict, with
    ``peak_rss_mb`` / ``peak_pss_mb`` (the whole process tree) and ``wall_s`` added; on failure
    ``{"error": ...}``."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        out_path = out.name
    command = [sys.executable, "-m", "benchmarks.common", target, json.dumps(args or {}),
               out_path]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=child_env(env),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = _MemorySampler(process.pid, pss=pss)
    try:
        _out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _out, err = process.communicate()
        sampler.stop()
        os.unlink(out_path)
        return {"error": f"timed out after {timeout:g} s"}
    sampler.stop()
    wall = time.perf_counter() - started
    try:
        text = Path(out_path).read_text()
    finally:
        os.unlink(out_path)
    if process.returncode != 0 or not text:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        return {"error": f"exit {process.returncode}: " + " | ".join(tail)}
    result = json.loads(text)
    if "error" in result:
        return result
    if sampler.available and sampler.peak_rss:
        result["peak_rss_mb"] = sampler.peak_rss / MB
        result["peak_pss_mb"] = (sampler.peak_pss / MB) if sampler.peak_pss else None
        result["sampler_cpu_s"] = sampler.cpu_s
    else:
        result["peak_rss_mb"] = result.pop("_self_rss_mb") + result.pop("_children_rss_mb")
    result.pop("_self_rss_mb", None)
    result.pop("_children_rss_mb", None)
    result["wall_s"] = wall
    return result


def repeat(cases: dict[str, tuple], runs: int | None = None, progress=None,
           pss: bool = False) -> dict[str, dict]:
    """Run each case ``runs`` times, interleaved, and return the medians per case name.

    ``cases``: name -> (target, args) or (target, args, env); ``pss``: sample each case's peak
    PSS as well (see ``_MemorySampler``)."""
    runs = runs or RUNS
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for round_ in range(runs):
        for name, spec in cases.items():
            target, args, *rest = spec
            if progress:
                progress(f"{name} (run {round_ + 1}/{runs})")
            result = run_case(target, args, env=rest[0] if rest else None, pss=pss)
            results[name].append(result)
            if "error" in result and round_ == 0 and result.get("skip"):
                results[name] *= runs  # "not installed": no point trying again
    return {name: medians(values[:runs]) for name, values in results.items()}


def _child_main(argv: list[str]) -> int:
    target, args, out_path = argv
    for path in filter(None, os.environ.get(SITE_VARIABLE, "").split(os.pathsep)):
        sys.path.append(path)
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    try:
        result = function(**json.loads(args))
    except Skip as skip:
        result = {"error": str(skip), "skip": True}
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result["_self_rss_mb"] = self_kb * 1024 / MB
    result["_children_rss_mb"] = children_kb * 1024 / MB
    Path(out_path).write_text(json.dumps(result))
    return 0


def rows_from(python: str, name: str, quick: bool) -> list[dict]:
    """A benchmark's rows computed in another interpreter (one where a peer imports):
    ``python -m benchmarks.NAME OUT.json [--quick]`` (``module_main``)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder, "rows.json")
        subprocess.run([python, "-m", f"benchmarks.{name}", str(out)]
                       + (["--quick"] if quick else []), cwd=REPO, check=True,
                       env=child_env())
        return json.loads(out.read_text())


def module_main(name: str, title: str, run, argv: list[str]) -> int:
    """``python -m benchmarks.NAME [OUT.json] [--quick]``: the rows as JSON into OUT.json
    (``rows_from``), else printed as tables."""
    quick = "--quick" in argv
    paths = [arg for arg in argv if not arg.startswith("--")]
    if paths:
        Path(paths[0]).write_text(json.dumps(run(quick)))
        return 0
    from .__main__ import run_alone

    return run_alone(name, title, run, argv)


class Skip(Exception):
    """Raised by a case that cannot run here (a peer that is not installed)."""


# --------------------------------------------------------------------------- in a case


def batch_len(batch) -> int:
    """Samples in a collated batch: a dict of lists or tensors, a list, or a tensor."""
    if isinstance(batch, dict):
        for key in ("__key__", "key"):
            if key in batch:
                return len(batch[key])
        return len(next(iter(batch.values())))
    return len(batch)


PAGE = 4096


def start_clock() -> float:
    """A case's start on ``time.perf_counter()``, taken after a full garbage collection.
    Importing torch leaves one due (~0.1 s of walking its objects); collected here, before
    every case's clock, it is paid as a training process pays it, long before its loader
    starts, rather than inside whichever case allocates first after its imports."""
    gc.collect()
    return time.perf_counter()


def touch_pages(value) -> int:
    """Read one byte of every page of the payloads in ``value`` (bytes, arrays, tensors, and
    the lists and dicts holding them), as a consumer that uses the data would."""
    import numpy as np

    if isinstance(value, dict):
        return sum(touch_pages(v) for k, v in value.items() if not str(k).startswith("__"))
    if isinstance(value, (list, tuple)):
        return sum(touch_pages(v) for v in value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int(np.frombuffer(value, dtype=np.uint8)[::PAGE].sum())
    if hasattr(value, "numpy"):  # a torch tensor
        flat = value.reshape(-1).view(torch_uint8()) if value.dtype != torch_uint8() \
            else value.reshape(-1)
        return int(flat[::PAGE].sum())
    if isinstance(value, np.ndarray):
        return int(value.reshape(-1).view(np.uint8)[::PAGE].sum())
    return 0


def torch_uint8():
    import torch

    return torch.uint8


def consume(loader, started: float, expected: int | None = None, touch: bool = False,
            cpu_at_first: bool = False) -> dict:
    """Iterate ``loader`` to the end; times from ``started`` (``time.perf_counter()`` taken
    before the dataset was built). Returns samples, seconds, time to first batch. ``touch``:
    read a byte of every page of every batch (``touch_pages``). ``cpu_at_first``: also the
    CPU seconds this process and its live children (the workers) had taken when the first
    batch came (``cpu_at_first_s``, from their start)."""
    items = 0
    first = None
    result = {}
    for batch in loader:
        if first is None:
            first = time.perf_counter()
            if cpu_at_first:
                result["cpu_at_first_s"] = tree_cpu()
        if touch:
            touch_pages(batch)
        items += batch_len(batch)
    seconds = time.perf_counter() - started
    if expected is not None and items != expected:
        raise RuntimeError(f"read {items} samples, expected {expected}")
    return {"samples": items, "seconds": seconds,
            "ttfb_s": (first - started) if first is not None else None, **result}


def bytes_after_first_batch(result: dict, nbytes: int, batch: int) -> float | None:
    """Of the ``nbytes`` a DataLoader case read in ``result["samples"]`` samples, those after
    its first batch of ``batch``; None for a failed case or one that does not say."""
    samples = result.get("samples")
    if not nbytes or not samples or "error" in result:
        return None
    return nbytes * (1 - batch / max(samples, batch))


def steady_mbps(result: dict, nbytes: int, batch: int) -> float | None:
    """MB/s of a DataLoader case from its first batch to its end, that batch left out."""
    seconds, first = result.get("seconds"), result.get("ttfb_s")
    after = bytes_after_first_batch(result, nbytes, batch)
    if after is None or not seconds or first is None or seconds <= first:
        return None
    return after / MB / (seconds - first)


def tree_cpu() -> float:
    """CPU seconds of this process, of its children that ended, and of those still running."""
    import psutil

    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile: counted among those that ended, or lost
            pass
    return total


def quiet_logs() -> None:
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")


# --------------------------------------------------------------------------- data


def _text_source(seed: int = 7, size: int = 1 << 16) -> str:
    rng = random.Random(seed)
    words = ["stream", "shard", "token", "epoch", "sample", "model", "batch", "worker", "cloud",
             "bucket", "resume", "order", "plan", "window", "reader", "tensor", "value", "data"]
    text = " ".join(rng.choice(words) for _ in range(size // 5))
    return text[:size]


def json_dataset(folder: str | Path, samples: int, per_shard: int, record_bytes: int = 1000,
                 jsonl: bool = True) -> dict:
    """Shards of one ``.json`` member per sample (a record of about ``record_bytes``), an
    ``index.json``, and (``jsonl``) the same records as one JSONL file per shard."""
    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar_writer import TarWriter

    folder = Path(folder)
    (folder / "tar").mkdir(parents=True, exist_ok=True)
    if jsonl:
        (folder / "jsonl").mkdir(parents=True, exist_ok=True)
    text = _text_source()
    infos, shards, lines_files = [], [], []
    index = 0
    for shard in range(-(-samples // per_shard)):
        count = min(per_shard, samples - index)
        name = f"shard-{shard:06d}.tar"
        path = folder / "tar" / name
        lines = []
        with open(path, "wb") as file:
            writer = TarWriter(file)
            for _ in range(count):
                offset = (index * 131) % (len(text) - record_bytes)
                record = {"id": index, "source": "bench", "text": ""}
                head = len(json.dumps(record))
                record["text"] = text[offset: offset + max(0, record_bytes - head)]
                data = json.dumps(record).encode()
                writer.add(f"{index:010d}.json", data)
                if jsonl:
                    lines.append(data)
                index += 1
            writer.close()
        data = path.read_bytes()
        infos.append(ShardInfo(name, count, len(data), hashlib.sha256(data).hexdigest()))
        shards.append(str(path))
        if jsonl:
            jpath = folder / "jsonl" / f"part-{shard:06d}.jsonl"
            jpath.write_bytes(b"\n".join(lines) + b"\n")
            lines_files.append(str(jpath))
    (folder / "tar" / "index.json").write_text(Manifest(infos, extensions=["json"]).to_json())
    os.sync()  # no write-back of fresh data during the first timed runs
    return {"dir": str(folder / "tar"), "shards": shards, "jsonl": lines_files,
            "samples": samples, "bytes": sum(i.bytes for i in infos)}


def blob_dataset(folder: str | Path, samples: int, per_shard: int, sample_bytes: int,
                 start: int = 0) -> dict:
    """Shards of one ``.bin`` member of ``sample_bytes`` per sample, and an ``index.json``.
    Payloads are pseudo-random (incompressible) and differ from sample to sample."""
    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar_writer import TarWriter

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    block = random.Random(11).randbytes(sample_bytes + 4096)
    infos, shards = [], []
    index = 0
    for shard in range(-(-samples // per_shard)):
        count = min(per_shard, samples - index)
        name = f"shard-{shard:06d}.tar"
        path = folder / name
        digest = hashlib.sha256()
        with open(path, "wb") as file:
            writer = TarWriter(_Hashing(file, digest))
            for _ in range(count):
                offset = (index * 61) % 4096
                writer.add(f"{index:010d}.bin", block[offset: offset + sample_bytes])
                index += 1
            writer.close()
            size = writer.bytes_written
        infos.append(ShardInfo(name, count, size, digest.hexdigest()))
        shards.append(str(path))
    (folder / "index.json").write_text(Manifest(infos, extensions=["bin"]).to_json())
    os.sync()  # no write-back of fresh data during the first timed runs
    return {"dir": str(folder), "shards": shards, "samples": samples,
            "bytes": sum(i.bytes for i in infos)}


class _Hashing:
    def __init__(self, file, digest):
        self.file, self.digest = file, digest

    def write(self, data) -> None:
        self.digest.update(data)
        self.file.write(data)


def subset(dataset: dict, shards: int, folder: str | Path) -> dict:
    """A dataset made of the first ``shards`` shards of ``dataset`` (hard links, own manifest)."""
    from wdstream.shards.manifest import Manifest, load_manifest

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(dataset["dir"])
    infos = manifest.shards[:shards]
    paths = []
    for info, source in zip(infos, dataset["shards"][:shards], strict=True):
        target = folder / info.url
        if not target.exists():
            os.link(source, target)
        paths.append(str(target))
    (folder / "index.json").write_text(Manifest(infos, extensions=manifest.extensions).to_json())
    return {"dir": str(folder), "shards": paths, "samples": sum(i.samples for i in infos),
            "bytes": sum(i.bytes for i in infos)}


@contextmanager
def scratch(prefix: str = "wdstream-bench-"):
    """A temporary folder for generated data, removed afterwards (``WDSTREAM_BENCH_DATA``
    names a parent folder to use instead of the system's temporary one)."""
    parent = os.environ.get("WDSTREAM_BENCH_DATA") or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the machine


def _version(name: str) -> str:
    from importlib.metadata import distributions

    site = [p for p in os.environ.get(SITE_VARIABLE, "").split(os.pathsep) if p]
    for dist in distributions(name=name, path=sys.path + site):
        return dist.version
    return "not installed"


def source_version() -> str:
    """The commit of the working tree the suite measured, and whether wdstream/ differed from it
    (read-only git calls)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "wdstream"], cwd=REPO,
                               env=env, capture_output=True, timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return f"{head}{' + uncommitted changes in wdstream/' if dirty else ''}"


def machine_cpu() -> dict[str, float]:
    """The whole machine's CPU seconds so far by kind, from /proc/stat's first line (user,
    nice, system, irq, softirq; idle, I/O wait and the hypervisor's steal left out)."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:8]]
    hertz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq = ticks
    return {"user": user / hertz, "nice": nice / hertz, "system": system / hertz,
            "irq": irq / hertz, "softirq": softirq / hertz}


def machine_date() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def memory_settings() -> str:
    """The kernel's settings that decide what a new page costs here: transparent huge pages,
    and free page reporting (a virtual machine's host takes back the memory the guest frees,
    in blocks from 2^order pages, and backs it again, page by page, when it is touched)."""
    parts = []
    try:
        enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        parts.append(f"transparent huge pages {enabled.split('[')[1].split(']')[0]}")
    except (OSError, IndexError):
        pass
    try:
        order = int(Path("/sys/module/page_reporting/parameters/page_reporting_order")
                    .read_text())
    except (OSError, ValueError):
        order = None
    if order is not None:
        # above the largest block the kernel frees (order 10), nothing is reported
        parts.append(f"free page reporting from {4 << order} KiB blocks" if order <= 10
                     else "free page reporting off")
    return ", ".join(parts) or "unknown"


def machine() -> dict:
    """CPU count, memory, Python and library versions, date."""
    memory = None
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except ImportError:
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            pass
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": machine_date(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory": f"{memory / 2**30:.1f} GiB" if memory else "unknown",
        "os": platform.platform(),
        "python": platform.python_version(),
        "source": source_version(),
        "memory_settings": memory_settings(),
    }
    for name in ("torch", "webdataset", "wdstream", "numpy", "boto3", "s3fs", "moto", "orjson",
                 "datasets", "litdata", "mosaicml-streaming", "psutil"):
        info[name] = _version(name)
    return info


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
