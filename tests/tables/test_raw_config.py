"""from_config over raw files: a trainer config whose datasets are a Parquet folder and a
JSON Lines folder (type completion / pretrain, text_column / field) streams them without a
pack step, packed into sequences, and resumes exactly; the Hugging Face Hub's layout
(<path>/<name>/<split>-*.parquet) by name and split, or by a data_files pattern; files
naming no split as the train split; a pre-tokenized column packs without a tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

import wdstream
from tests.support.llm_data import train_tokenizer
from tests.support.raw_data import roundtrip, take, write_jsonl, write_parquet

pytestmark = pytest.mark.usefixtures("single_rank")

HUB = [("default/train-00000-of-00002.parquet", 30, 10),
       ("default/train-00001-of-00002.parquet", 25, 10),
       ("default/test-00000-of-00001.parquet", 12, 10)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw-config")
    write_parquet(root / "web")
    write_jsonl(root / "lines")
    write_parquet(root / "hub", HUB)
    texts = [f"{name} row {i}" for name in ("part-0.parquet", "a.jsonl") for i in range(30)]
    train_tokenizer(root / "tokenizer.json", texts)
    return root


def config(root, **top):
    return {"base_model": "some/model", "seed": 3, "streaming": True, **top}


def ids(batches):
    return [b["input_ids"].numpy().tolist() for b in batches]


@pytest.mark.slow
def test_a_trainer_config_over_parquet_and_jsonl_packs_and_resumes(root):
    settings = config(root, sequence_len=16, tokenizer=str(root / "tokenizer.json"),
                      special_tokens={"eos_token": "<eos>"},
                      datasets=[{"path": str(root / "web"), "type": "completion",
                                 "text_column": "text", "weight": 0.6},
                                {"path": str(root / "lines"), "type": "pretrain",
                                 "field": "text", "weight": 0.4}])

    def loader():
        return wdstream.DataLoader(wdstream.from_config(settings), batch_size=4, num_workers=2)

    whole = ids(take(loader(), 12))
    assert all(len(row) == 16 for batch in whole for row in batch)
    first = loader()
    head = ids(take(first, 5))
    resumed = loader()
    resumed.load_state_dict(roundtrip(first.state_dict()))
    assert head + ids(take(resumed, 7)) == whole


def rows_of(dataset):
    return sorted(s["__key__"] for s in dataset)


def test_hub_layout_by_name_and_split_or_data_files(root):
    by_split = wdstream.from_config(config(root, datasets=[
        {"path": str(root / "hub"), "name": "default", "split": "train"}]))
    expected = sorted(f"train-0000{f}-of-00002.parquet:{i}"
                      for f, n in ((0, 30), (1, 25)) for i in range(n))
    assert rows_of(by_split) == expected
    by_files = wdstream.from_config(config(root, datasets=[
        {"path": str(root / "hub"), "data_files": ["default/test-*.parquet"]}]))
    assert len(list(by_files)) == 12


def test_split_train_of_files_that_name_no_split_is_the_path_itself(tmp_path):
    """As ``datasets`` reads a folder or a file whose names say no split: all of it is
    ``train``; a folder of another split is not."""
    write_parquet(tmp_path / "plain", [("a.parquet", 20, 10), ("b.parquet", 7, 10)])
    write_parquet(tmp_path / "tested", [("test/a.parquet", 5, 10)])

    def dataset(path, split):
        return wdstream.from_config({"datasets": [{"path": str(path), "split": split}]})

    assert len(rows_of(dataset(tmp_path / "plain", "train"))) == 27
    assert rows_of(dataset(tmp_path / "plain" / "a.parquet", "train[:50%]")) == sorted(
        f"a.parquet:{i}" for i in range(10))
    for path, split in ((tmp_path / "tested", "train"), (tmp_path / "plain", "test")):
        with pytest.raises(wdstream.errors.WdstreamError, match=f"{split}/: not found"):
            dataset(path, split)


def test_splits_named_with_a_suffix_in_the_hubs_data_folder(tmp_path):
    """A Hub dataset copied as it is (``push_to_hub``'s ``data/<split>-*.parquet``), its
    splits named as UltraChat's are (``train_sft``, ``test_sft``, ``train_gen``): each split
    reads its own files; the whole folder is refused, naming them."""
    write_parquet(tmp_path / "chat", [("data/train_sft-00000-of-00002.parquet", 9, 10),
                                      ("data/train_sft-00001-of-00002.parquet", 4, 10),
                                      ("data/test_sft-00000-of-00001.parquet", 5, 10),
                                      ("data/train_gen-00000-of-00001.parquet", 7, 10)])
    write_parquet(tmp_path / "plain", [("data/train-00000-of-00001.parquet", 6, 10),
                                       ("data/test-00000-of-00001.parquet", 2, 10)])

    def rows(path, split):
        return rows_of(wdstream.from_config({"datasets": [{"path": str(path),
                                                            "split": split}]}))

    assert rows(tmp_path / "chat", "train_sft") == sorted(
        [f"train_sft-00000-of-00002.parquet:{i}" for i in range(9)]
        + [f"train_sft-00001-of-00002.parquet:{i}" for i in range(4)])
    assert len(rows(tmp_path / "chat", "test_sft")) == 5
    assert len(rows(tmp_path / "chat", "train_gen[:3]")) == 3
    assert len(rows(tmp_path / "plain", "train")) == 6
    assert len(rows(tmp_path / "plain", "test")) == 2
    with pytest.raises(wdstream.errors.InputError,
                       match=r"several splits: 'test_sft' .*'train_gen' .*'train_sft' .*e\.g\. "
                             r".*/chat/data/train_gen-\*"):
        wdstream.StreamingDataset(str(tmp_path / "chat"))
    # numbered parts of one split are that split, not several
    write_parquet(tmp_path / "parts", [("train_00.parquet", 3, 10), ("train_01.parquet", 4, 10)])
    assert len(rows_of(wdstream.StreamingDataset(str(tmp_path / "parts")))) == 7
    assert len(rows(tmp_path / "parts", "train")) == 7


def test_a_pre_tokenized_column_packs_without_a_tokenizer(root):
    packed = wdstream.from_config(config(root, sequence_len=8, eos=0,
                                         datasets=[{"path": str(root / "web"),
                                                    "text_column": "tokens"}]))
    sequence = next(iter(packed))["input_ids"]
    assert len(sequence) == 8 and 0 in np.asarray(sequence).tolist()
