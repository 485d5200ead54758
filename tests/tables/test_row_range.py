"""A range of a raw source's rows (``StreamingDataset(rows=":20%")``, a config's ``split:
train[:20%]``): the bounds ``datasets`` itself computes, exactly the rows of the range in
the files' order whatever order a shuffled stream reads them in, only the units holding them
read, and an exact resume inside the range."""

from __future__ import annotations

import pytest

import wdstream
from tests.support.raw_data import (
    JSONL_FILES,
    PARQUET_FILES,
    all_keys,
    keys_of,
    loader_of,
    roundtrip,
    take,
    write_jsonl,
    write_parquet,
)
from wdstream.errors import InputError, OptionError
from wdstream.stages.config.build import split_slice
from wdstream.tables.row_range import RowRange

SPECS = ["train[:20%]", "train[:1%]", "train[:100]", "train[10:20]", "train[-7%:]",
         "train[5%:95%]", "train[:-10]"]
IN_ORDER = [f"{name}:{i}" for name, count, _group in sorted(PARQUET_FILES) for i in range(count)]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rows", [7, 33, 226, 1001])
def test_bounds_are_those_datasets_reads(spec, rows):
    import datasets

    [expected] = datasets.ReadInstruction.from_spec(spec).to_absolute({"train": rows})
    name, text = split_slice(spec, "datasets[0]")
    assert name == "train"
    assert RowRange.parse(text).rows(rows) == (expected.from_, expected.to)


@pytest.mark.parametrize("spec", ["train+test", "train[:10%]+test", "train[a:]", "train[:",
                                  "train[2.5%:]"])
def test_a_split_a_stream_cannot_read_is_refused_naming_the_entry(spec):
    with pytest.raises(InputError, match=r"datasets\[2\]: split"):
        split_slice(spec, "datasets[2]")


def test_a_config_whose_one_split_is_refused_says_only_that(tmp_path):
    with pytest.raises(InputError) as raised:
        wdstream.from_config({"datasets": [{"path": str(tmp_path), "split": "train+test"}]})
    assert "split 'train+test': a stream reads one split" in str(raised.value)
    assert "weights" not in str(raised.value)


def test_a_whole_split_has_no_slice():
    assert split_slice("validation", "datasets[0]") == ("validation", None)


@pytest.mark.parametrize("rows", ["5", "a:b", "1:2:3", ":5%%", "1.5:", 5, ["1", "2"]])
def test_a_malformed_range_fails_when_the_dataset_is_built(tmp_path, rows):
    with pytest.raises(OptionError, match="rows must be 'START:STOP'"):
        wdstream.StreamingDataset(str(tmp_path / "never-read"), rows=rows)


@pytest.mark.parametrize("rows, first, stop", [(":50%", 0, 113), ("60:75", 60, 75),
                                               ("-7%:", 210, 226), ("69:71", 69, 71)])
def test_the_range_holds_its_rows_in_the_files_order(tmp_path, rows, first, stop):
    folder = write_parquet(tmp_path / "data")
    dataset = wdstream.StreamingDataset(str(folder), seed=3, shuffle_window=16, rows=rows)
    keys = [sample["__key__"] for sample in dataset]
    assert sorted(keys, key=IN_ORDER.index) == IN_ORDER[first:stop]
    assert len(dataset) == stop - first
    # only the units (row groups) holding rows of the range are planned, so read
    bounds, before = [], 0
    for _name, count, group in sorted(PARQUET_FILES):
        bounds += [(before + a, before + min(a + group, count)) for a in range(0, count, group)]
        before += count
    assert len(dataset.shards) == sum(a < stop and b > first for a, b in bounds)


@pytest.mark.parametrize("rows, first, stop", [("80:140", 80, 140), ("-30:", 160, 190)])
def test_json_lines_ranges_and_compressed_files_hold_the_rows_too(tmp_path, rows, first, stop):
    folder = write_jsonl(tmp_path / "lines")
    in_order = [f"{name}:{i}" for name, count in sorted(JSONL_FILES) for i in range(count)]
    dataset = wdstream.StreamingDataset(str(folder), seed=5, shuffle_window=8, rows=rows)
    assert sorted(s["__key__"] for s in dataset) == sorted(in_order[first:stop])


def test_a_unit_outside_the_range_is_never_read(tmp_path):
    import pyarrow.parquet as pq

    folder = write_parquet(tmp_path / "data")
    path = folder / "part-0.parquet"  # the first file: row groups of 40 rows, 70 rows
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    with pytest.raises(wdstream.errors.WdstreamError):
        list(wdstream.StreamingDataset(str(folder), shuffle=False))
    kept = list(wdstream.StreamingDataset(str(folder), shuffle=False, rows="40:"))
    assert [s["__key__"] for s in kept] == IN_ORDER[40:]


def test_resume_inside_the_range_is_exact(tmp_path):
    folder = str(write_parquet(tmp_path / "data"))
    whole = keys_of(loader_of(folder, rows="30:200"))
    loader = loader_of(folder, rows="30:200")
    first = keys_of(take(loader, 7))
    resumed = loader_of(folder, rows="30:200")
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(resumed) == whole
    assert sorted(k for batch in whole for k in batch) == sorted(IN_ORDER[30:200])


def test_another_range_is_another_dataset_to_a_state(tmp_path):
    folder = str(write_parquet(tmp_path / "data"))
    loader = loader_of(folder, rows=":50%")
    take(loader, 2)
    loader_of(folder, rows="0:113").load_state_dict(roundtrip(loader.state_dict()))  # the same
    for other in (":60%", "1:114"):
        with pytest.raises(wdstream.errors.StateError):
            loader_of(folder, rows=other).load_state_dict(roundtrip(loader.state_dict()))


def test_an_empty_range_is_refused_naming_the_rows(tmp_path):
    folder = write_parquet(tmp_path / "data")
    with pytest.raises(InputError, match=r"rows 300: hold none of its 226 rows"):
        wdstream.StreamingDataset(str(folder), rows="300:")


def test_shards_are_refused_naming_the_option(tmp_path):
    from tests.support.shard_data import write_dataset

    write_dataset(tmp_path / "shards", [3, 4])
    with pytest.raises(OptionError, match="rows apply to raw files only.*pack a slice"):
        wdstream.StreamingDataset(str(tmp_path / "shards"), rows=":50%")


def test_a_config_split_slice_streams_the_slice(tmp_path):
    write_parquet(tmp_path / "data" / "train")
    config = {"datasets": [{"path": str(tmp_path / "data"), "split": "train[:50%]"},
                           {"path": str(tmp_path / "data"), "split": "train[50%:]"}]}
    mix = wdstream.from_config(config)
    assert mix.names == [str(tmp_path / "data" / "train") + "[:50%]",
                         str(tmp_path / "data" / "train") + "[50%:]"]
    halves = [{s["__key__"] for s in dataset} for dataset in mix.datasets]
    keys = sorted(all_keys(), key=IN_ORDER.index)
    assert halves == [set(keys[:113]), set(keys[113:])]
