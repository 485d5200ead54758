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
from tests.support.hostile import SECRET, commands, in_child
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


@pytest.mark.slow
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


# ------------------------------------------------------------- local raw files stay inside

FORMATS = ["jsonl", "parquet", "arrow"]


def write_raw(path: Path, fmt: str, text: str = "row", count: int = 20) -> Path:
    """A raw file of ``count`` rows whose text holds ``text``, stored uncompressed so that the
    text can be found, and replaced, in its bytes."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": i, "text": f"{text} {i:04d}"} for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, compression="none",
                       use_dictionary=False)
    else:
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table)
    return path


def read_all(source, **options) -> list:
    return [{k: v for k, v in sample.items() if not k.startswith("__")}
            for sample in wds.StreamingDataset(source, shuffle=False, **options)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_fifo_named_as_a_raw_file_never_blocks(tmp_path, fmt):
    folder = tmp_path / "ds"
    write_raw(folder / f"a.{fmt}", fmt)
    os.mkfifo(folder / f"x.{fmt}")
    status, message = in_child(lambda: read_all(str(folder)), time_limit=15)
    assert status == "InputError" and f"x.{fmt}: a FIFO" in message, (status, message)
    status, message = in_child(lambda: read_all(str(folder / f"x.{fmt}")), time_limit=15)
    assert status == "InputError" and "a FIFO" in message, (status, message)
    status, rows = in_child(lambda: len(read_all(str(folder / f"*.{fmt}"))), time_limit=15)
    assert (status, rows) == ("ok", 20)  # a pattern matches regular files only


@pytest.fixture
def outside(tmp_path):
    """A folder outside the dataset holding raw files of SECRET rows."""
    for fmt in FORMATS:
        write_raw(tmp_path / "outside" / f"secret.{fmt}", fmt, text=SECRET)
    return tmp_path / "outside"


@pytest.mark.parametrize("fmt", FORMATS)
def test_patterns_and_listings_go_through_no_link_out_of_the_folder(tmp_path, outside, fmt):
    folder = tmp_path / "ds"
    write_raw(folder / "sub" / f"a.{fmt}", fmt)
    (folder / "linked").symlink_to(outside, target_is_directory=True)  # a link to a folder
    (folder / "sub" / f"leak.{fmt}").symlink_to(outside / f"secret.{fmt}")  # to a file
    for source in (str(folder), str(folder / f"**/*.{fmt}"), str(folder / f"*/*.{fmt}"),
                   str(folder / f"*/leak.{fmt}"), [str(folder / f"sub/*.{fmt}")]):
        status, rows = in_child(lambda source=source: read_all(source), time_limit=20)
        assert status in ("ok", "NoFilesError"), (source, status, rows)
        assert SECRET not in repr(rows), source
    status, rows = in_child(lambda: len(read_all(str(folder / f"**/*.{fmt}"))))
    assert (status, rows) == ("ok", 20)


def test_a_config_files_names_and_patterns_stay_inside(tmp_path, outside):
    folder = tmp_path / "ds"
    write_raw(folder / "a.jsonl", "jsonl")
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    (folder / "leak.jsonl").symlink_to(outside / "secret.jsonl")
    path = tmp_path / "mix.yaml"

    def read(**keys):
        path.write_text(yaml.safe_dump({"datasets": [{"path": str(folder), **keys}]}))
        return in_child(lambda: [dict(s) for s in wds.from_config(path).datasets[0]])

    for keys in ({"data_files": "**/*.jsonl"}, {"data_files": "*.jsonl"}, {}):
        status, rows = read(**keys)
        assert status == "ok" and len(rows) == 20 and SECRET not in repr(rows), keys
    for key, value in (("data_files", "linked/*.jsonl"), ("data_files", "leak.jsonl"),
                       ("data_files", ["a.jsonl", "linked/secret.jsonl"]), ("name", "linked"),
                       ("split", "linked")):
        status, message = read(**{key: value})
        assert status == "InputError" and "leads out of the dataset's path" in message, \
            (key, value, status, message)


def swap(path: Path, how: str, outside: Path, fmt: str) -> None:
    """Put another file at ``path`` with its size and modification time, as planned."""
    info = path.stat()
    content = path.read_bytes().replace(b"row ", SECRET[:4].encode())
    assert len(content) == info.st_size and content != path.read_bytes()
    if how == "link":
        target = outside / f"swapped.{fmt}"
        target.write_bytes(content)
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        path.with_name("tmp-link").symlink_to(target)
        os.replace(path.with_name("tmp-link"), path)
    elif how == "file":
        path.with_name("tmp-file").write_bytes(content)
        os.utime(path.with_name("tmp-file"), ns=(info.st_atime_ns, info.st_mtime_ns))
        os.replace(path.with_name("tmp-file"), path)
    else:  # the same file rewritten in place
        path.write_bytes(content)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns) == (info.st_size, info.st_mtime_ns)


@pytest.mark.parametrize("how", ["link", "file", "in-place"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_local_file_swapped_after_the_plan_is_refused(tmp_path, outside, fmt, how):
    folder = tmp_path / "ds"
    path = write_raw(folder / f"a.{fmt}", fmt)
    dataset = wds.StreamingDataset(str(folder), shuffle=False)
    swap(path, how, outside, fmt)

    def read():
        return [dict(sample) for sample in dataset]

    status, message = in_child(read)
    assert status == "ShardMismatchError", (status, message)
    assert SECRET[:4] not in repr(message)
