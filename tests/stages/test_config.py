"""wdstream.from_config: the declarative dataset list, and errors that name the bad key."""

from __future__ import annotations

import json

import pytest

import wdstream
from tests.support.llm_data import documents, train_tokenizer, write_text_dataset
from wdstream.errors import InputError

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("config")
    train_tokenizer(root / "tokenizer.json", documents(7, 200))
    write_text_dataset(root / "web", [30, 30], seed=1)
    write_text_dataset(root / "code", [25], seed=2)
    return root


pytestmark = pytest.mark.usefixtures("single_rank")


def config(root, **top):
    return {
        "seed": 17,
        "datasets": [
            {"path": str(root / "web"), "label": "web", "weight": 0.7, "streaming": True,
             "type": "pretrain", "text_field": "text"},
            {"path": str(root / "code"), "label": "code", "weight": 0.3, "text_field": "txt"},
        ],
        **top,
    }


def test_a_dataset_list_becomes_a_mixture(root):
    ds = wdstream.from_config(config(root, stop="cycle", shuffle_window=4))
    assert isinstance(ds, wdstream.Mix)
    assert ds.names == ["web", "code"] and ds.stop == "cycle" and ds.options.seed == 17
    assert list(ds.weights) == pytest.approx([0.7, 0.3])
    assert [d.options.window for d in ds.datasets] == [4, 4]
    assert [d.options.start for d in ds.datasets] == [32, 32]  # shuffle_start's default
    batch = next(iter(wdstream.DataLoader(ds, batch_size=8)))
    assert set(batch["__source__"]) <= {"web", "code"}


def test_shuffle_start_for_every_source_or_one(root):
    c = config(root, shuffle_start=8)
    c["datasets"][1]["shuffle_start"] = None  # windows of one size for this source
    ds = wdstream.from_config(c)
    assert [d.options.start for d in ds.datasets] == [8, None]
    assert [d.options.schedule.size(0) for d in ds.datasets] == [8, 1000]


def test_yaml_file_with_packing_and_relative_paths(root):
    (root / "train.yaml").write_text("""
seed: 3
stop: fixed
samples_per_epoch: 400
seq_len: 32
tokenizer: tokenizer.json        # relative to this file
eos: "<eos>"
sequences_per_epoch: 24
datasets:
  - path: web                    # relative to this file
    weight: 2
    streaming: true
    type: pretrain
    text_field: text
  - path: code
    weight: 1
    text_field: json.text
""")
    ds = wdstream.from_config(root / "train.yaml")
    assert isinstance(ds, wdstream.PackedSequences) and isinstance(ds.dataset, wdstream.Mix)
    assert ds.text_field == {"web": "text", "code": "json.text"}  # named by their path
    loader = wdstream.DataLoader(ds, batch_size=4, num_workers=2)
    batches = list(loader)
    assert len(batches) == len(loader) == 6
    assert batches[0]["input_ids"].shape == (4, 32)
    (root / "train.json").write_text(json.dumps({
        "seed": 3, "stop": "fixed", "samples_per_epoch": 400, "seq_len": 32,
        "tokenizer": "tokenizer.json", "eos": "<eos>", "sequences_per_epoch": 24,
        "datasets": [{"path": "web", "weight": 2, "text_field": "text"},
                     {"path": "code", "weight": 1, "text_field": "json.text"}]}))
    again = wdstream.from_config(str(root / "train.json"))
    assert again.fingerprint() == ds.fingerprint()


def drop(entry, key):
    return {k: v for k, v in entry.items() if k != key}


@pytest.mark.parametrize("change, expected", [
    (lambda c: {**c, "seed": "1"}, r"config: 'seed' must be an integer, not str"),
    (lambda c: {**c, "stop": "longest"}, r"'stop' must be one of"),
    (lambda c: {**c, "stop": "fixed"}, r"'samples_per_epoch' goes with 'stop: fixed'"),
    (lambda c: {**c, "samples_per_epoch": 0}, r"'samples_per_epoch' must be at least 1"),
    (lambda c: {**c, "eos": 1}, r"'eos' is for packing, which needs 'seq_len' \('sequence_len'\)"),
    (lambda c: {**c, "seq_len": 16}, r"packing \('seq_len'\) needs 'eos'"),
    (lambda c: {**c, "seq_len": 16.5}, r"'seq_len' must be an integer"),
    (lambda c: {**c, "datasets": []}, r"'datasets' \(or 'pretraining_dataset'\) is missing or"),
    (lambda c: drop(c, "datasets"), r"'datasets' \(or 'pretraining_dataset'\) is missing or"),
    (lambda c: {**c, "datasets": "web"}, r"'datasets' must be a list of datasets"),
    (lambda c: {**c, "datasets": ["web"]}, r"datasets\[0\]: a dataset is a mapping"),
    (lambda c: {**c, "datasets": [{"weight": 1}]}, r"datasets\[0\]: 'path' is missing"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "weight": "0.7"}]},
     r"datasets\[0\] \(.*web\): 'weight' must be a number, not str"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "weight": True}]},
     r"datasets\[0\] \(.*web\): 'weight' must be a number, not bool"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "weight": -1}]},
     r"datasets\[0\] \(.*web\): 'weight' must be a finite number >= 0"),
    (lambda c: {**c, "datasets": [{**d, "weight": 0} for d in c["datasets"]]},
     r"weights must add up to a positive number"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "streaming": False}]},
     r"datasets\[0\] \(.*web\): 'streaming: false' is not supported"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "type": "alpaca"}]},
     r"datasets\[0\] \(.*web\): 'type' 'alpaca' is a prompt format: formatting prompts and "
     r"chats is the trainer's part.*'type: completion' and 'field'"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "opener": "ftp"}]},
     r"datasets\[0\] \(.*web\): 'opener' must be one of"),
    (lambda c: {**c, "datasets": [{**d, "label": "x"} for d in c["datasets"]]},
     r"dataset names \(default: the path\) must be distinct; set 'label'"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "path": "/nonexistent/data/"}]},
     r"datasets\[0\] \(/nonexistent/data/\)"),
    (lambda c: [c], r"a config is a mapping"),
    (lambda c: {**c, "shuffle_start": 0}, r"'shuffle_start' must be at least 1, not 0"),
    (lambda c: {**c, "datasets": [{**c["datasets"][0], "shuffle_start": "32"}]},
     r"datasets\[0\] \(.*web\): 'shuffle_start' must be an integer or null, not str"),
])
def test_errors_name_the_bad_key(root, change, expected):
    with pytest.raises(InputError, match=expected):
        wdstream.from_config(change(config(root)))


def test_unreadable_or_malformed_files(root):
    with pytest.raises(InputError, match="cannot read the config"):
        wdstream.from_config(root / "missing.yaml")
    (root / "bad.yaml").write_text("datasets: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML"):
        wdstream.from_config(root / "bad.yaml")
    (root / "bad.json").write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        wdstream.from_config(root / "bad.json")
