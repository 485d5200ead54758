"""What the plugin takes from a trainer's YAML has the file's trust: no data key runs a command
(a ``pipe:`` name, plainly or by brace expansion), and every number it passes on is checked as
``from_config`` checks it; each refused by ``register`` before anything is loaded, as a
mistake of the config ends a run: one message, ``InputError: ...``, no traceback."""

from __future__ import annotations

import pytest

from tests.support.hostile import commands
from tests.support.shard_data import write_dataset
from wdstream.integrations.axolotl import WdstreamPlugin

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trust") / "ds"
    write_dataset(folder, [3, 3])
    return folder


def entry_with(dataset, key: str, value) -> dict:
    entry = {"path": str(dataset), "type": "pretrain"}
    if key == "path":
        entry["path"] = value + ".tar"  # a name the plugin takes for a shard
    elif key == "data_files[1]":
        entry["data_files"] = ["shard-000000.tar", value]
    else:
        entry[key] = value
    return entry


@pytest.mark.parametrize("entries", ["datasets", "pretraining_dataset"])
@pytest.mark.parametrize("key", ["path", "name", "split", "data_files", "data_files[1]"])
def test_a_command_in_a_data_key_of_the_yaml_never_runs(dataset, tmp_path, key, entries):
    marker = tmp_path / "PWNED"
    for form, command in commands(marker).items():
        cfg = {entries: [entry_with(dataset, key, command)], "sequence_len": 32}
        plugin = WdstreamPlugin()
        if key == "path" and form == "plain":  # not a wdstream path: left to axolotl
            plugin.register(cfg)
            assert plugin.written is None
            continue
        with pytest.raises(SystemExit,
                           match=rf"(?s)InputError: .*{key.split('[')[0]}'.*a pipe: command"):
            plugin.register(cfg)
        assert not marker.exists(), (form, "a command from the YAML ran")


@pytest.mark.parametrize(("changes", "expected"), [
    ({"sequence_len": 1 << 40}, "'sequence_len' must be at most 16,777,216"),
    ({"sequence_len": "long"}, "'sequence_len' must be an integer"),
    ({"micro_batch_size": 1 << 40}, "'micro_batch_size' must be at most"),
    ({"micro_batch_size": 0}, "'micro_batch_size' must be at least 1"),
    ({"dataloader_num_workers": 1_000_000}, "'dataloader_num_workers' must be at most 1,024"),
    ({"gradient_accumulation_steps": -2}, "'gradient_accumulation_steps' must be at least 1"),
    ({"max_steps": 1 << 62, "micro_batch_size": 1 << 20},
     "'sequences_per_epoch' must be at most"),
    ({"wdstream": {"sequences_per_epoch": -1}}, "'sequences_per_epoch' must be at least 1"),
    ({"wdstream": {"tokens_per_epoch": 1.5}}, "'tokens_per_epoch' must be an integer"),
])
def test_every_number_the_plugin_passes_on_is_checked(dataset, changes, expected):
    cfg = {"pretraining_dataset": [{"path": str(dataset), "type": "pretrain"}],
           "sequence_len": 32, "micro_batch_size": 2, "max_steps": 4, **changes}
    with pytest.raises(SystemExit, match=f"(?s)InputError: .*{expected}"):
        WdstreamPlugin().register(cfg)


def test_a_sound_yaml_still_registers(dataset):
    plugin = WdstreamPlugin()
    plugin.register({"pretraining_dataset": [{"path": str(dataset), "type": "pretrain",
                                              "data_files": "shard-{000000..000001}.tar"}],
                     "sequence_len": 32, "micro_batch_size": 2, "max_steps": 4})
    assert plugin.mix is not None
