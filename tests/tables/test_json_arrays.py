"""JSON files that are arrays of objects (``[{...}, {...}]``, what ``datasets``'
``to_json(lines=False)``, pandas' ``orient="records"`` and ``alpaca_data.json`` are) streamed
as rows, one a top-level element: plain files cut into ranges of whole elements by one scan,
compressed ones whole; keys ``FILE:ROW``; exact and elastic resume; named, matched, from a
config, from S3 and through the unit index; a broken array is an error naming the file and
the element or byte."""

from __future__ import annotations

import gzip
import io
import json
import subprocess

import pytest

import wdstream
from tests.support.raw_data import (
    check_resume,
    counted,
    keys_of,
    roundtrip,
    rows_of,
    stored,
    take,
    upload_tree,
    write_jsonl,
)
from tests.support.shard_data import write_dataset
from wdstream.errors import ShardError, ShardMismatchError
from wdstream.tables import jsonl
from wdstream.tables.files import RawFile, find_files
from wdstream.tables.json_arrays import ArrayScanner, elements
from wdstream.tables.reads import Access
from wdstream.tables.unit_index import index_document
from wdstream.tables.units import cut_files

pytestmark = pytest.mark.usefixtures("single_rank")
ARRAYS = [("a.json", 90), ("b.json.gz", 40), ("c.json.zst", 35), ("more/d.json", 25)]


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    monkeypatch.setattr(jsonl, "RANGE_BYTES", 2000)  # a.json: several units


def write_arrays(folder, files=ARRAYS):
    """Each file a JSON array of ``rows_of`` its name: pretty-printed, on one line, with a
    BOM, compressed; a folder's ``index.json`` beside them is no data."""
    for number, (name, count) in enumerate(files):
        text = json.dumps(rows_of(name, count), indent=2 if number % 2 == 0 else None)
        data = (b"\xef\xbb\xbf" if number == 3 else b"") + text.encode() + b"\n"
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(stored(name, data))
    return folder


