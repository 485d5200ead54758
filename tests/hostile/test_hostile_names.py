"""Names read from storage are data: a manifest entry, a listed object's name or a config's
path never runs a command, never reaches outside its dataset without the user's opt-in, and is
refused with a ManifestError / InputError naming the manifest and the entry -- through the
Python API and every ``wdstream`` command. Each test also checks that no command ran (a marker
file), no file outside the dataset was read (a secret), and a local HTTP server was never
contacted."""

from __future__ import annotations

import json
import os

import pytest

import wdstream as wds
from tests.support.hostile import SECRET, wdstream
from tests.support.shard_data import shard_bytes, write_dataset
from wdstream.errors import InputError, ManifestError
from wdstream.inspection import benchmark, describe, read_samples, verify
from wdstream.shards.manifest import load_manifest

pytestmark = pytest.mark.timeout(120)


# entry id -> the URL shard 1 of the manifest is given (built from the scene)
HOSTILE_ENTRIES = {
    "pipe": lambda s: f"pipe:touch {s.marker}; cat {s.outside}",
    "absolute-path": lambda s: str(s.outside),
    "file-url": lambda s: f"file://{s.outside}",
    "dotdot": lambda s: "../outside/shard.tar",
    "dotdot-nested": lambda s: "sub/../../outside/shard.tar",
    "http": lambda s: f"{s.http}/shard.tar",
    "other-bucket": lambda s: "s3://another-bucket/shard.tar",
    "fsspec-chain": lambda s: f"simplecache::file://{s.outside}",
    "home": lambda s: "~/shard.tar",
    "dev-zero": lambda s: "/dev/zero",
    "percent-encoded-dotdot": lambda s: "%2e%2E/outside/shard.tar",
}


def python_entry_points(source):
    """Every Python way in, each a callable that should refuse ``source``."""
    return {
        "StreamingDataset": lambda: wds.StreamingDataset(source),
        "StreamingDataset(index.json)": lambda: wds.StreamingDataset(
            os.path.join(source, "index.json")),
        "load_manifest": lambda: load_manifest(source),
        "Mix(from_config)": lambda: wds.from_config({"datasets": [{"path": source}]}),
        "describe": lambda: describe(source),
        "verify": lambda: verify(source),
        "read_samples": lambda: list(read_samples(source)),
        "benchmark": lambda: benchmark(source, workers=0),
    }


@pytest.mark.parametrize("entry", list(HOSTILE_ENTRIES))
@pytest.mark.slow
def test_a_manifest_names_shards_under_its_prefix_only(scene, entry):
    url = HOSTILE_ENTRIES[entry](scene)
    scene.set_entry(url)
    outputs = []
    for name, call in python_entry_points(str(scene.dataset)).items():
        with pytest.raises(ManifestError) as caught:
            call()
        message = str(caught.value)
        assert "index.json" in message and "shards[1].url" in message, (name, message)
        outputs.append(message)
    for command in (["ls"], ["verify"], ["cat"], ["bench", "--workers", "0"],
                    ["index", "--merge", scene.manifest, "--output", scene.root / "merged"]):
        args = [*command, scene.dataset] if command[0] != "index" else command
        result = wdstream(*args, code=2, cwd=scene.root)
        assert result.stderr.startswith("error: ") and "shards[1].url" in result.stderr
        assert "OK" not in result.stdout
        outputs += [result.stdout, result.stderr]
    assert not (scene.root / "merged").exists()
    scene.assert_untouched(*outputs)


@pytest.mark.parametrize("entry", ["absolute-path", "file-url", "dotdot", "http"])
@pytest.mark.slow
def test_the_opt_in_reads_shards_outside_the_prefix(scene, entry):
    scene.set_entry(HOSTILE_ENTRIES[entry](scene))
    dataset = wds.StreamingDataset(str(scene.dataset), shuffle=False,
                                   allow_external_shards=True)
    texts = [sample.get("txt") for sample in dataset]
    assert len(texts) == 6 and sum(SECRET in (t or "") for t in texts) == 3
    result = wdstream("cat", scene.dataset, "--allow-external-shards", cwd=scene.root)
    assert result.stdout.count(SECRET) == 3
    assert wdstream("verify", scene.dataset, "--allow-external-shards").stdout.startswith("OK")
    assert not scene.marker.exists()
    assert bool(scene.requests) == (entry == "http")


