"""``from_config`` on whole trainer configs in the axolotl schema: the example configs of
examples/configs/, trainer keys ignored with one warning, every error reported at once."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import wdstream
from tests.support.llm_data import documents, train_tokenizer, write_text_dataset
from wdstream.errors import InputError
from wdstream.stages.config import keys as config_module

pytest.importorskip("tokenizers")
pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The example configs beside the data and tokenizer they name."""
    root = tmp_path_factory.mktemp("trainer-config")
    train_tokenizer(root / "tokenizer.json", documents(7, 200))
    write_text_dataset(root / "data" / "web", [30, 30], seed=1)
    write_text_dataset(root / "data" / "corpus" / "code" / "train", [25, 5], seed=2)
    for path in EXAMPLES.glob("*.yaml"):
        shutil.copy(path, root / path.name)
    return root


pytestmark = pytest.mark.usefixtures("single_rank")


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "wdstream.config" and r.levelno == logging.WARNING]


def test_a_whole_pretraining_config(root, caplog):
    with caplog.at_level(logging.WARNING, logger="wdstream.config"):
        ds = wdstream.from_config(root / "axolotl-pretrain.yaml")
    assert isinstance(ds, wdstream.PackedSequences) and ds.seq_len == 32
    mix = ds.dataset
    assert list(mix.weights) == pytest.approx([0.75, 0.25]) and mix.options.seed == 7
    assert mix.names[0] == "data/web/"
    assert mix.names[1].endswith("data/corpus/code/train/")  # name + split: the subset folder
    assert [len(d) for d in mix.datasets] == [60, 30]
    [warning] = warnings_of(caplog)  # one warning, listing the trainer's keys
    for key in ("base_model", "model_type", "micro_batch_size", "gradient_accumulation_steps",
                "learning_rate", "optimizer", "output_dir"):
        assert key in warning
    batch = next(iter(wdstream.DataLoader(ds, batch_size=2)))
    assert batch["input_ids"].shape == (2, 32)


def test_a_completion_config_with_data_files(root, caplog):
    with caplog.at_level(logging.WARNING, logger="wdstream.config"):
        ds = wdstream.from_config(str(root / "axolotl-completion.yaml"))
    web, code = ds.dataset.datasets
    assert len(web) == 60 and len(code.shards.urls) == 1  # the one shard named
    assert code.shards.urls[0].endswith("code/train/shard-000000.tar")
    assert ds.eos == ds.tokenizer.token_id("<eos>")
    [warning] = warnings_of(caplog)
    assert "num_epochs" in warning and "lr_scheduler" in warning


def base(root, **changes):
    config = {"seed": 1, "datasets": [{"path": str(root / "data" / "web"), "type": "completion",
                                       "field": "text"}]}
    config.update(changes)
    return config


def test_every_error_at_once_each_naming_its_entry_and_key(root):
    config = {
        "sequence_len": 0, "streaming": False, "learning_rate": 1e-4,
        "datasets": [
            {"path": str(root / "data" / "web"), "type": "alpaca"},
            {"path": str(root / "data" / "web"), "weight": "heavy", "field": "a",
             "text_column": "b"},
            {"type": "chat_template", "split": 3},
        ],
        "pretraining_dataset": [{"path": str(root / "nowhere"), "streaming": False}],
    }
    with pytest.raises(InputError) as raised:
        wdstream.from_config(config)
    message = str(raised.value)
    assert message.startswith("config: 9 errors:"), message
    for expected in [
        "config: 'sequence_len' must be at least 1, not 0",
        "config: 'streaming: false' is not supported",
        "config: datasets[0] (", "'type' 'alpaca' is a prompt format",
        "config: datasets[1] (", "'weight' must be a number, not str",
        "'field' and 'text_column' are the same setting with different values ('a', 'b')",
        "config: datasets[2]: 'split' must be a string, not int 3",
        "config: datasets[2]: 'path' is missing",
        "config: datasets[2]: 'type' 'chat_template' is a prompt format",
        "config: pretraining_dataset[0] (", "'streaming: false' is not supported: wdstream",
    ]:
        assert expected in message, (expected, message)
    assert "learning_rate" not in message  # ignored, not an error


def test_missing_sources_are_reported_together(root):
    config = base(root)
    config["datasets"] = [{"path": str(root / "missing-a")}, {"path": str(root / "missing-b")}]
    with pytest.raises(InputError, match=r"(?s)2 errors:.*missing-a.*missing-b"):
        wdstream.from_config(config)


@pytest.mark.parametrize("changes, expected", [
    ({"sequence_len": 16}, r"needs 'eos' \(or special_tokens.eos_token\)"),
    ({"seq_len": 16, "sequence_len": 32, "eos": 1},
     r"'seq_len' and 'sequence_len' are the same setting with different values"),
    ({"shuffle": True, "shuffle_merged_datasets": False}, r"'shuffle' and "
     r"'shuffle_merged_datasets' are the same setting"),
    ({"datasets": {"path": 3}}, r"datasets\[0\]: 'path' must be a string"),
    ({"pretraining_dataset": [{"path": "x", "type": {"system_prompt": ""}}]},
     r"pretraining_dataset\[0\] \(x\): 'type' 'a custom format' is a prompt format"),
    ({"datasets": [{"path": "x", "data_files": []}]}, r"'data_files' must be a file name or a "
     r"non-empty list"),
])
def test_single_errors(root, changes, expected):
    with pytest.raises(InputError, match=expected):
        wdstream.from_config(base(root, **changes))


def test_aliases_and_top_level_switches(root):
    ds = wdstream.from_config(base(root, shuffle_merged_datasets=False, streaming=True))
    assert ds.datasets[0].options.shuffle is False
    one = wdstream.from_config(base(root, pretraining_dataset={
        "path": str(root / "data" / "corpus"), "name": "code", "split": "train",
        "label": "code"}))
    assert one.names[1] == "code" and len(one.datasets[1]) == 30
    packed = wdstream.from_config(base(root, sequence_len=8, tokenizer=str(root / "tokenizer.json"),
                                       special_tokens={"eos_token": "<eos>"}, text_column="text"))
    assert packed.seq_len == 8 and packed.text_field == "text"


def test_empty_keys_are_not_set(root, tmp_path):
    """A trainer's YAML leaves keys empty (``special_tokens:``, a null): they are not set."""
    path = tmp_path / "config.yml"
    path.write_text(f"seed: 1\nspecial_tokens:\nwandb_project:\ndatasets:\n"
                    f"  - path: {root / 'data' / 'web'}\n    type: completion\n"
                    "    field: text\n    weight:\n")
    ds = wdstream.from_config(path)
    assert list(ds.weights) == [1.0]
    with pytest.raises(InputError, match="'datasets' \\(or 'pretraining_dataset'\\) is "
                                         "missing or empty"):
        wdstream.from_config({"seed": 1, "datasets": None})


def test_the_key_tables_agree_with_the_stages():
    from wdstream.stages.mix import STOP_RULES
    from wdstream.stages.sequences import LONG_DOCUMENTS

    assert config_module.TOP_KEYS["stop"].choices == tuple(STOP_RULES)
    assert config_module.TOP_KEYS["long_documents"].choices == tuple(LONG_DOCUMENTS)
    for table in (config_module.TOP_KEYS, config_module.DATASET_KEYS):
        assert all(row.alias_of in table for row in table.values() if row.alias_of)
