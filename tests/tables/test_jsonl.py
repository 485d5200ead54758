"""JSON Lines files (plain, .gz, .zst) streamed where they lie: counted by one scan when the
dataset is built, or from the unit index that `wdstream index SOURCE --output URL` writes
anywhere (here: another bucket); plain files cut into line-aligned ranges, compressed ones
whole; exact and elastic resume; a malformed line, a changed file and a stale index are
errors naming the file and row."""

from __future__ import annotations

import json
import subprocess

import pytest

import wdstream
from tests.support.raw_data import (
    JSONL_FILES,
    check_resume,
    counted,
    jsonl_keys,
    keys_of,
    roundtrip,
    take,
    upload_tree,
    write_jsonl,
)
from tests.support.shard_data import write_dataset
from wdstream.errors import InputError, ManifestError, ShardError, ShardMismatchError
from wdstream.tables import jsonl

pytestmark = pytest.mark.usefixtures("single_rank")
TOTAL = sum(count for _, count in JSONL_FILES)


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    monkeypatch.setattr(jsonl, "RANGE_BYTES", 2000)  # a.jsonl: several units


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("jsonl"))


def test_every_row_once_plain_files_cut_at_line_ends(folder):
    ds = wdstream.StreamingDataset(str(folder), seed=5)
    assert len(ds) == TOTAL
    files = [ds.shards.files[i].name for i in ds.shards.file]
    assert files.count("a.jsonl") > 2 and files.count("b.jsonl.gz") == 1
    batches = list(wdstream.DataLoader(ds, batch_size=4, num_workers=2))
    seen = counted(keys_of(batches))
    assert set(seen) == jsonl_keys() and max(seen.values()) == 1
    for batch in batches:
        for key, text in zip(batch["__key__"], batch["text"], strict=True):
            name, row = key.rsplit(":", 1)
            assert text == f"{name} row {row}"


def test_exact_resume_and_elastic_resume(folder):
    check_resume(str(folder), jsonl_keys())


@pytest.mark.slow
def test_an_index_in_another_bucket_plans_without_reading_the_files(
        s3, s3_bucket, folder, cli_env, monkeypatch):
    data = upload_tree(s3.client(), s3_bucket, folder, "lines")
    elsewhere = s3.create_bucket(s3_bucket + "-indexes")
    index = f"s3://{elsewhere}/lines-index.json"
    result = subprocess.run(["wdstream", "index", data, "--output", index], env=cli_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert str(TOTAL) in result.stdout
    monkeypatch.undo()  # the index was cut at the default range size
    scanned = wdstream.StreamingDataset(data, seed=2)

    def no_scan(*args):
        raise AssertionError("a file was scanned")

    monkeypatch.setattr(jsonl.JsonLinesFormat, "cut", no_scan)
    ds = wdstream.StreamingDataset(data, seed=2, index=index)
    assert list(ds.shards.samples) == list(scanned.shards.samples)
    assert ds.fingerprint() == scanned.fingerprint()
    loader = wdstream.DataLoader(ds, batch_size=5, num_workers=2)
    first = keys_of(take(loader, 5))
    resumed = wdstream.DataLoader(wdstream.StreamingDataset(data, seed=2, index=index),
                                  batch_size=5, num_workers=2)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    seen = counted(first, keys_of(resumed))
    assert set(seen) == jsonl_keys() and max(seen.values()) == 1
    # the data changes: the index no longer describes it
    s3.client().put_object(Bucket=s3_bucket, Key="lines/a.jsonl", Body=b'{"id": 1}\n')
    with pytest.raises(ManifestError, match="a.jsonl: changed since the index"):
        wdstream.StreamingDataset(data, index=index)
    with pytest.raises(ShardMismatchError, match="a.jsonl: changed since the plan"):
        list(ds)


def test_a_malformed_line_names_the_file_and_row(tmp_path):
    rows = [json.dumps({"id": i}) for i in range(5)]
    rows[3] = '{"id": 3,'
    (tmp_path / "bad.jsonl").write_text("\n".join(rows) + "\n")
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False, retries=0)
    with pytest.raises(ShardError, match=r"bad.jsonl: row 3 \(byte 30\) is not JSON"):
        list(ds)
    (tmp_path / "bad.jsonl").write_text('{"id": 0}\n[1, 2]\n')
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False, retries=0)
    with pytest.raises(ShardError, match=r"bad.jsonl: row 1 \(byte 10\) is not a JSON object"):
        list(ds)


def test_a_corrupt_compressed_file_is_an_error_naming_it(tmp_path):
    write_jsonl(tmp_path, [("z.jsonl.gz", 30)])
    path = tmp_path / "z.jsonl.gz"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(ShardError, match="z.jsonl.gz: gzip stream ends before its end"):
        wdstream.StreamingDataset(str(tmp_path))


