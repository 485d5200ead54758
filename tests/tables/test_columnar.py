"""Columns of lists of numbers in raw files (pre-tokenized ``input_ids``, labels, embeddings)
come out as numpy arrays: values and dtypes as pyarrow reads them, views of one copy per unit,
stacked into tensors by the default collate, resumed exactly; strings stay ``str``, nulls
give Python values."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import wdstream
from tests.support.raw_data import keys_of, loader_of, roundtrip, take

pytestmark = pytest.mark.usefixtures("single_rank")
TOKENS = 64
ROWS = 90


def table(first: int, count: int):
    """Rows of every kind of list column: variable and fixed lengths, 32- and 64-bit offsets,
    integers and floats, a list with a null, lists of strings, and text."""
    import pyarrow as pa

    ids = np.arange(first, first + count)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": [f"row {i}" for i in ids],
        "input_ids": pa.array([np.arange(TOKENS, dtype=np.int32) + i for i in ids],
                              pa.list_(pa.int32())),
        "ragged": pa.array([list(range(i % 5)) for i in ids], pa.large_list(pa.int64())),
        "embedding": pa.array([[i / 2, -i / 4, 1.5] for i in ids], pa.list_(pa.float32(), 3)),
        "labels": pa.array([None if i % 7 == 3 else [i, i + 1] for i in ids],
                           pa.list_(pa.int16())),
        "words": pa.array([["a", str(i)] for i in ids], pa.list_(pa.string())),
    })


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("columnar")
    pq.write_table(table(0, 50), root / "a.parquet", row_group_size=20)
    pq.write_table(table(50, ROWS - 50), root / "b.parquet", row_group_size=16)
    return root


def expected_rows(folder) -> dict[str, dict]:
    import pyarrow.parquet as pq

    out = {}
    for name in ("a.parquet", "b.parquet"):
        for row, values in enumerate(pq.read_table(folder / name).to_pylist()):
            out[f"{name}:{row}"] = values
    return out


def check_row(sample: dict, expected: dict) -> None:
    for name in ("input_ids", "ragged", "embedding"):
        value = sample[name]
        assert isinstance(value, np.ndarray) and value.flags.writeable, name
        assert value.tolist() == expected[name], name
    assert sample["input_ids"].dtype == np.int32
    assert sample["ragged"].dtype == np.int64
    assert sample["embedding"].dtype == np.float32
    assert sample["text"] == expected["text"] and isinstance(sample["text"], str)
    assert sample["words"] == expected["words"]


def test_list_columns_are_arrays_equal_to_pyarrows(folder):
    expected = expected_rows(folder)
    samples = list(wdstream.StreamingDataset(str(folder), shuffle=False))
    assert [s["__key__"] for s in samples] == list(expected)
    for sample in samples:
        check_row(sample, expected[sample["__key__"]])


def test_a_unit_is_one_copy_its_rows_views_of_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = pa.array([[i, i + 1] for i in range(700)], pa.list_(pa.int32()))
    pq.write_table(pa.table({"ids": ids}), tmp_path / "t.parquet", row_group_size=600)
    samples = list(wdstream.StreamingDataset(str(tmp_path), shuffle=False))
    first_unit, second_unit = samples[:600], samples[600:]  # more rows than one list of samples
    assert len({id(s["ids"].base) for s in first_unit}) == 1
    assert first_unit[0]["ids"].base is not second_unit[0]["ids"].base
    assert first_unit[0]["ids"].base.size == 600 * 2
    assert samples[599]["ids"].tolist() == [599, 600]


def test_a_column_of_several_sliced_chunks_is_one_copy():
    import pyarrow as pa

    from wdstream.tables.formats import Rows

    ragged = pa.chunked_array([pa.array([[1, 2], [3]], pa.list_(pa.int32())),
                               pa.array([[4, 5, 6], [], [7]], pa.list_(pa.int32())).slice(1)])
    fixed = pa.chunked_array([pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int64(), 2)).slice(1),
                              pa.array([[7, 8], [9, 10]], pa.list_(pa.int64(), 2))])
    rows = Rows(pa.table({"ragged": ragged, "fixed": fixed})).rows(0, 4)
    assert [r["ragged"].tolist() for r in rows] == [[1, 2], [3], [], [7]]
    assert [r["fixed"].tolist() for r in rows] == [[3, 4], [5, 6], [7, 8], [9, 10]]
    assert len({id(r["ragged"].base) for r in rows}) == 1
    assert all(r["ragged"].flags.writeable for r in rows)
    assert rows[3]["ragged"].base.size == 4  # the chunks' values in the rows, not around them


def test_a_unit_with_a_null_list_gives_python_values(folder):
    samples = list(wdstream.StreamingDataset(str(folder), columns=["labels"], shuffle=False))
    labels = [s["labels"] for s in samples]
    assert labels[3] is None and labels[4] == [4, 5] and type(labels[4]) is list


def test_an_arrow_file_gives_arrays_too(tmp_path, folder):
    import pyarrow as pa

    data = table(0, 30)
    with pa.ipc.new_stream(tmp_path / "data.arrow", data.schema) as writer:
        writer.write_table(data, max_chunksize=8)
    samples = list(wdstream.StreamingDataset(str(tmp_path / "data.arrow"), shuffle=False))
    rows = data.to_pylist()
    assert len(samples) == 30
    for sample, row in zip(samples, rows, strict=True):
        check_row(sample, row)


def test_a_batch_through_the_loader_is_tensors_of_the_columns_dtypes(folder):
    import torch

    expected = expected_rows(folder)
    loader = loader_of(str(folder), batch_size=4, workers=2,
                       columns=["input_ids", "embedding", "text"])
    batches = list(loader)
    assert sum(len(b["__key__"]) for b in batches) == ROWS
    for batch in batches:
        size = len(batch["__key__"])
        assert batch["input_ids"].dtype == torch.int32
        assert tuple(batch["input_ids"].shape) == (size, TOKENS)
        assert batch["embedding"].dtype == torch.float32
        assert tuple(batch["embedding"].shape) == (size, 3)
        for key, ids, text in zip(batch["__key__"], batch["input_ids"], batch["text"],
                                  strict=True):
            assert ids.tolist() == expected[key]["input_ids"] and text == expected[key]["text"]


def test_batch_tensors_cross_in_the_workers_arena_and_its_memory_is_reused(folder,
                                                                           monkeypatch):
    """A worker stacks a batch into its arena (the tensor's memory lies in a segment the main
    process keeps mapped); segments come back once the main process drops their batches, and
    a batch it holds keeps its values, even through a view of another dtype, while later
    ones reuse the memory around it."""
    import torch

    from wdstream.stream.transfer import shm

    expected = expected_rows(folder)
    # small segments (inherited by the forked worker): a few batches each
    monkeypatch.setattr(shm.Arena, "SEGMENT", shm.MemorySegment.HOLDS + 4 * 2 * TOKENS * 4 + 256)
    monkeypatch.setattr(wdstream.DataLoader, "FETCH_SAMPLES", 2)  # one batch per fetch
    dataset = wdstream.StreamingDataset(str(folder), columns=["input_ids"], seed=3)
    loader = wdstream.DataLoader(dataset, batch_size=2, num_workers=1, prefetch_factor=1)
    held, segments = None, set()
    for batch in loader:
        ids = batch["input_ids"]
        kept = [t for worker in shm._kept.values() for t in worker.values()]
        segment = [t.data_ptr() for t in kept
                   if t.data_ptr() <= ids.data_ptr() < t.data_ptr() + t.numel()]
        assert len(segment) == 1
        segments.add(segment[0])
        if held is None:
            held = batch["__key__"], ids.view(torch.uint8)  # the batch itself let go
    keys, raw = held
    assert [expected[k]["input_ids"] for k in keys] == raw.view(torch.int32).tolist()
    assert len(segments) <= 4  # 45 batches, 4 to a segment: reused, not one per 4 batches


def test_resume_gives_the_same_arrays(folder):
    def batches(loader):
        return [(b["__key__"], b["input_ids"].tolist()) for b in loader]

    options = {"columns": ["input_ids"], "batch_size": 4}
    whole = batches(loader_of(str(folder), **options))
    loader = loader_of(str(folder), **options)
    first = batches(take(loader, 5))
    resumed = loader_of(str(folder), **options)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    assert first + batches(resumed) == whole
    assert keys_of(loader_of(str(folder), **options)) == [k for k, _ in whole]


def test_packed_sequences_take_the_arrays_as_token_ids(folder):
    ds = wdstream.StreamingDataset(str(folder), columns=["input_ids"], shuffle=False)
    packed = wdstream.PackedSequences(ds, seq_len=TOKENS + 1, text_field="input_ids", eos=7)
    first = next(iter(packed))
    assert first["input_ids"].tolist() == [*range(TOKENS), 7]


@pytest.mark.slow
def test_cat_prints_an_array_as_a_json_list(folder, cli_env):
    shown = subprocess.run(["wdstream", "cat", str(folder), "-n", "1", "--fields", "ragged"],
                           env=cli_env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"ragged": [], "__key__": "a.parquet:0"}
    shown = subprocess.run(["wdstream", "cat", str(folder), "--key", "a.parquet:3", "--fields",
                            "embedding"], env=cli_env, capture_output=True, text=True,
                           timeout=120)
    assert json.loads(shown.stdout)["embedding"] == [1.5, -0.75, 1.5]