@pytest.mark.slow
def test_pipe_from_a_manifest_stays_refused_with_the_opt_in(scene):
    scene.set_entry(HOSTILE_ENTRIES["pipe"](scene))
    with pytest.raises(ManifestError, match=r"shards\[1\]\.url .*a pipe: command"):
        wds.StreamingDataset(str(scene.dataset), allow_external_shards=True)
    with pytest.raises(ManifestError, match="a pipe: command"):
        wds.from_config({"datasets": [{"path": str(scene.dataset)}]},
                        allow_external_shards=True)
    outputs = []
    for command in ("ls", "verify", "cat", "bench"):
        result = wdstream(command, scene.dataset, "--allow-external-shards", code=2,
                          cwd=scene.root)
        assert "a pipe: command" in result.stderr
        outputs += [result.stdout, result.stderr]
    scene.assert_untouched(*outputs)


def test_a_manifest_object_loaded_from_storage_is_checked_again(scene):
    scene.set_entry(str(scene.outside))
    manifest = load_manifest(str(scene.dataset), allow_external_shards=True)
    with pytest.raises(ManifestError, match="an absolute path"):
        wds.StreamingDataset(manifest)
    assert len(list(wds.StreamingDataset(manifest, allow_external_shards=True))) == 6


def test_pipe_written_by_the_user_keeps_working(scene):
    shard = scene.dataset / "shard-000000.tar"
    samples = list(wds.StreamingDataset(f"pipe:cat {shard}", shuffle=False))
    assert len(samples) == 3
    assert wdstream("cat", f"pipe:cat {shard}", "-n", "1").stdout.count("__key__") == 1


# --------------------------------------------------------------------------- listings


def listed_folder(tmp_path):
    """A folder without a manifest holding a shard named like a command."""
    folder = tmp_path / "listed"
    write_dataset(folder, [2], manifest=False)
    (folder / "pipe:touch PWNED.tar").write_bytes(shard_bytes(7, 3))
    return folder


@pytest.mark.slow
def test_a_listed_file_named_like_a_command_is_read_as_a_file(tmp_path, monkeypatch):
    folder = listed_folder(tmp_path)
    for cwd, source in ((tmp_path, str(folder)), (folder, "."), (folder, "./")):
        monkeypatch.chdir(cwd)
        dataset = wds.StreamingDataset(source, shuffle=False)
        keys = [sample["__key__"] for sample in dataset]
        assert sorted(keys) == ["s000_00000", "s000_00001", "s007_00000", "s007_00001",
                                "s007_00002"]
        assert describe(source).samples == 5 and verify(source).ok
        assert len(list(read_samples(source))) == 5
        commands = [["ls"], ["verify"], ["cat"]]
        if source == ".":  # bench imports torch: once is enough
            commands.append(["bench", "--workers", "0"])
        for command in commands:
            result = wdstream(*command, source, cwd=cwd)
            assert "PWNED" not in result.stderr
        assert wdstream("cat", source, cwd=cwd).stdout.count("pipe:touch PWNED.tar") == 3
        assert not (cwd / "PWNED.tar").exists() and not (folder / "PWNED.tar").exists()
    # a manifest could not name it, so indexing refuses before reading anything
    result = wdstream("index", folder, code=2, cwd=folder)
    assert "cannot be listed in a manifest" in result.stderr
    assert not (folder / "index.json").exists() and not (folder / "PWNED.tar").exists()


def test_a_listed_name_with_braces_is_one_object(tmp_path):
    folder = tmp_path / "listed"
    write_dataset(folder, [2], manifest=False)
    (folder / "{shard-000000,shard-000000}.tar").write_bytes(shard_bytes(7, 3))
    assert len(list(wds.StreamingDataset(str(folder)))) == 5
    assert benchmark(str(folder), workers=0).samples == 5  # not expanded as a pattern
    assert wdstream("cat", folder).stdout.count('"__key__"') == 5


def test_a_listed_fsspec_name_that_would_chain_urls_is_refused():
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"/hostile-{os.getpid()}/shard.tar", shard_bytes(0, 2))
    fs.pipe_file(f"/hostile-{os.getpid()}/x::secret.tar", shard_bytes(1, 2))
    with pytest.raises(InputError, match=r"'x::secret.tar' cannot be read by name through"):
        wds.StreamingDataset(f"memory://hostile-{os.getpid()}/")
    fs.rm(f"/hostile-{os.getpid()}", recursive=True)


