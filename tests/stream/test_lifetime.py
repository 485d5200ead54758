"""Nothing on stderr ("Exception ignored in ...") when loaders and iterators are dropped
half-way, or left open when a script exits, with and without workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.shard_data import write_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exit")
    write_dataset(folder, [30, 30, 30, 30], payload=150_000)  # large members: shared memory
    return str(folder)


def run_script(body: str, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=180)


PRELUDE = """
import gc
import wdstream

def dataset(**options):
    return wdstream.StreamingDataset({source!r}, shuffle_window=10, **options)

def loader(ds, **options):
    return wdstream.DataLoader(ds, batch_size=4, num_workers={workers}, **options)

def mix():
    return wdstream.Mix([dataset(), dataset(seed=1)], [1, 1])

def packed():
    return wdstream.PackedSequences(dataset(), lambda text: [1, 2, 3], seq_len=8, eos=0,
                                    text_field="txt")
"""


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_dropping_iterators_half_way_prints_nothing(data, workers):
    result = run_script(PRELUDE.format(source=data, workers=workers) + """
for make in (dataset, mix, packed):
    for options in ({}, {"bytes_as": "tensor"}):
        it = iter(loader(make(), **options))
        next(it), next(it)
        del it
        gc.collect()
    for batch in loader(make()):
        break
    it = iter(make())
    next(it)
    del it, batch
    gc.collect()
print("done")
""")
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_exiting_with_iterators_open_prints_nothing(data, workers):
    result = run_script(PRELUDE.format(source=data, workers=workers) + """
open_ones = [iter(loader(dataset())), iter(loader(dataset(), bytes_as="tensor")),
             iter(loader(mix())), iter(loader(packed())), iter(dataset()), iter(mix())]
for it in open_ones:
    next(it)
import torch.utils.data
plain = iter(torch.utils.data.DataLoader(dataset(), num_workers={workers}))
next(plain)
""".replace("{workers}", str(workers)))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.slow
def test_exiting_after_an_error_prints_only_the_error(tmp_path):
    write_dataset(tmp_path, [5, 5])
    (tmp_path / "shard-000001.tar").write_bytes(b"not a tar" * 100)
    result = run_script(f"""
import wdstream
ds = wdstream.StreamingDataset({str(tmp_path)!r}, shuffle=False, retries=0)
it = iter(wdstream.DataLoader(ds, batch_size=2, num_workers=2))
try:
    for batch in it:
        pass
except wdstream.ShardError as error:
    print("raised", type(error).__name__)
other = iter(wdstream.DataLoader(ds, batch_size=2, num_workers=2))
next(other)
""")
    assert result.returncode == 0 and "raised ShardError" in result.stdout, result.stderr
    assert result.stderr == ""


@pytest.mark.slow
def test_exiting_while_streaming_from_s3_prints_nothing(s3, s3_bucket, tmp_path):
    write_dataset(tmp_path, [20, 20], payload=100_000)
    client = s3.client()
    for name in os.listdir(tmp_path):
        client.upload_file(str(tmp_path / name), s3_bucket, f"ds/{name}")
    result = run_script(f"""
import wdstream
ds = wdstream.StreamingDataset("s3://{s3_bucket}/ds/", shuffle_window=5)
first = iter(wdstream.DataLoader(ds, batch_size=2, num_workers=2))
second = iter(wdstream.DataLoader(ds, batch_size=2))
direct = iter(ds)
next(first), next(second), next(direct)
""", env=s3.env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
