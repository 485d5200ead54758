"""Small generated datasets for tests: shards written with wdstream's TarWriter and a manifest."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os

from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.shards.tar_writer import TarWriter


def sample_key(shard: int, index: int) -> str:
    return f"s{shard:03d}_{index:05d}"


def shard_bytes(shard: int, count: int, payload: int = 0) -> bytes:
    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for index in range(count):
        key = sample_key(shard, index)
        record = {"shard": shard, "index": index, "pad": "x" * payload}
        writer.add(f"{key}.json", json.dumps(record).encode())
        writer.add(f"{key}.txt", f"text {shard} {index}".encode())
    writer.close()
    return buffer.getvalue()


def write_dataset(folder, counts, *, payload: int = 0, manifest: bool = True) -> list[str]:
    """Write shards with the given sample counts (and index.json); return the shard paths."""
    os.makedirs(folder, exist_ok=True)
    infos, paths = [], []
    for shard, count in enumerate(counts):
        data = shard_bytes(shard, count, payload)
        name = f"shard-{shard:06d}.tar"
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
        infos.append(ShardInfo(name, count, len(data), hashlib.sha256(data).hexdigest()))
    if manifest:
        text = Manifest(infos, extensions=["json", "txt"]).to_json()
        with open(os.path.join(folder, "index.json"), "w") as f:
            f.write(text)
    return paths


def all_keys(counts) -> set[str]:
    return {sample_key(s, i) for s, n in enumerate(counts) for i in range(n)}


def first_batches(loader, n: int) -> list:
    """The first ``n`` batches of a fresh iteration, then stop (as a crash would)."""
    return list(itertools.islice(iter(loader), n)) if n else []


def batch_keys(batches) -> list[tuple[str, ...]]:
    """Each batch's ``__key__`` list, as a tuple."""
    return [tuple(batch["__key__"]) for batch in batches]


def take(loader, n: int, view=batch_keys) -> list:
    """``view`` of the first ``n`` batches of a fresh iteration (by default each batch's keys,
    as a tuple), then stop."""
    return view(first_batches(loader, n))


def keys_of(loader) -> list[str]:
    """Every key that one iteration of ``loader`` yields, in order."""
    return [key for batch in loader for key in batch["__key__"]]