def test_a_stale_or_foreign_index_is_refused(tmp_path, folder):
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"format": "wdstream-units", "version": 1, "files": []}))
    with pytest.raises(ManifestError, match="does not list a.jsonl"):
        wdstream.StreamingDataset(str(folder), index=str(index))
    index.write_text(json.dumps({"format": "wdstream", "shards": []}))
    with pytest.raises(ManifestError, match="not a wdstream unit index"):
        wdstream.StreamingDataset(str(folder), index=str(index))


def test_an_index_cannot_claim_units_outside_the_file(tmp_path, folder, cli_env):
    index = tmp_path / "index.json"
    subprocess.run(["wdstream", "index", str(folder), "--output", str(index), "-q"],
                   env=cli_env, check=True, timeout=60)
    document = json.loads(index.read_text())
    document["files"][0]["units"][-1][1] += 10**9
    index.write_text(json.dumps(document))
    with pytest.raises(ManifestError, match=r"a.jsonl: unit \[.*\] does not fit"):
        wdstream.StreamingDataset(str(folder), index=str(index))


def plain_rows(dataset) -> list[dict]:
    return [{k: v for k, v in sample.items() if not k.startswith("__")} for sample in dataset]


@pytest.mark.slow  # imports datasets
def test_one_json_file_of_rows_streams_as_the_datasets_json_loader_reads_it(tmp_path, s3,
                                                                          s3_bucket):
    """axolotl's ``data_files: train.json`` (JSON Lines named .json): its rows, those
    ``datasets.load_dataset("json", ...)`` reads, from a local file, a config's data_files
    and S3; a wdstream manifest named .json, as written or pretty-printed, is still one."""
    import datasets

    rows = [{"instruction": f"say {i}", "input": "" if i % 2 else f"x{i}",
             "output": f"said {i}"} for i in range(30)]
    data = tmp_path / "train.json"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = datasets.load_dataset("json", data_files=str(data), split="train",
                                     cache_dir=str(tmp_path / "hf")).to_list()
    assert expected == rows
    assert plain_rows(wdstream.StreamingDataset(str(data), shuffle=False)) == rows
    configured = wdstream.from_config({"datasets": [{"path": str(tmp_path),
                                                     "data_files": "train.json"}]})
    assert sorted(plain_rows(configured), key=lambda r: r["output"]) == \
        sorted(rows, key=lambda r: r["output"])
    s3.client().upload_file(str(data), s3_bucket, "sft/train.json")
    remote = wdstream.StreamingDataset(f"s3://{s3_bucket}/sft/train.json", shuffle=False)
    assert plain_rows(remote) == rows

    write_dataset(tmp_path / "shards", [3, 4])
    manifest = (tmp_path / "shards" / "index.json").read_text()
    (tmp_path / "shards" / "pretty.json").write_text(json.dumps(json.loads(manifest), indent=2))
    (tmp_path / "shards" / "one-line.json").write_text(json.dumps(json.loads(manifest)))
    for name in ("index.json", "pretty.json", "one-line.json"):
        ds = wdstream.StreamingDataset(str(tmp_path / "shards" / name))
        assert ds.manifest is not None and len(ds) == 7, name


def test_one_json_document_over_several_lines_is_refused_naming_the_file(tmp_path):
    """Neither JSON Lines nor a JSON array of rows (those stream: test_json_arrays)."""
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"data": [{"a": 1}]}, indent=2))
    found = "one JSON document over several lines"
    with pytest.raises(InputError, match=f"rows.json: {found}, neither JSON Lines"):
        wdstream.StreamingDataset(str(path))
    # named in a list (as JSON Lines): refused by name as its first row is read
    with pytest.raises(InputError, match=f"rows.json: {found}"):
        list(wdstream.StreamingDataset([str(path)], retries=0))


@pytest.mark.parametrize("depth", [5000, 300_000])  # the first row inside the head, or past it
def test_a_deep_or_long_first_row_stays_within_the_row_limits(tmp_path, depth):
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * depth + "1" + "}" * depth + '\n{"a": 2}\n')
    ds = wdstream.StreamingDataset(str(path), shuffle=False, retries=0)
    with pytest.raises(ShardError, match=r"deep.json: row 0 \(byte 0\) is not JSON: nested "
                                         "deeper than 100 levels"):
        list(ds)
    long = tmp_path / "long.json"  # a first row of 1 MB of text: rows, read whole
    long.write_text(json.dumps({"text": "x" * 10**6}) + "\n" + json.dumps({"text": "y"}) + "\n")
    assert [len(r["text"]) for r in plain_rows(wdstream.StreamingDataset(
        str(long), shuffle=False))] == [10**6, 1]
    small = wdstream.StreamingDataset(str(long), limits=wdstream.Limits(sample_bytes=1000))
    with pytest.raises(ShardError, match="long.json: a line at byte 0 is longer than 1000"):
        list(small)
