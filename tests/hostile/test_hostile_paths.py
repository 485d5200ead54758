"""Paths and files someone else wrote: a config file's data keys never run a command, whatever
the opt-ins; a checkpoint's loader state file is read bounded. Each attack runs in a forked child under a time and a memory limit
(``in_child``) and must end in a wdstream error, with no command run (the marker a command
would create is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

import wdstream as wds
from tests.support.hostile import commands, in_child
from tests.support.shard_data import write_dataset
from wdstream.integrations.checkpoint import load_loader_state, save_loader_state, state_path
from wdstream.stages.config.build import MAX_EXPANDED


def config_with(scene, key: str, value) -> dict:
    """A config whose ``key`` (of the first entry, or ``tokenizer``) holds ``value``."""
    entry = {"path": str(scene.dataset)}
    if key == "tokenizer":
        return {"datasets": [entry], "seq_len": 8, "eos": 0, "tokenizer": value}
    if key == "data_files[1]":
        entry["data_files"] = ["shard-000000.tar", value]
    else:
        entry[key] = value
    return {"datasets": [entry]}


KEYS = ["path", "name", "split", "data_files", "data_files[1]", "tokenizer"]


@pytest.mark.parametrize("opt_in", [False, True], ids=["", "allow_external_paths"])
@pytest.mark.parametrize("form", ["plain", "braces", "spelled"])
@pytest.mark.parametrize("key", KEYS)
def test_a_command_in_any_data_key_of_a_config_file_never_runs(scene, key, form, opt_in):
    path = scene.root / "mix.yaml"
    path.write_text(yaml.safe_dump(config_with(scene, key, commands(scene.marker)[form])))
    status, message = in_child(lambda: wds.from_config(path, allow_external_paths=opt_in))
    assert status == "InputError", (status, message)
    assert "a pipe: command" in message and "datasets[0]" in message or key == "tokenizer"
    assert repr(key.split("[")[0]) in message, message
    scene.assert_untouched()


def test_a_legitimate_brace_pattern_in_a_config_file_still_reads(scene):
    path = scene.root / "mix.yaml"
    path.write_text(yaml.safe_dump(config_with(scene, "data_files",
                                               ["shard-{000000..000001}.tar"])))
    status, count = in_child(lambda: sum(1 for _ in wds.from_config(path).datasets[0]))
    assert (status, count) == ("ok", 6)


@pytest.mark.parametrize("key", ["path", "name", "data_files"])
def test_a_brace_bomb_in_a_config_file_is_refused_before_it_is_expanded(scene, key):
    """braceexpand holds every number of a range: ``{1..10**13}`` would need terabytes."""
    path = scene.root / "mix.yaml"
    path.write_text(yaml.safe_dump(config_with(scene, key, "x{1..10000000000000}.tar")))
    status, message = in_child(lambda: wds.from_config(path, allow_external_paths=True))
    assert status == "InputError", (status, message)
    assert f"more than {MAX_EXPANDED:,} names" in message and repr(key) in message


def test_a_command_in_a_config_read_from_a_url_never_runs(s3, s3_bucket, scene):
    client = s3.client()
    url = f"s3://{s3_bucket}/cfg/mix.yaml"
    for key in ("name", "split", "data_files"):
        for form, command in commands(scene.marker).items():
            body = {"datasets": [{"path": "data/", key: command}]}
            client.put_object(Bucket=s3_bucket, Key="cfg/mix.yaml",
                              Body=yaml.safe_dump(body).encode())
            status, message = in_child(
                lambda: wds.from_config(url, allow_external_paths=True))
            assert status == "InputError" and "a pipe: command" in message, (key, form, message)
    scene.assert_untouched()


# ------------------------------------------------------------- checkpoint loader states


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A loader two batches in, its state saved into a checkpoint folder as rank 0 of 1."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    write_dataset(tmp_path / "data", [6, 5])
    loader = wds.DataLoader(wds.StreamingDataset(str(tmp_path / "data"), seed=1), batch_size=2)
    batches = iter(loader)
    next(batches)
    (tmp_path / "ckpt").mkdir()
    save_loader_state(loader, tmp_path / "ckpt")
    return tmp_path / "ckpt", loader


def plant(path, kind: str) -> None:
    """Put ``kind`` where the state file was."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        with open(path, "wb") as file:  # sparse: 3 GB on the disk's books, nothing written
            file.truncate(3 << 30)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(STATES[kind])


STATES = {
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep-in-object": b'{"world": 1, "positions": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "list": b"[1, 2, 3]",
    "string": b'"state"',
    "null": b"null",
    "number": b"1" * 5000,
    "not-json": b"{world: 1",
    "not-utf8": b'{"format": "\xff\xfe"}',
    "world-a-string": b'{"world": "1", "positions": {}}',
    "positions-a-dict": b'{"format": "wdstream.loader", "version": 1, "world": 1, '
                        b'"positions": {"a": 1}}',
}


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "folder", *STATES])
def test_a_hostile_loader_state_file_is_a_state_error_naming_it(checkpoint, kind):
    folder, loader = checkpoint
    path = Path(state_path(folder, 0))
    plant(path, kind)
    status, message = in_child(lambda: load_loader_state(loader, folder), time_limit=10,
                               memory=256 << 20)
    assert status == "StateError", (status, message)
    assert str(path) in message, message


def test_a_sound_loader_state_file_still_resumes(checkpoint):
    folder, loader = checkpoint
    saved = loader.state_dict()
    status, _ = in_child(lambda: load_loader_state(loader, folder), time_limit=10,
                         memory=256 << 20)
    assert status == "ok"
    load_loader_state(loader, folder)
    assert loader.state_dict() == saved
