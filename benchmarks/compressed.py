"""Compressed shards and image decoding: what zstd saves, what reading it costs, and how fast
images decode in the workers.

Tables (ratios between cases of the same run; every read case in a fresh process,
``common.RUNS`` runs interleaved, medians):

size
    ~1 KiB JSON records of text (words drawn from a Zipf-distributed vocabulary of 5,000, so
    that they compress about as English does, not as a repeated phrase would), packed with
    ``wdstream pack`` as plain tar, ``--compress zstd`` (default level 3) and ``--compress
    gzip`` (level 6): stored bytes ÷ plain tar.
read
    The same shards read through ``wdstream.DataLoader`` (2 workers, batch 32, JSON decoded)
    from local files and from a moto S3 server on 127.0.0.1: samples/s of each compressed
    kind ÷ plain tar.
images
    JPEGs of ~100 KiB (512x384), 2 workers, batch 32, decoded to uint8 HxWx3 arrays:
    ``StreamingDataset(decode="rgb8")`` against ``webdataset.WebDataset(...).decode("rgb8")``
    with torch's DataLoader, on the same shards; both batches collate into one tensor.

``python -m benchmarks --only compressed [--quick]`` runs it alone.
"""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path

from . import common
from .common import consume, quiet_logs, ratio
from .read import goal

TITLE = "Compressed shards and image decoding"
WORKERS = 2
BATCH = 32
T_GOALS, T_SIZE, T_READ, T_IMAGES = "goals", "size", "read", "images"
FULL = {"records": 200_000, "per_shard": 5_000, "images": 2_000, "images_per_shard": 250}
QUICK = {"records": 20_000, "per_shard": 2_000, "images": 320, "images_per_shard": 80}


# =========================================================================== cases (child side)


def case_read(source: str, expected: int, opener: str = "auto") -> dict:
    quiet_logs()
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401 - import torch before the clock starts
    import wdstream.stream.load.loader  # noqa: F401

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, shuffle=False, opener=opener)
    loader = wdstream.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return consume(loader, started, expected)


def case_images_wdstream(source: str, expected: int) -> dict:
    quiet_logs()
    import wdstream
    import wdstream.stream.load.dataset  # noqa: F401
    import wdstream.stream.load.loader  # noqa: F401

    started = common.start_clock()
    dataset = wdstream.StreamingDataset(source, shuffle=False, decode="rgb8")
    loader = wdstream.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return _check_images(consume_images(loader, started), expected)


def case_images_webdataset(urls: list[str], expected: int) -> dict:
    quiet_logs()
    import torch.utils.data
    import webdataset as wds

    started = common.start_clock()
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8")
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return _check_images(consume_images(loader, started), expected)


def consume_images(loader, started: float) -> dict:
    import torch

    items, first, stacked = 0, None, True
    for batch in loader:
        if first is None:
            first = time.perf_counter()
        images = batch["jpg"]
        stacked = stacked and isinstance(images, torch.Tensor) and images.dtype == torch.uint8
        items += len(images)
    return {"samples": items, "seconds": time.perf_counter() - started,
            "ttfb_s": None if first is None else first - started, "stacked": stacked}


def _check_images(result: dict, expected: int) -> dict:
    if result["samples"] != expected or not result.pop("stacked"):
        raise RuntimeError(f"read {result['samples']} images of {expected}, or not as one "
                           "uint8 tensor per batch")
    return result


# =========================================================================== data


def _vocabulary(rng: random.Random, size: int = 5000) -> tuple[list[str], list[float]]:
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [1 / (i + 1) for i in range(len(letters))]
    words = {"".join(rng.choices(letters, weights, k=rng.randint(2, 10))) for _ in range(size)}
    words = sorted(words)
    rng.shuffle(words)
    return words, [1 / (rank + 1) for rank in range(len(words))]


def write_records(path: Path, records: int, seed: int = 11) -> int:
    rng = random.Random(seed)
    words, weights = _vocabulary(rng)
    total = 0
    with open(path, "w") as out:
        for index in range(records):
            text = " ".join(rng.choices(words, weights, k=150))[:900]
            line = json.dumps({"id": index, "url": f"https://example.com/{index}",
                               "text": text}) + "\n"
            total += len(line)
            out.write(line)
    return total