def array_keys(files=ARRAYS) -> set[str]:
    return {f"{name}:{i}" for name, count in files for i in range(count)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_arrays(tmp_path_factory.mktemp("arrays"))


def sources(folder) -> str:
    return str(folder / "**" / "*.json*")


def plain_rows(dataset) -> list[dict]:
    return [{k: v for k, v in sample.items() if not k.startswith("__")} for sample in dataset]


def test_every_element_once_plain_files_cut_between_elements(folder):
    ds = wdstream.StreamingDataset(sources(folder), seed=5)
    assert len(ds) == sum(count for _, count in ARRAYS)
    files = [ds.shards.files[i].name for i in ds.shards.file]
    assert files.count("a.json") > 2 and files.count("b.json.gz") == 1
    batches = list(wdstream.DataLoader(ds, batch_size=4, num_workers=2))
    seen = counted(keys_of(batches))
    assert set(seen) == array_keys() and max(seen.values()) == 1
    for name, count in ARRAYS:
        single = wdstream.StreamingDataset(str(folder / name), shuffle=False)
        rows = rows_of(name, count)
        assert plain_rows(single) == rows, name
        assert [s["__key__"] for s in single] == [f"{name.rsplit('/', 1)[-1]}:{i}"
                                                  for i in range(count)], name


def test_exact_resume_and_elastic_resume_inside_a_file(folder):
    check_resume(sources(folder), array_keys())
    # one file, without shuffling: the resumed loader goes on at the next row of the file
    path = str(folder / "a.json")
    loader = wdstream.DataLoader(wdstream.StreamingDataset(path, shuffle=False), batch_size=7)
    first = keys_of(take(loader, 4))
    resumed = wdstream.DataLoader(wdstream.StreamingDataset(path, shuffle=False), batch_size=7)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    rest = keys_of(resumed)
    assert rest[0][0] == "a.json:28" and sum(first + rest, []) == [f"a.json:{i}"
                                                                 for i in range(90)]


def test_the_scan_finds_elements_across_reads_of_any_size():
    """Strings holding brackets, quotes, escaped backslashes and commas, nested objects and
    arrays (deeper than one regular expression matches), an empty object: the same elements
    whatever the reads cut."""
    rows = [{"a": "x]}[{,\"", "b": "\\", "c": [1, {"d": "\\\"]"}, []]}, {}, {"e": "é\n"},
            {"deep": [[[[[[{"f": "]"}]]]]]]}, {"g": 1}]
    for text in (json.dumps(rows), json.dumps(rows, indent=3), json.dumps(rows,
                                                                          ensure_ascii=False)):
        data = text.encode()
        for size in (1, 2, 3, 5, len(data)):
            scanner = ArrayScanner(RawFile("x.json", "x.json", len(data), ""), 0, 10**6, 100)
            found = list(elements(_Reads(data, size), scanner))
            assert [json.loads(e) for _, e in found] == rows, (text, size)
            assert [data[o:o + 1] for o, _ in found] == [b"{"] * len(rows)
    scanner = ArrayScanner(RawFile("x.json", "x.json", 2, ""), 0, 10, 100)
    assert list(elements(io.BytesIO(b" [ ]\n"), scanner)) == []


class _Reads(io.BytesIO):
    def __init__(self, data: bytes, size: int):
        super().__init__(data)
        self.size = size

    def read(self, n: int = -1) -> bytes:
        return super().read(self.size)


@pytest.mark.parametrize(("text", "words"), [
    ('[{"a": 1}, 2]', r"element 1 of the JSON array \(byte 11\) is not a JSON object"),
    ('[{"a": 1} {"a": 2}]', r"byte 10: '\{' where ',' or '\]' was expected"),
    ('[{"a": 1},]', r"byte 10: '\]' where an object was expected"),
    ('[{"a": 1}, {"a": [1}, {"a": 2}]', r"element 1 of the JSON array \(byte 11\) has a '\[' "
                                        r"closed by '\}' at byte 19"),
    ('[{"a": [1, {"a": 2}]', r"element 0 of the JSON array \(byte 1\) does not end: 1 "
                             r"of its brackets never closed \(the data ends at byte 20\)"),
    ('[{"a": "never closed}]', r"element 0 of the JSON array \(byte 1\) does not end: a str"),
    ('[{"a": 1}', r"the data ends at byte 9 after 1 elements, before the JSON array's clos"),
    ('[{"a": 1}] x', r"byte 11: 'x' where nothing after the array's '\]' was expected"),
    ('[{"a": 1}, {"a": ' + "[" * 200 + "]" * 200 + "}]",
     r"element 1 of the JSON array \(byte 11\) nests deeper than 100 levels"),
    ('[{"a": 1}, {"a": "' + "x" * 3000 + '"}]',
     r"element 1 of the JSON array \(byte 11\) is longer than 1024 bytes"),
    ('[{"a": 1}, {"a": 2,}]', r"row 1 \((decompressed )?byte 11\) is not JSON"),
], ids=["scalar", "no-comma", "trailing-comma", "unbalanced", "unclosed", "open-string",
        "no-close", "garbage", "deep", "long", "bad-element"])
@pytest.mark.parametrize("name", ["bad.json", "bad.json.gz"])
def test_a_broken_array_is_an_error_naming_the_file_and_element(tmp_path, text, words, name):
    data = text.encode()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(ShardError, match=f"{name}: .*{words}"):
        list(wdstream.StreamingDataset(str(tmp_path / name), shuffle=False, retries=0,
                                       limits=wdstream.Limits(sample_bytes="1KiB")))


def test_a_file_changed_after_the_scan_is_an_error(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"id": i} for i in range(200)]))
    ds = wdstream.StreamingDataset(str(path), shuffle=False, retries=0)
    assert len(ds.shards) > 1
    path.write_text(json.dumps([{"id": i + 1000} for i in range(200)]))
    with pytest.raises(ShardMismatchError, match="rows.json: changed since the plan"):
        list(ds)


def test_a_range_that_no_longer_holds_whole_elements_is_an_error(tmp_path):
    """An index whose units were cut for other bytes (its entry written for this size and
    tag): the range's read finds no element where one should start, or other counts."""
    path = tmp_path / "data" / "rows.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"id": i} for i in range(200)]))
    source = str(tmp_path / "data" / "*.json")
    files = find_files(source)
    document = index_document(files, cut_files(files, Access()))
    entry = document["files"][0]
    assert entry["array"] is True and len(entry["units"]) > 1
    start, end, rows = entry["units"][1]
    entry["units"][1] = [start + 3, end, rows]
    index = tmp_path / "index.json"
    index.write_text(json.dumps(document))
    ds = wdstream.StreamingDataset(source, shuffle=False, retries=0, index=str(index))
    with pytest.raises(ShardError, match=rf"rows.json: byte {start + 3}: .* where an object"):
        list(ds)


