"""Mosaic streaming's side of ``benchmarks/mosaic.py``, run by the interpreter of Mosaic's own
virtualenv (``python benchmarks/mosaic_venv.py convert|read ARGS_JSON OUT_JSON``).

It imports neither wdstream nor anything outside the standard library, Mosaic's ``streaming``,
torch and numpy, so it runs where wdstream is not installed.

``streaming/__init__.py`` imports ``streaming.vision`` (CIFAR-10, ImageNet...), which needs
torchvision; the only torchvision wheel pip finds for torch 2.13.0 is a CUDA build that does not
load beside the CPU torch, so the venv is built without it and the vision sub-package, which
these cases never use, is registered as an empty module before ``streaming`` is imported.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import types


def _streaming():
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def convert(jsonl: list[str], output: str) -> dict:
    """The JSON records (one per JSONL line, the bytes of the tar members) to MDS with Mosaic's
    own ``MDSWriter``: columns ``key`` (str) and ``json`` (bytes)."""
    streaming = _streaming()
    started = time.perf_counter()
    index = 0
    with streaming.MDSWriter(out=output, columns={"key": "str", "json": "bytes"},
                             size_limit="64mb") as writer:
        for path in jsonl:
            with open(path, "rb") as file:
                for line in file:
                    line = line.rstrip(b"\n")
                    if line:
                        writer.write({"key": f"{index:010d}", "json": line})
                        index += 1
    return {"samples": index, "seconds": time.perf_counter() - started}


def _touch(batch) -> int:
    """One byte of every 4 KiB page of every bytes payload in a collated batch (as
    ``benchmarks.common.touch_pages`` does for the other readers)."""
    total = 0
    values = batch.values() if isinstance(batch, dict) else batch
    for value in values:
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, (bytes, bytearray)):
                    total += sum(item[::4096])
    return total


def read(directory: str, decode: bool, shuffle: bool, workers: int, batch: int,
         expected: int | None = None) -> dict:
    streaming = _streaming()
    import torch.utils.data
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    class JsonDataset(streaming.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            if decode:
                item["json"] = json.loads(item["json"])
            return item

    gc.collect()  # as benchmarks.common.start_clock: torch's import debt paid first
    started = time.perf_counter()
    dataset = JsonDataset(local=directory, shuffle=shuffle, batch_size=batch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)
    items, first = 0, None
    for got in loader:
        if first is None:
            first = time.perf_counter()
        _touch(got)
        items += len(got["key"])
    seconds = time.perf_counter() - started
    if expected is not None and items != expected:
        raise RuntimeError(f"Mosaic read {items} samples, expected {expected}")
    return {"samples": items, "seconds": seconds, "ttfb_s": first - started}


def main(argv: list[str]) -> int:
    command, args, out_path = argv
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    function = {"convert": convert, "read": read}[command]
    result = function(**json.loads(args))
    with open(out_path, "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
