"""Arrow IPC files streamed where they lie: a folder written by datasets.Dataset.save_to_disk
(stream format, with dataset_info.json and state.json beside) and IPC file-format files, local
and on the moto S3 server; runs of record batches as units; exact and elastic resume; a
truncated or foreign file is an error naming it."""

from __future__ import annotations

import pytest

import wdstream
from tests.support.raw_data import counted, keys_of, loader_of, roundtrip, take, upload_tree
from wdstream.errors import ShardError, ShardMismatchError
from wdstream.tables import arrow

pytestmark = pytest.mark.usefixtures("single_rank")
ROWS = 2500  # datasets writes batches of 1000 rows: 2 a file


@pytest.fixture(autouse=True)
def small_units(monkeypatch):
    monkeypatch.setattr(arrow, "RANGE_BYTES", 4000)  # several units a file


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder datasets.Dataset.save_to_disk wrote."""
    import datasets

    folder = tmp_path_factory.mktemp("arrow") / "saved"
    table = datasets.Dataset.from_dict({"id": list(range(ROWS)),
                                        "text": [f"row {i}" for i in range(ROWS)],
                                        "input_ids": [[i, i + 1] for i in range(ROWS)]})
    table.save_to_disk(str(folder), num_shards=2)
    assert (folder / "state.json").exists()
    return folder


def ids_of(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


@pytest.mark.slow
def test_a_saved_dataset_streams_every_row_once_and_resumes(saved):
    ds = wdstream.StreamingDataset(str(saved), seed=1)
    assert len(ds) == ROWS and len(ds.shards) > 2
    whole = list(wdstream.DataLoader(ds, batch_size=8, num_workers=2))
    assert sorted(ids_of(whole)) == list(range(ROWS))
    for batch in whole:
        for key, text, ids in zip(batch["__key__"], batch["text"], batch["input_ids"],
                                  strict=True):
            assert key.startswith("data-0000") and text.startswith("row ")
            assert ids[1] == ids[0] + 1
    loader = loader_of(str(saved), batch_size=8, seed=1, shuffle_window=1000)
    first = keys_of(take(loader, 20))
    same = loader_of(str(saved), batch_size=8, seed=1, shuffle_window=1000)
    same.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(same) == keys_of(whole)
    other = loader_of(str(saved), batch_size=5, workers=1, seed=1, shuffle_window=1000)
    other.load_state_dict(roundtrip(loader.state_dict()))
    seen = counted(first, keys_of(other))
    assert len(seen) == ROWS and max(seen.values()) == 1


@pytest.mark.slow
def test_on_s3_with_columns(s3, s3_bucket, saved):
    url = upload_tree(s3.client(), s3_bucket, saved, "saved")
    samples = list(wdstream.StreamingDataset(url, columns=["text"], shuffle=False))
    assert [s["text"] for s in samples[:2]] == ["row 0", "row 1"]
    assert set(samples[0]) == {"text", "__key__", "__url__"} and len(samples) == ROWS


def test_the_ipc_file_format_too(tmp_path):
    import pyarrow as pa

    table = pa.table({"a": list(range(100)), "b": [str(i) for i in range(100)]})
    with pa.ipc.new_file(str(tmp_path / "x.arrow"), table.schema) as writer:
        for i in range(4):
            writer.write_table(table.slice(25 * i, 25))
    rows = list(wdstream.StreamingDataset(str(tmp_path), shuffle=False))
    assert [r["a"] for r in rows] == list(range(100)) and rows[7]["__key__"] == "x.arrow:7"


def test_truncated_and_foreign_files(tmp_path, saved):
    data = (saved / "data-00000-of-00002.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match="cut.arrow: not a readable Arrow IPC file"):
        wdstream.StreamingDataset(str(tmp_path / "cut.arrow"))
    (tmp_path / "cut.arrow").write_bytes(b"PAR1 not arrow at all")
    with pytest.raises(ShardError, match="cut.arrow: not a readable Arrow IPC file"):
        wdstream.StreamingDataset(str(tmp_path / "cut.arrow"))
    (tmp_path / "cut.arrow").write_bytes(data)
    ds = wdstream.StreamingDataset(str(tmp_path / "cut.arrow"), retries=0)
    (tmp_path / "cut.arrow").write_bytes(data[:-100])
    with pytest.raises(ShardMismatchError, match="cut.arrow: changed since the plan"):
        list(ds)
