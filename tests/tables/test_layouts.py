"""Sources whose layout would make a dataset guess are refused when it is built, local and on
the moto S3 server: a Hugging Face DatasetDict folder (its splits named, and the split's
folder to pass), a folder of several splits' files, and files of several formats together
(one file of each named, and a pattern of one format to pass). One split, the Hub's layout
of one split, and a pattern of one format still stream."""

from __future__ import annotations

import json
import re

import pytest

import wdstream
from tests.support.raw_data import rows_of, upload_tree, write_jsonl, write_parquet
from wdstream.errors import InputError

pytestmark = pytest.mark.usefixtures("single_rank")


def dataset_dict(root):
    """A folder as datasets.DatasetDict.save_to_disk writes it: dataset_dict.json at its root,
    each split a folder of .arrow files with dataset_info.json and state.json."""
    import datasets

    folder = root / "saved"
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows_of("train", 30)),
        "test": datasets.Dataset.from_list(rows_of("test", 10))})
    splits.save_to_disk(str(folder))
    assert json.loads((folder / "dataset_dict.json").read_text())["splits"] == ["train", "test"]
    return folder


def split_folders(root):
    """Parquet files of a train and a test split, each in its folder."""
    folder = root / "splits"
    write_parquet(folder, [("train/part-0.parquet", 20, 10), ("train/part-1.parquet", 5, 5),
                           ("test/part-0.parquet", 7, 7)])
    return folder


def mixed(root):
    """Parquet and JSON Lines files in one folder."""
    folder = root / "mixed"
    write_parquet(folder, [("a.parquet", 12, 6)])
    write_jsonl(folder, [("b.jsonl", 9)])
    return folder


def refusal(source) -> str:
    with pytest.raises(InputError) as raised:
        wdstream.StreamingDataset(source)
    return str(raised.value)


def test_a_dataset_dict_folder_is_refused_naming_its_splits_and_the_folder_to_pass(tmp_path):
    folder = dataset_dict(tmp_path)
    message = refusal(str(folder))
    assert "DatasetDict" in message and "'test', 'train'" in message
    assert f"{folder}/train/" in message
    train = wdstream.StreamingDataset(str(folder / "train"), shuffle=False)
    assert len(train) == 30 and next(iter(train))["__key__"].startswith("data-00000-of-")


def test_split_folders_or_hub_split_names_are_refused_one_split_streams(tmp_path):
    folder = split_folders(tmp_path)
    message = refusal(str(folder))
    assert "several splits" in message
    assert "'test' (test/part-0.parquet)" in message and "'train' (train/part-0.parquet)" in message
    assert f"{folder}/train/" in message
    assert len(wdstream.StreamingDataset(str(folder / "train"))) == 25

    hub = tmp_path / "hub"
    write_parquet(hub, [("default/train-00000-of-00001.parquet", 8, 8),
                        ("default/validation-00000-of-00001.parquet", 3, 3)])
    message = refusal(str(hub))
    assert "'train' (default/train-00000-of-00001.parquet)" in message
    assert "'validation'" in message and f"{hub}/default/train-*" in message
    assert len(wdstream.StreamingDataset(str(hub / "default" / "train-*"))) == 8
    # one split of the Hub's layout, with several subsets, is one dataset
    write_parquet(tmp_path / "one", [("en/train-00000-of-00001.parquet", 4, 4),
                                     ("fr/train-00000-of-00001.parquet", 6, 6)])
    assert len(wdstream.StreamingDataset(str(tmp_path / "one"))) == 10


def test_files_of_two_formats_are_refused_naming_one_of_each(tmp_path):
    folder = mixed(tmp_path)
    message = refusal(str(folder))
    assert f"Parquet ({folder}/a.parquet)" in message
    assert f"JSON Lines ({folder}/b.jsonl)" in message
    assert f"{folder}/*.parquet" in message
    listed = refusal([str(folder / "a.parquet"), str(folder / "b.jsonl")])
    assert "several formats" in listed and "*.parquet" in listed
    assert "several formats" in refusal(str(folder / "*"))
    assert len(wdstream.StreamingDataset(str(folder / "*.parquet"))) == 12
    assert len(wdstream.StreamingDataset(str(folder / "*.jsonl"))) == 9


@pytest.mark.slow
def test_the_refusals_on_s3(s3, s3_bucket, tmp_path):
    client = s3.client()
    saved = upload_tree(client, s3_bucket, dataset_dict(tmp_path), "saved")
    message = refusal(saved)
    assert "DatasetDict" in message and "'test', 'train'" in message
    assert f"{saved}train/" in message
    assert len(wdstream.StreamingDataset(saved + "train/")) == 30

    splits = upload_tree(client, s3_bucket, split_folders(tmp_path), "splits")
    message = refusal(splits)
    assert "several splits" in message and f"{splits}train/" in message

    both = upload_tree(client, s3_bucket, mixed(tmp_path), "mixed")
    message = refusal(both)
    assert re.search(rf"Parquet \({re.escape(both)}a.parquet\).*JSON Lines "
                     rf"\({re.escape(both)}b.jsonl\)", message)
    assert f"{both}*.parquet" in message
    assert len(wdstream.StreamingDataset(both + "*.jsonl")) == 9
