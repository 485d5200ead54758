"""Raw files for the tests of streaming them where they lie: Parquet folders (a file in a
subfolder, as the Hugging Face Hub lays them out), their rows' keys, uploads to the moto
server keeping subfolders, and helpers that run loaders over them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import wdstream

# (name, rows, row group size): 12 row groups of 3 to 40 rows, 226 rows in all
PARQUET_FILES = [("part-0.parquet", 70, 40), ("part-1.parquet", 43, 20),
                 ("train/part-2.parquet", 113, 30)]


def rows_of(name: str, count: int) -> list[dict]:
    base = sum(1 for _ in name) * 1000
    return [{"id": base + i, "text": f"{name} row {i}", "tokens": [i, i + 1, i + 2],
             "score": i / 4} for i in range(count)]


def write_parquet(folder: Path, files=PARQUET_FILES) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, count, group in files:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows_of(name, count)), path,
                       row_group_size=group, compression="zstd")
    return folder


def all_keys(files=PARQUET_FILES) -> set[str]:
    return {f"{name}:{i}" for name, count, _ in files for i in range(count)}


def upload_tree(client, bucket: str, folder: Path, prefix: str) -> str:
    """Every file below ``folder`` under ``s3://bucket/prefix/``, subfolders kept."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder)}")
    return f"s3://{bucket}/{prefix}/"


def keys_of(batches) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


def take(loader, n: int) -> list:
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            break
    return batches


def counted(*parts) -> Counter:
    return Counter(key for part in parts for batch in part for key in batch)


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


def loader_of(source, batch_size=5, workers=2, **options):
    options.setdefault("seed", 3)
    options.setdefault("shuffle_window", 16)
    return wdstream.DataLoader(wdstream.StreamingDataset(source, **options),
                               batch_size=batch_size, num_workers=workers)


def check_resume(source, keys: set[str]) -> None:
    """Stopped after 9 batches of 4 (two workers): resumed as it was, the loader gives what
    one run would have; resumed with batches of 6 and one worker, every key once."""
    whole = keys_of(loader_of(source, batch_size=4))
    loader = loader_of(source, batch_size=4)
    first = keys_of(take(loader, 9))
    same = loader_of(source, batch_size=4)
    same.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(same) == whole
    other = loader_of(source, batch_size=6, workers=1)
    other.load_state_dict(roundtrip(loader.state_dict()))
    seen = counted(first, keys_of(other))
    assert set(seen) == keys and max(seen.values()) == 1


def stored(name: str, data: bytes) -> bytes:
    """``data`` as a file called ``name`` holds it: gzip or zstd by its ending."""
    import gzip

    import zstandard

    if name.endswith(".gz"):
        return gzip.compress(data)
    if name.endswith(".zst"):
        return zstandard.ZstdCompressor().compress(data)
    return data


# (name, rows): a plain file cut into several ranges (RANGE_BYTES made small), a gzip and a
# zstd one, and a plain one in a subfolder
JSONL_FILES = [("a.jsonl", 90), ("b.jsonl.gz", 40), ("c.jsonl.zst", 35), ("more/d.jsonl", 25)]


def write_jsonl(folder: Path, files=JSONL_FILES, blank_every: int = 17) -> Path:
    for name, count in files:
        lines = []
        for i, row in enumerate(rows_of(name, count)):
            lines.append(json.dumps(row))
            if i % blank_every == blank_every - 1:
                lines.append("")  # blank lines are not rows
        data = stored(name, ("\n".join(lines) + "\n").encode())
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def jsonl_keys(files=JSONL_FILES) -> set[str]:
    return {f"{name}:{i}" for name, count in files for i in range(count)}