def _jpeg(rng, width: int = 512, height: int = 384) -> bytes:
    import numpy as np
    from PIL import Image

    x = np.linspace(0, 1, width)[None, :, None]
    y = np.linspace(0, 1, height)[:, None, None]
    phase = rng.random(3)
    base = 0.5 + 0.5 * np.sin(8 * np.pi * (x * phase + y * (1 - phase)))
    noise = rng.normal(0, 0.12, (height, width, 3))
    pixels = (np.clip(base + noise, 0, 1) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


def write_images(folder: Path, count: int, per_shard: int) -> dict:
    import numpy as np

    from wdstream.shards.index_shards import index_shards
    from wdstream.shards.manifest import write_manifest
    from wdstream.shards.tar_writer import TarWriter

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    shards, sizes = [], []
    for shard in range(-(-count // per_shard)):
        path = folder / f"images-{shard:06d}.tar"
        with open(path, "wb") as file:
            writer = TarWriter(file)
            for index in range(shard * per_shard, min(count, (shard + 1) * per_shard)):
                data = _jpeg(rng)
                sizes.append(len(data))
                writer.add(f"{index:08d}.jpg", data)
                writer.add(f"{index:08d}.cls", b"%d" % (index % 10))
            writer.close()
        shards.append(str(path))
    write_manifest(index_shards(shards, base=str(folder)), str(folder))
    return {"dir": str(folder), "shards": shards, "mean_bytes": sum(sizes) / len(sizes)}


# =========================================================================== suite


def _size(root: Path, sizes: dict) -> tuple[list[dict], dict]:
    from wdstream.write.packer import pack

    records = sizes["records"]
    source = root / "records.jsonl"
    common.log(f"compressed: writing {records:,} ~1 KiB JSON records")
    text_bytes = write_records(source, records)
    outputs = {}
    for kind in ("plain", "zstd", "gzip"):
        output = root / kind
        started = time.perf_counter()
        manifest = pack([source], output, max_count=sizes["per_shard"], overwrite=True,
                        compress=None if kind == "plain" else kind)
        outputs[kind] = {"dir": str(output), "bytes": manifest.bytes,
                         "seconds": time.perf_counter() - started,
                         "shards": [manifest.shard_url(i) for i in range(len(manifest.shards))]}
    plain = outputs["plain"]["bytes"]
    rows = [{"table": T_SIZE, "shards": kind, "stored MB": out["bytes"] / common.MB,
             "÷ plain tar": ratio(out["bytes"], plain),
             "pack s (1 worker)": out["seconds"]} for kind, out in outputs.items()]
    rows.append({"table": T_SIZE, "note": f"{records:,} records, {text_bytes / common.MB:.0f} MB "
                 f"of JSON Lines, {sizes['per_shard']:,} records per shard."})
    return rows, outputs


def _read(outputs: dict, sizes: dict) -> tuple[list[dict], dict]:
    records = sizes["records"]
    here = f"{__name__}:case_read"
    cases = {f"local, {kind}": (here, {"source": out["dir"], "expected": records})
             for kind, out in outputs.items()}
    with common.LocalS3() as s3:
        urls = {kind: s3.upload(out["dir"], "bench", kind) for kind, out in outputs.items()}
        for kind, url in urls.items():
            cases[f"s3, {kind}"] = (here, {"source": url, "expected": records}, s3.env)
        results = common.repeat(cases, progress=common.log)
    rows, summary = [], {}
    for where in ("local", "s3"):
        plain = _rate(results[f"{where}, plain"])
        for kind in outputs:
            result = results[f"{where}, {kind}"]
            rate = _rate(result)
            summary[(where, kind)] = ratio(rate, plain)
            rows.append({"table": T_READ, "from": where, "shards": kind, "samples/s": rate,
                         "÷ plain tar": ratio(rate, plain),
                         "first batch s": result.get("ttfb_s"), "runs": result.get("runs"),
                         "error": result.get("error")})
    rows.append({"table": T_READ, "note": "wdstream.DataLoader, 2 workers, batch 32, JSON "
                 "decoded, no shuffle; S3 is a moto server on 127.0.0.1 sharing the 2 cores."})
    return rows, summary


def _images(root: Path, sizes: dict) -> tuple[list[dict], dict]:
    count = sizes["images"]
    common.log(f"compressed: writing {count:,} JPEGs")
    data = write_images(root / "images", count, sizes["images_per_shard"])
    here = f"{__name__}:"
    cases = {
        'wdstream, decode="rgb8"': (here + "case_images_wdstream",
                                    {"source": data["dir"], "expected": count}),
        'webdataset, .decode("rgb8")': (here + "case_images_webdataset",
                                        {"urls": data["shards"], "expected": count}),
    }
    results = common.repeat(cases, progress=common.log)
    peer = _rate(results['webdataset, .decode("rgb8")'])
    rows = []
    for name, result in results.items():
        rate = _rate(result)
        rows.append({"table": T_IMAGES, "loader": name, "images/s": rate,
                     "÷ webdataset": ratio(rate, peer), "first batch s": result.get("ttfb_s"),
                     "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                     "error": result.get("error")})
    rows.append({"table": T_IMAGES, "note": f"{count:,} JPEGs of 512x384, "
                 f"{data['mean_bytes'] / 1024:.0f} KiB on average, in "
                 f"{len(data['shards'])} shards, from the page cache; 2 workers, batch 32; "
                 "each batch's images arrive as one uint8 tensor (32x384x512x3)."})
    return rows, {"vs_webdataset": ratio(_rate(results['wdstream, decode="rgb8"']), peer)}


def _rate(result: dict):
    samples, seconds = result.get("samples"), result.get("seconds")
    return samples / seconds if samples and seconds and "error" not in result else None


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    with common.scratch() as root:
        size_rows, outputs = _size(root, sizes)
        read_rows, read = _read(outputs, sizes)
        image_rows, images = _images(root, sizes)
    plain = outputs["plain"]["bytes"]
    goals = [
        goal("~1 KiB JSON: zstd shard bytes ÷ plain tar", ratio(outputs["zstd"]["bytes"], plain),
             0.4, higher_is_better=False, table=T_GOALS),
        goal("read, local: zstd ÷ plain tar (samples/s)", read[("local", "zstd")], 0.7,
             table=T_GOALS),
        goal("read, S3 (moto): zstd ÷ plain tar (samples/s)", read[("s3", "zstd")], 0.7,
             table=T_GOALS),
        goal('JPEG ~100 KiB: decode="rgb8" images/s ÷ webdataset .decode("rgb8")',
             images["vs_webdataset"], 1.0, table=T_GOALS),
    ]
    return goals + size_rows + read_rows + image_rows


if __name__ == "__main__":
    import sys

    from .__main__ import run_alone

    sys.exit(run_alone("compressed", TITLE, run))