@pytest.mark.slow  # imports datasets, runs the CLI
def test_an_array_streams_as_the_datasets_json_loader_reads_it(tmp_path, s3, s3_bucket,
                                                               cli_env, monkeypatch):
    """alpaca's ``train.json`` (an array of records): its rows, those
    ``datasets.load_dataset("json", ...)`` reads, from a local file, a config's data_files,
    S3 and the unit index (which plans without scanning it)."""
    import datasets

    rows = [{"instruction": f"say [{i}]", "input": "" if i % 2 else f"x{i}",
             "output": f"said \"{i}\""} for i in range(300)]
    data = tmp_path / "sft" / "train.json"
    data.parent.mkdir()
    data.write_text(json.dumps(rows, indent=4))
    expected = datasets.load_dataset("json", data_files=str(data), split="train",
                                     cache_dir=str(tmp_path / "hf")).to_list()
    assert expected == rows
    assert plain_rows(wdstream.StreamingDataset(str(data), shuffle=False)) == rows
    configured = wdstream.from_config({"datasets": [{"path": str(data.parent),
                                                     "data_files": "train.json"}]})
    assert sorted(plain_rows(configured), key=lambda r: r["output"]) == \
        sorted(rows, key=lambda r: r["output"])
    s3.client().upload_file(str(data), s3_bucket, "sft/train.json")
    remote = f"s3://{s3_bucket}/sft/train.json"
    ds = wdstream.StreamingDataset(remote, shuffle=False)
    assert len(ds.shards) > 1 and plain_rows(ds) == rows

    index = tmp_path / "index.json"
    subprocess.run(["wdstream", "index", f"s3://{s3_bucket}/sft/*.json", "--output",
                    str(index), "-q"], env=cli_env, check=True, timeout=120)
    monkeypatch.undo()  # the index was cut at the default range size
    scanned = wdstream.StreamingDataset(f"s3://{s3_bucket}/sft/*.json", seed=2)

    def no_scan(*args):
        raise AssertionError("a file was scanned")

    monkeypatch.setattr(jsonl.JsonLinesFormat, "cut", no_scan)
    indexed = wdstream.StreamingDataset(f"s3://{s3_bucket}/sft/*.json", seed=2,
                                        index=str(index))
    assert indexed.fingerprint() == scanned.fingerprint()
    assert sorted(plain_rows(indexed), key=lambda r: r["output"]) == \
        sorted(rows, key=lambda r: r["output"])


def test_a_folder_of_json_files_lists_them_but_its_metadata(tmp_path, s3, s3_bucket):
    """A folder whose raw files are all .json streams them (arrays and JSON Lines), leaving
    out index.json, dataset_info.json and state.json; beside .jsonl or Parquet files, or in a
    shard folder, .json files are left out as before. From S3 too."""
    data = write_arrays(tmp_path / "data", [("a.json", 12), ("more/d.json.gz", 5)])
    (data / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows_of("l", 4)))
    for name in ("dataset_info.json", "state.json", "more/index.json"):
        (data / name).write_text(json.dumps({"features": {}}, indent=2))
    expected = {f"a.json:{i}" for i in range(12)} | {f"more/d.json.gz:{i}" for i in range(5)} \
        | {f"lines.json:{i}" for i in range(4)}
    ds = wdstream.StreamingDataset(str(data), shuffle=False)
    assert {s["__key__"] for s in ds} == expected
    remote = upload_tree(s3.client(), s3_bucket, data, "folder")
    assert {s["__key__"] for s in wdstream.StreamingDataset(remote, shuffle=False)} == expected

    write_jsonl(data, [("beside.jsonl", 3)])
    assert {s["__key__"] for s in wdstream.StreamingDataset(str(data))} == \
        {f"beside.jsonl:{i}" for i in range(3)}
    shards = tmp_path / "shards"
    write_dataset(shards, [3, 4])
    (shards / "notes.json").write_text(json.dumps([{"a": 1}]))
    ds = wdstream.StreamingDataset(str(shards))
    assert ds.manifest is not None and len(ds) == 7
    only_metadata = tmp_path / "meta"
    only_metadata.mkdir()
    (only_metadata / "dataset_info.json").write_text("{}")
    with pytest.raises(wdstream.errors.ManifestError, match="no Parquet, JSON Lines or Arrow"):
        wdstream.StreamingDataset(str(only_metadata))


@pytest.mark.slow  # runs the CLI
def test_ls_verify_and_cat_take_one_json_file_of_rows(tmp_path, cli_env):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(rows_of("t", 30), indent=1))
    for command, words in (("ls", "30"), ("verify", "1 file, 30 rows"),
                           ("cat", '"__key__": "train.json:29"')):
        result = subprocess.run(["wdstream", command, str(path)], env=cli_env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and words in result.stdout, (command, result.stdout,
                                                                   result.stderr)
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps(row) + "\n"
                                                 for row in rows_of("l", 5)))
    for name, shown in (("train.json", "json"), ("lines.jsonl", "jsonl")):
        listed = subprocess.run(["wdstream", "ls", str(tmp_path / name), "--json"], env=cli_env,
                                capture_output=True, text=True, timeout=120)
        assert json.loads(listed.stdout)["formats"] == [shown], listed.stderr
