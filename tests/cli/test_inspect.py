"""``wdstream ls``, ``verify``, ``cat`` and ``bench`` run as the installed command, on local
shards and on the moto S3 server, including damaged shards and bad input."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.support.shard_data import sample_key, write_dataset
from wdstream.shards.tar_writer import TarWriter

COUNTS = [5, 3, 4]


def wdstream(*args, env=None, code=0, stdin=None, timeout=120):
    """Run the installed command; check its exit code and that no traceback leaked."""
    exe = shutil.which("wdstream", path=os.path.dirname(sys.executable)) or "wdstream"
    result = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env,
                            input=stdin, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    return result


def as_json(result):
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspect") / "ds"
    write_dataset(folder, COUNTS)
    return str(folder)


@pytest.fixture
def copy(dataset, tmp_path):
    """A private copy of the dataset, to damage."""
    target = tmp_path / "ds"
    shutil.copytree(dataset, target)
    return target


def flip_byte(path, offset=600):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path, size=3000):
    path.write_bytes(path.read_bytes()[:size])


# --------------------------------------------------------------------------- help


@pytest.mark.parametrize("command", ["ls", "verify", "cat", "bench"])
def test_help_has_an_example_and_the_exit_codes(command):
    text = wdstream(command, "--help").stdout
    assert "Examples:" in text and f"wdstream {command} " in text
    assert "Exit codes:" in text and "1  a problem found in the data" in text


# --------------------------------------------------------------------------- ls


def test_ls_lists_shards_and_totals(dataset):
    out = wdstream("ls", dataset).stdout
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()
            if line.strip().startswith("shard-")}
    assert rows == {f"shard-{i:06d}.tar": str(n) for i, n in enumerate(COUNTS)}
    assert "index.json" in out and "json, txt" in out
    assert "12" in out  # total samples


@pytest.mark.slow
def test_ls_json(dataset):
    doc = as_json(wdstream("ls", dataset, "--json"))
    assert doc["samples"] == sum(COUNTS) and doc["how"] == "manifest"
    assert [s["samples"] for s in doc["shards"]] == COUNTS
    assert doc["bytes"] == sum(s["bytes"] for s in doc["shards"])
    assert doc["manifest"].endswith("index.json") and doc["extensions"] == ["json", "txt"]
    # a manifest URL and a brace pattern name the same dataset
    assert as_json(wdstream("ls", os.path.join(dataset, "index.json"), "--json"))["samples"] == 12
    pattern = as_json(wdstream("ls", os.path.join(dataset, "shard-{000000..000002}.tar"),
                               "--json"))
    assert pattern["manifest"] is None and pattern["scanned"] and pattern["samples"] == 12


@pytest.mark.slow
def test_ls_shows_how_it_was_packed(tmp_path):
    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(20)))
    wdstream("pack", source, "--output", tmp_path / "out", "--max-count", "8", "--quiet")
    out = wdstream("ls", tmp_path / "out").stdout
    assert "packed_by.tool" in out and "packed_by.options.max_count" in out
    doc = as_json(wdstream("ls", tmp_path / "out", "--json"))
    assert doc["extra"]["packed_by"]["options"]["max_count"] == 8
    assert [s["samples"] for s in doc["shards"]] == [8, 8, 4]


def test_ls_without_manifest_scans_and_says_so(copy):
    (copy / "index.json").unlink()
    out = wdstream("ls", copy).stdout
    assert "none: the 3 shards found were read to count samples" in out
    doc = as_json(wdstream("ls", copy, "--json"))
    assert doc["manifest"] is None and doc["scanned"] and doc["samples"] == 12
    assert doc["extensions"] == ["json", "txt"]
    quick = as_json(wdstream("ls", copy, "--no-scan", "--json"))
    assert quick["samples"] is None and quick["bytes"] == doc["bytes"]


def test_ls_without_manifest_reports_an_unreadable_shard(copy):
    (copy / "index.json").unlink()
    truncate(copy / "shard-000001.tar")
    result = wdstream("ls", copy, code=1)
    assert "shard-000001.tar: truncated" in result.stderr
    assert "unreadable" in result.stdout


# --------------------------------------------------------------------------- verify


def test_verify_intact_dataset(dataset):
    result = wdstream("verify", dataset)
    assert result.stdout.startswith("OK: 3 shards")
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    doc = as_json(wdstream("verify", dataset, "--deep", "--workers", "2", "--json"))
    assert doc["ok"] and doc["deep"] and doc["shards_checked"] == 3
    assert [s["samples"] for s in doc["shards"]] == COUNTS


def test_verify_names_each_damaged_shard(copy):
    flip_byte(copy / "shard-000000.tar")
    truncate(copy / "shard-000001.tar")
    (copy / "shard-000002.tar").unlink()
    result = wdstream("verify", copy, code=1)
    lines = result.stdout.splitlines()
    assert any(line.startswith("shard-000000.tar: sha256") for line in lines)
    assert "shard-000001.tar: size 3,000 bytes, the manifest says 7,168" in lines
    assert "shard-000002.tar: missing" in lines
    assert lines[-1].startswith("FAILED: 3 of 3 shards")
    doc = as_json(wdstream("verify", copy, "--json", code=1))
    assert not doc["ok"] and doc["shards_with_problems"] == 3


def test_verify_deep_counts_samples(copy, tmp_path):
    # A shard replaced by another valid tar with the right size but other samples: the
    # digest and, with --deep, the sample count disagree with the manifest.
    other = tmp_path / "other"
    write_dataset(other, [3])
    shutil.copy(other / "shard-000000.tar", copy / "shard-000001.tar")
    plain = wdstream("verify", copy, code=1).stdout
    assert "shard-000001.tar: sha256" in plain and "samples" not in plain.split("FAILED")[0]
    deep = wdstream("verify", copy, "--deep", code=1).stdout
    assert "shard-000001.tar: sha256" in deep


def test_verify_deep_reports_a_tar_cut_at_a_member_boundary(copy):
    path = copy / "shard-000002.tar"
    path.write_bytes(path.read_bytes()[:-1024])  # drop the end-of-archive marker
    deep = wdstream("verify", copy, "--deep", code=1).stdout
    assert "shard-000002.tar: size" in deep and "end-of-archive" in deep


def test_verify_without_manifest_parses_every_shard(copy):
    (copy / "index.json").unlink()
    result = wdstream("verify", copy)
    assert "no manifest" in result.stderr and result.stdout.startswith("OK: 3 shards")
    truncate(copy / "shard-000000.tar")
    result = wdstream("verify", copy, code=1)
    assert "shard-000000.tar: truncated" in result.stdout


def test_verify_notes_shards_the_manifest_does_not_list(copy):
    shutil.copy(copy / "shard-000000.tar", copy / "stray.tar")
    result = wdstream("verify", copy)
    assert "stray.tar" in result.stderr


# --------------------------------------------------------------------------- cat


def cat_lines(*args, **kwargs):
    return [json.loads(line) for line in wdstream("cat", *args, **kwargs).stdout.splitlines()]


def test_cat_prints_samples_in_file_order(dataset):
    samples = cat_lines(dataset)
    expected = [sample_key(s, i) for s, n in enumerate(COUNTS) for i in range(n)]
    assert [s["__key__"] for s in samples] == expected
    first = samples[0]
    assert first["json"] == {"shard": 0, "index": 0, "pad": ""} and first["txt"] == "text 0 0"
    assert first["__url__"].endswith("shard-000000.tar")
    assert [s["__key__"] for s in cat_lines(dataset, "-n", "7")] == expected[:7]


def test_cat_key_and_fields(dataset):
    [sample] = cat_lines(dataset, "--key", "s002_00001", "--fields", "txt")
    assert sample == {"__key__": "s002_00001", "txt": "text 2 1"}
    result = wdstream("cat", dataset, "--key", "nope", code=2)
    assert "no sample with key 'nope' in 12 samples of 3 shards" in result.stderr


@pytest.fixture
def binary_shard(tmp_path):
    image = bytes(range(256)) * 4
    array = io.BytesIO()
    np.save(array, np.zeros((2, 3), dtype=np.float32))
    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    writer.add("a.cls", b"7")
    writer.add("a.jpg", image)
    writer.add("a.json", b"{not json")
    writer.add("a.npy", array.getvalue())
    writer.close()
    path = tmp_path / "binary.tar"
    path.write_bytes(buffer.getvalue())
    return str(path), image


@pytest.mark.slow
def test_cat_binary_members(binary_shard):
    path, image = binary_shard
    [sample] = cat_lines(path)
    assert sample["jpg"] == {"bytes": len(image)} and sample["cls"] == 7
    assert sample["npy"] == {"npy": {"shape": [2, 3], "dtype": "float32"}}
    assert sample["json"]["bytes"] == 9 and "decode_error" in sample["json"]
    [encoded] = cat_lines(path, "--base64", "--fields", "jpg")
    assert base64.b64decode(encoded["jpg"]["base64"]) == image
    [raw] = cat_lines(path, "--no-decode")
    assert raw["cls"] == {"bytes": 1} and raw["json"] == {"bytes": 9}


def test_cat_into_a_closed_pipe_is_quiet(tmp_path):
    write_dataset(tmp_path / "big", [3000])
    exe = shutil.which("wdstream", path=os.path.dirname(sys.executable))
    result = subprocess.run(f"'{exe}' cat '{tmp_path / 'big'}' | head -n 2", shell=True,
                            capture_output=True, text=True, timeout=60)
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr == ""


# --------------------------------------------------------------------------- bench


@pytest.mark.slow
def test_bench_streams_through_the_loader(dataset):
    doc = as_json(wdstream("bench", dataset, "--workers", "2", "--batch-size", "4", "--json"))
    # two workers read 6 samples each: batches of 4 + 2 per worker
    assert doc["samples"] == 12 and doc["batches"] == 4 and doc["workers"] == 2
    assert doc["samples_per_s"] > 0 and doc["first_batch_seconds"] > 0
    assert doc["mb_per_s"] > 0 and doc["retries"] == 0 and doc["skipped_shards"] == []
    out = wdstream("bench", dataset, "--workers", "0", "--batch-size", "0", "--batches", "5",
                   "--no-shuffle").stdout
    assert "samples/s" in out and "first batch" in out and "MB/s" in out
    tensors = as_json(wdstream("bench", dataset, "--workers", "2", "--batch-size", "4",
                               "--no-decode", "--bytes-as", "tensor", "--json"))
    assert tensors["samples"] == 12 and tensors["bytes_as"] == "tensor"


@pytest.mark.slow
def test_bench_reports_a_damaged_shard_in_one_line(copy):
    truncate(copy / "shard-000001.tar")
    result = wdstream("bench", copy, "--workers", "1", code=1, timeout=180)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {copy / 'shard-000001.tar'}: truncated member (35 bytes "
                      "expected) at byte 2048"]
    assert "Original Traceback" not in result.stderr
    skipped = as_json(wdstream("bench", copy, "--workers", "1", "--on-error", "skip", "--json",
                               timeout=180))
    assert skipped["skipped_shards"] and skipped["skipped_samples"] == 3
    assert skipped["samples"] == 9


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("command", ["ls", "verify", "cat", "bench"])
@pytest.mark.slow
def test_missing_dataset_is_exit_2_without_traceback(command, tmp_path):
    result = wdstream(command, tmp_path / "nothing-here", code=2)
    assert result.stderr.startswith("error: ")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = wdstream(command, empty, code=2)
    assert "no index.json and no .tar shards" in result.stderr


@pytest.mark.parametrize("command", ["ls", "verify", "cat"])
def test_invalid_manifest_is_exit_2(command, copy):
    (copy / "index.json").write_text('{"format": "wdstream"')
    result = wdstream(command, copy, code=2)
    assert "index.json: not valid JSON" in result.stderr


@pytest.mark.slow
def test_bad_options_are_usage_errors(dataset):
    wdstream("verify", dataset, "--workers", "0", code=2)
    wdstream("cat", dataset, "-n", "-1", code=2)
    wdstream("cat", dataset, "--fields", ",", code=2)
    wdstream("bench", dataset, "--opener", "carrier-pigeon", code=2)
    result = wdstream("cat", "s3://no bucket here/x.tar", "--opener", "cli", code=2,
                      env={**os.environ, "AWS_MAX_ATTEMPTS": "1", "AWS_ENDPOINT_URL":
                           "http://127.0.0.1:9"})
    assert result.stderr.startswith("error: ")


# --------------------------------------------------------------------------- S3 (moto)


def upload(client, bucket, folder, prefix):
    for name in sorted(os.listdir(folder)):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}",
                          Body=(folder / name).read_bytes() if hasattr(folder, "joinpath")
                          else open(os.path.join(folder, name), "rb").read())


@pytest.mark.slow
def test_commands_on_s3(s3, s3_bucket, dataset, cli_env):
    client = s3.client()
    upload(client, s3_bucket, dataset, "ds")
    url = f"s3://{s3_bucket}/ds/"

    doc = as_json(wdstream("ls", url, "--json", env=cli_env))
    assert doc["samples"] == 12 and doc["manifest"] == url + "index.json"
    assert "shard-000002.tar" in wdstream("ls", url, env=cli_env).stdout

    assert as_json(wdstream("verify", url, "--deep", "--json", env=cli_env))["ok"]

    samples = cat_lines(url, "-n", "2", env=cli_env)
    assert [s["__key__"] for s in samples] == ["s000_00000", "s000_00001"]
    assert samples[0]["__url__"] == url + "shard-000000.tar"
    [found] = cat_lines(url, "--key", "s001_00002", "--opener", "cli", env=cli_env)
    assert found["txt"] == "text 1 2"

    bench = as_json(wdstream("bench", url, "--workers", "1", "--batch-size", "4", "--json",
                             env=cli_env))
    assert bench["samples"] == 12 and bench["mb_per_s"] > 0

    # damage one object in the bucket
    key = "ds/shard-000001.tar"
    data = bytearray(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    data[700] ^= 0xFF
    client.put_object(Bucket=s3_bucket, Key=key, Body=bytes(data))
    client.delete_object(Bucket=s3_bucket, Key="ds/shard-000002.tar")
    result = wdstream("verify", url, env=cli_env, code=1)
    assert "shard-000001.tar: sha256" in result.stdout
    assert "shard-000002.tar: missing" in result.stdout


@pytest.mark.slow
def test_s3_without_manifest_and_unreachable(s3, s3_bucket, dataset, cli_env):
    client = s3.client()
    upload(client, s3_bucket, dataset, "raw")
    client.delete_object(Bucket=s3_bucket, Key="raw/index.json")
    url = f"s3://{s3_bucket}/raw/"
    doc = as_json(wdstream("ls", url, "--json", env=cli_env))
    assert doc["manifest"] is None and doc["scanned"] and doc["samples"] == 12
    assert "no manifest" in wdstream("verify", url, env=cli_env).stderr

    result = wdstream("ls", f"s3://{s3_bucket}-missing/ds/", env=cli_env, code=2)
    assert result.stderr.startswith("error: ")
    result = wdstream("verify", f"s3://{s3_bucket}/ds/index.json", env=cli_env, code=2)
    assert "no manifest found" in result.stderr


# --------------------------------------------------------------------------- the library


def test_library_functions(copy):
    from wdstream.inspection import describe, find_shards, read_samples, sample_to_json, verify

    shards = [str(copy / f"shard-{i:06d}.tar") for i in range(3)]
    summary = describe(shards, workers=2)
    assert summary.samples == 12 and summary.manifest_url is None and summary.scanned
    assert [s.name for s in summary.shards] == [os.path.basename(s) for s in shards]

    found = find_shards(str(copy))
    assert found.manifest is not None and found.names[0] == "shard-000000.tar"
    flip_byte(copy / "shard-000002.tar")
    seen = []
    report = verify(found, deep=True, workers=2, progress=seen.append)
    assert not report.ok and [s.name for s in report.problems] == ["shard-000002.tar"]
    assert sum(seen) == sum(s.size for s in report.shards)
    assert json.loads(json.dumps(report.to_dict()))["shards_with_problems"] == 1

    [sample] = read_samples(str(copy), key="s001_00001")
    assert sample_to_json(sample, fields=["txt"]) == {"__key__": "s001_00001", "txt": "text 1 1"}
    assert len(list(read_samples(str(copy), limit=6))) == 6

