"""A slice of a split in an axolotl ``datasets:`` entry (``split: train[:20%]``): the bounds
``datasets`` itself computes, and the rows of raw Parquet files it holds (the first rows in
the files' order), whatever order a shuffled stream reads them in."""

from __future__ import annotations

import pytest

import wdstream
from tests.support.raw_data import PARQUET_FILES, write_parquet
from wdstream.errors import InputError
from wdstream.integrations.axolotl_slices import bound, row_slice, split_slice

SPECS = ["train[:20%]", "train[:1%]", "train[:100]", "train[10:20]", "train[-7%:]",
         "train[5%:95%]", "train[:-10]"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rows", [7, 33, 226, 1001])
def test_bounds_are_those_datasets_reads(spec, rows):
    import datasets

    [expected] = datasets.ReadInstruction.from_spec(spec).to_absolute({"train": rows})
    name, (start, stop) = split_slice(spec, "datasets[0]")
    assert name == "train"
    assert (bound(start, rows, 0), bound(stop, rows, rows)) == (expected.from_, expected.to)


@pytest.mark.parametrize("spec", ["train+test", "train[:10%]+test", "train[a:]", "train[:", "train[2.5%:]"])
def test_a_split_a_stream_cannot_read_is_refused_naming_the_entry(spec):
    with pytest.raises(InputError, match=r"datasets\[2\]: split"):
        split_slice(spec, "datasets[2]")


def test_a_whole_split_has_no_slice():
    assert split_slice("validation", "datasets[0]") == ("validation", None)


def test_the_slice_holds_the_first_rows_in_the_files_order(tmp_path):
    folder = write_parquet(tmp_path / "data")
    dataset = wdstream.StreamingDataset(str(folder), seed=3, shuffle_window=16)
    cut = row_slice(dataset, ("", "50%"), "datasets[0]")
    total = sum(count for _name, count, _group in PARQUET_FILES)
    assert (cut.start, cut.stop) == (0, round(total / 2))
    held = {sample["__key__"] for sample in dataset if cut.holds(sample["__key__"])}
    in_order = [f"{name}:{i}" for name, count, _group in sorted(PARQUET_FILES)
                for i in range(count)]
    assert held == set(in_order[:round(total / 2)])