@pytest.mark.slow
def test_an_s3_object_named_like_a_command_is_read_as_an_object(s3, s3_bucket, tmp_path,
                                                                 monkeypatch, cli_env):
    client = s3.client()
    client.put_object(Bucket=s3_bucket, Key="p/pipe:touch PWNED.tar", Body=shard_bytes(7, 3))
    client.put_object(Bucket=s3_bucket, Key="p/shard-000000.tar", Body=shard_bytes(0, 2))
    monkeypatch.chdir(tmp_path)
    source = f"s3://{s3_bucket}/p/"
    assert len(list(wds.StreamingDataset(source))) == 5
    assert verify(source).ok
    for opener in ("sdk", "fsspec"):
        result = wdstream("cat", source, "--opener", opener, env=cli_env, cwd=tmp_path)
        assert result.stdout.count("pipe:touch PWNED.tar") == 3
    assert not (tmp_path / "PWNED.tar").exists()


# --------------------------------------------------------------------------- S3 manifests


def upload_dataset(client, bucket, folder, prefix):
    for name in sorted(os.listdir(folder)):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}",
                          Body=(folder / name).read_bytes())


@pytest.mark.slow
def test_another_bucket_needs_the_opt_in(s3, s3_bucket, scene, cli_env):
    other = s3.create_bucket(f"{s3_bucket}-other")
    s3.client().put_object(Bucket=other, Key="shard.tar", Body=scene.outside.read_bytes())
    scene.set_entry(f"s3://{other}/shard.tar")
    upload_dataset(s3.client(), s3_bucket, scene.dataset, "ds")
    source = f"s3://{s3_bucket}/ds/"
    with pytest.raises(ManifestError, match=rf"{source}index.json: shards\[1\]\.url "
                                            rf"'s3://{other}/shard.tar': a URL"):
        wds.StreamingDataset(source)
    result = wdstream("cat", source, code=2, env=cli_env)
    assert "allow-external-shards" in result.stderr and SECRET not in result.stdout
    dataset = wds.StreamingDataset(source, allow_external_shards=True)
    assert len(list(dataset)) == 6
    result = wdstream("cat", source, "--allow-external-shards", env=cli_env)
    assert result.stdout.count(SECRET) == 3
    assert wdstream("verify", source, "--allow-external-shards", env=cli_env).stdout.startswith(
        "OK")


# --------------------------------------------------------------------------- configs


def test_a_pipe_in_a_config_file_is_refused(scene):
    shard = scene.dataset / "shard-000000.tar"
    command = f"pipe:touch {scene.marker}; cat {shard}"
    config = scene.root / "mix.yaml"
    config.write_text(json.dumps({"datasets": [{"path": command}]}))
    with pytest.raises(InputError, match=r"datasets\[0\].*'path'.*a pipe: command"):
        wds.from_config(config)
    with pytest.raises(InputError, match="a pipe: command"):
        wds.from_config(config, allow_external_paths=True)
    tokenizer = {"datasets": [{"path": str(scene.dataset)}], "seq_len": 8, "eos": 0,
                 "tokenizer": f"pipe:touch {scene.marker}; cat tokenizer.json"}
    config.write_text(json.dumps(tokenizer))
    with pytest.raises(InputError, match="'tokenizer'.*a pipe: command"):
        wds.from_config(config)
    scene.assert_untouched()


@pytest.mark.slow
def test_config_paths_from_a_url_stay_under_its_prefix(s3, s3_bucket, scene):
    client = s3.client()
    upload_dataset(client, s3_bucket, scene.dataset, "cfg/data")
    other = s3.create_bucket(f"{s3_bucket}-elsewhere")
    upload_dataset(client, other, scene.dataset, "data")
    url = f"s3://{s3_bucket}/cfg/mix.yaml"

    def config(**entry):
        client.put_object(Bucket=s3_bucket, Key="cfg/mix.yaml",
                          Body=json.dumps({"datasets": [entry]}).encode())

    config(path="data/")
    mix = wds.from_config(url)
    assert mix.datasets[0].source == f"s3://{s3_bucket}/cfg/data/" and len(mix) == 6
    for path in (f"s3://{other}/data/", "../data/", "/etc/", f"file://{scene.outside}",
                 f"{scene.http}/data/"):
        config(path=path)
        with pytest.raises(InputError, match=r"datasets\[0\].*'path'.*allow_external_paths"):
            wds.from_config(url)
    config(path=f"s3://{other}/data/")
    assert len(wds.from_config(url, allow_external_paths=True)) == 6
    config(path=f"pipe:touch {scene.marker}; echo")
    with pytest.raises(InputError, match="a pipe: command"):
        wds.from_config(url, allow_external_paths=True)
    scene.assert_untouched()
