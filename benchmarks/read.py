"""Reading throughput: wdstream against its peers and against the raw speed of the storage.

Tables (every case in a fresh process, ``common.RUNS`` runs interleaved, medians; ratios are
between cases of the same suite run):

small records
    ~1 KiB JSON samples from local shards, 2 DataLoader workers, ``batch_size=32``, each library's
    default collate; with JSON decoding and without. Peers: plain ``webdataset.WebDataset``,
    Hugging Face ``datasets`` streaming (JSONL, and its ``webdataset`` builder on the same tar
    shards), LitData (its own chunk format, converted once, untimed), Mosaic ``streaming``.
large samples
    ~1 MiB samples from local shards: MB/s against ``cat`` of the same files to /dev/null.
s3
    The same large samples on a moto server on 127.0.0.1: wdstream with each opener against a bare
    boto3 ``get_object`` + ``iter_chunks`` loop over the same shards; time to first batch.
memory
    Peak resident memory of the whole process tree while streaming ~1 GB and ~4 GB (quick: a
    quarter of that); wdstream against webdataset.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from . import common
from .common import Skip, consume, quiet_logs, ratio

TITLE = "Reading throughput"
WORKERS = 2
BATCH = 32
MiB = 1 << 20

FULL = {"small_samples": 100_000, "small_per_shard": 1000, "big_samples": 1024,
        "big_per_shard": 64, "s3_samples": 512, "rss_small_gb": 1, "rss_large_gb": 4}
QUICK = {"small_samples": 16_000, "small_per_shard": 500, "big_samples": 192,
         "big_per_shard": 32, "s3_samples": 128, "rss_small_gb": 0.25, "rss_large_gb": 1}

# Why a peer is absent: found by `pip install --dry-run PEER torch==2.13.0` on this machine.
NOT_INSTALLABLE = {
    "litdata": "pip pulls torchvision 0.28.0, a CUDA build that fails to import beside the CPU "
               "torch 2.13.0 ('operator torchvision::nms does not exist'); measurable when "
               "installed with --no-deps into a folder named by WDSTREAM_BENCH_SITE",
    "streaming": "mosaicml-streaming 0.13.0 pins numpy<2.2 (would downgrade numpy 2.4 to 2.1.3), "
                 "transformers<5 and pulls the CUDA torchvision 0.28.0",
}


# =========================================================================== cases (child side)


def case_wdstream(source: str, decode: bool = True, expected: int | None = None,
                  opener: str = "auto", workers: int = WORKERS, batch: int | None = BATCH,
                  shuffle: bool = False) -> dict:
    quiet_logs()
    import wdstream

    started = time.perf_counter()
    dataset = wdstream.StreamingDataset(source, shuffle=shuffle, decode=decode, opener=opener)
    loader = wdstream.DataLoader(dataset, batch_size=batch, num_workers=workers)
    return consume(loader, started, expected)


def case_wdstream_inprocess(source: str, expected: int | None = None) -> dict:
    """The reader alone: the dataset iterated in this process, no DataLoader."""
    quiet_logs()
    import wdstream

    started = time.perf_counter()
    dataset = wdstream.StreamingDataset(source, shuffle=False, decode=False)
    items, first = 0, None
    for _sample in dataset:
        if first is None:
            first = time.perf_counter()
        items += 1
    seconds = time.perf_counter() - started
    if expected is not None and items != expected:
        raise RuntimeError(f"read {items} samples, expected {expected}")
    return {"samples": items, "seconds": seconds, "ttfb_s": first - started}


def case_webdataset(urls: list[str], decode: bool = True, expected: int | None = None) -> dict:
    quiet_logs()
    import torch.utils.data
    import webdataset as wds

    started = time.perf_counter()
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if decode:
        dataset = dataset.decode()
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return consume(loader, started, expected)


def case_hf(files: list[str], builder: str, expected: int | None = None) -> dict:
    """Hugging Face datasets streaming: ``builder`` "json" (JSONL parsed), "text" (raw lines),
    or "webdataset" (the tar shards, JSON decoded)."""
    quiet_logs()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError as error:
        raise Skip(f"datasets not installed ({error})") from None
    import torch.utils.data

    datasets.disable_progress_bars()
    started = time.perf_counter()
    dataset = datasets.load_dataset(builder, data_files={"train": files}, split="train",
                                    streaming=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return consume(loader, started, expected)


def _litdata_record(path: str):
    """LitData ``optimize`` input function: one dict per tar member (module level: picklable)."""
    from wdstream.shards.tar import iter_members

    with open(path, "rb") as file:
        for name, payload in iter_members(file, path):
            yield {"key": name.split(".", 1)[0], "json": payload}


def prepare_litdata(shards: list[str], output: str) -> dict:
    """Convert the tar shards to LitData's chunk format once (not timed in the benchmark)."""
    quiet_logs()
    try:
        import litdata
    except ImportError as error:
        raise Skip(f"litdata not installed ({error})") from None
    started = time.perf_counter()
    litdata.optimize(fn=_litdata_record, inputs=shards, output_dir=output, chunk_bytes="64MB",
                     num_workers=1, mode="overwrite")
    return {"seconds": time.perf_counter() - started}


def case_litdata(directory: str, decode: bool = True, expected: int | None = None) -> dict:
    quiet_logs()
    try:
        import litdata
    except ImportError as error:
        raise Skip(f"litdata not installed ({error})") from None
    import json

    class JsonDataset(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            if decode:
                item["json"] = json.loads(item["json"])
            return item

    started = time.perf_counter()
    dataset = JsonDataset(directory, shuffle=False, drop_last=False)
    loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return consume(loader, started, expected)


def case_mosaic(directory: str, expected: int | None = None) -> dict:
    try:
        import streaming  # noqa: F401
    except ImportError as error:
        raise Skip(f"mosaicml-streaming not installed ({error})") from None
    raise Skip("mosaicml-streaming is installed but its case needs an MDS conversion: "
               "not implemented")


def case_cat(files: list[str]) -> dict:
    started = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    return {"seconds": time.perf_counter() - started, "samples": None}


def case_boto3(bucket: str, keys: list[str]) -> dict:
    """A bare streaming loop: ``get_object`` and ``iter_chunks(1 MiB)``, one shard after the
    other, one process."""
    import boto3

    client = boto3.client("s3")
    started = time.perf_counter()
    first = None
    total = 0
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in body.iter_chunks(MiB):
            if first is None:
                first = time.perf_counter()
            total += len(chunk)
    return {"seconds": time.perf_counter() - started, "bytes_read": total,
            "ttfb_s": first - started}
