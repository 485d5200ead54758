"""`wdstream ls`, `verify` and `cat` (the installed command) on raw files: a Parquet folder
on the moto S3 server and a local JSON Lines folder with a malformed line."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.raw_data import PARQUET_FILES, upload_tree, write_jsonl, write_parquet


def wdstream(cli_env, *args):
    return subprocess.run(["wdstream", *args], env=cli_env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_ls_verify_cat_of_parquet_on_s3(s3, s3_bucket, tmp_path, cli_env):
    url = upload_tree(s3.client(), s3_bucket, write_parquet(tmp_path), "hub")
    listed = wdstream(cli_env, "ls", url, "--json")
    assert listed.returncode == 0, listed.stderr
    summary = json.loads(listed.stdout)
    assert summary["samples"] == sum(n for _, n, _ in PARQUET_FILES)
    assert [(f["name"], f["units"]) for f in summary["shards"]] == [
        ("part-0.parquet", 2), ("part-1.parquet", 3), ("train/part-2.parquet", 4)]
    checked = wdstream(cli_env, "verify", url)
    assert checked.returncode == 0 and checked.stdout.startswith("OK: 3 files"), checked.stdout
    shown = wdstream(cli_env, "cat", url, "--key", "train/part-2.parquet:5", "-f", "text")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"text": "train/part-2.parquet row 5",
                                        "__key__": "train/part-2.parquet:5"}


@pytest.mark.slow
def test_verify_names_a_malformed_line_and_exits_1(tmp_path, cli_env):
    write_jsonl(tmp_path, [("a.jsonl", 20)])
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('{"id": 20, "text": \n')
    checked = wdstream(cli_env, "verify", str(tmp_path))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "a.jsonl: row 20 (byte " in checked.stdout and "is not JSON" in checked.stdout
    shown = wdstream(cli_env, "cat", str(tmp_path), "-n", "2")
    assert [json.loads(line)["__key__"] for line in shown.stdout.splitlines()] == [
        "a.jsonl:0", "a.jsonl:1"]
