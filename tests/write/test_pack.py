"""``wdstream pack`` and ``wdstream index``, run as the installed command in a subprocess, against
local folders, a moto S3 server (checked with the real ``aws`` CLI and s3fs) and the GCS emulator
(checked with gcsfs). Shards are read back with ``tarfile`` and ``webdataset``."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

WDSTREAM = shutil.which("wdstream", path=os.path.dirname(sys.executable)) or "wdstream"


# --- helpers ---------------------------------------------------------------------------------


def run(args, env, *, stdin: bytes | None = None, expect: int = 0) -> subprocess.CompletedProcess:
    """Run ``wdstream ARGS``; check the exit status, and that a failure is a one-line error."""
    result = subprocess.run(
        [WDSTREAM, *map(str, args)], env=env, input=stdin, capture_output=True, timeout=120
    )
    stderr = result.stderr.decode()
    assert result.returncode == expect, f"exit {result.returncode}\n{stderr}"
    if expect:
        assert "Traceback" not in stderr, stderr
        assert stderr.startswith("error: "), stderr
        assert result.stdout == b""
    return result


def fail(args, env, **kwargs) -> str:
    """The error message of a run that must exit with 2."""
    return run(args, env, expect=2, **kwargs).stderr.decode()


def records(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"r{i}", "text": f"record {i} " + "x" * (i % 7), "n": i} for i in range(start, start + n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_csv(path: Path, rows: list[dict], delimiter: str = ",") -> Path:
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def tar_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def samples_of(members: list[tuple[str, bytes]]) -> list[dict]:
    """Group tar members into samples by key (the name up to the first dot)."""
    samples: list[dict] = []
    for name, data in members:
        key, ext = name.split(".", 1)
        if not samples or samples[-1]["__key__"] != key:
            samples.append({"__key__": key})
        samples[-1][ext] = data
    return samples


def check_local_dataset(prefix: Path) -> tuple[dict, list[dict]]:
    """Check the manifest against the shard files; return it and all samples in order."""
    manifest = json.loads((prefix / "index.json").read_text())
    assert manifest["format"] == "wdstream" and manifest["version"] == 1
    samples = []
    for shard in manifest["shards"]:
        data = (prefix / shard["url"]).read_bytes()
        assert len(data) == shard["bytes"]
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        shard_samples = samples_of(tar_members(data))
        assert len(shard_samples) == shard["samples"]
        samples += shard_samples
    assert manifest["samples"] == len(samples) == sum(s["samples"] for s in manifest["shards"])
    assert manifest["bytes"] == sum(s["bytes"] for s in manifest["shards"])
    tars = sorted(p.name for p in prefix.glob("*.tar"))
    assert tars == sorted(s["url"] for s in manifest["shards"])
    assert not [p for p in prefix.iterdir() if p.name.endswith(".tmp")]
    return manifest, samples


def folder_bytes(prefix: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(prefix.iterdir())}


# --- inputs and layout -----------------------------------------------------------------------


def test_jsonl_default_layout_keeps_lines_and_generates_keys(tmp_path, cli_env):
    lines = [json.dumps(r, indent=None, separators=(", ", ": ")) for r in records(30)]
    source = tmp_path / "data.jsonl"
    # blank lines and CRLF endings are skipped and stripped
    source.write_bytes(("\r\n".join(lines[:10]) + "\r\n\n" + "\n".join(lines[10:]) + "\n").encode())
    result = run(["pack", source, "--output", tmp_path / "out", "--max-count", 7], cli_env)
    manifest, samples = check_local_dataset(tmp_path / "out")
    assert [s["json"].decode() for s in samples] == lines
    assert [s["__key__"] for s in samples] == [f"{i:010d}" for i in range(30)]
    assert manifest["extensions"] == ["json"]
    assert [s["url"] for s in manifest["shards"]] == [f"shard-{i:06d}.tar" for i in range(5)]
    assert manifest["packed_by"]["options"]["max_count"] == 7
    summary = result.stdout.decode()
    assert "shards" in summary and "30" in summary and str(tmp_path / "out") in summary


def test_every_input_type_in_order(tmp_path, cli_env):
    import zstandard

    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records(3, 3)).encode()))
    zst = tmp_path / "c.ndjson.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in records(3, 6)).encode()))
    inputs = [
        write_jsonl(tmp_path / "a.jsonl", records(3, 0)),
        gz,
        zst,
        write_parquet(tmp_path / "d.parquet", records(3, 9)),
        write_csv(tmp_path / "e.csv", records(3, 12)),
        write_csv(tmp_path / "f.tsv", records(3, 15), delimiter="\t"),
        "-",
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in records(3, 18)).encode()
    run(["pack", *inputs, "--output", tmp_path / "out"], cli_env, stdin=stdin)
    manifest, samples = check_local_dataset(tmp_path / "out")
    values = [json.loads(s["json"]) for s in samples]
    assert [v["id"] for v in values] == [f"r{i}" for i in range(21)]
    assert values[9] == records(1, 9)[0]  # Parquet keeps types
    assert values[12]["n"] == "12"  # CSV values are strings
    assert manifest["packed_by"]["inputs"][-1] == "<stdin>"
    assert [s["__key__"] for s in samples] == [f"{i:010d}" for i in range(21)]


def test_folder_files_sharing_a_name_form_one_sample(tmp_path, cli_env):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"\xff\xd8jpeg-a")
    (folder / "a.json").write_text('{"label": 1}')
    (folder / "b.jpg").write_bytes(b"\xff\xd8jpeg-b")
    (folder / "b.seg.png").write_bytes(b"png-b")
    (folder / ".DS_Store").write_bytes(b"hidden files are skipped")
    run(["pack", folder, "--output", tmp_path / "out"], cli_env)
    manifest, samples = check_local_dataset(tmp_path / "out")
    assert samples == [
        {"__key__": "a", "jpg": b"\xff\xd8jpeg-a", "json": b'{"label": 1}'},
        {"__key__": "b", "jpg": b"\xff\xd8jpeg-b", "seg.png": b"png-b"},
    ]
    assert manifest["extensions"] == ["jpg", "json", "seg.png"]

    (folder / "cats").mkdir()
    (folder / "cats" / "c.jpg").write_bytes(b"c")
    error = fail(["pack", folder, "--output", tmp_path / "out2"], cli_env)
    assert "cats/c.jpg" in error and "'/'" in error
    assert not (tmp_path / "out2" / "index.json").exists()


def test_fields_and_key(tmp_path, cli_env):
    rows = [{"id": f"img{i}", "caption": f"caption {i}", "image": bytes([i]) * 3, "meta": {"i": i}}
            for i in range(4)]
    source = write_parquet(tmp_path / "d.parquet", rows)
    run(["pack", source, "--output", tmp_path / "out", "--key", "id",
         "--field", "image=jpg", "--field", "caption=txt", "--field", "meta=json"], cli_env)
    manifest, samples = check_local_dataset(tmp_path / "out")
    first = tar_members((tmp_path / "out" / "shard-000000.tar").read_bytes())[:3]
    assert [name for name, _ in first] == ["img0.jpg", "img0.json", "img0.txt"]  # sorted by ext
    assert samples[3] == {"__key__": "img3", "jpg": b"\x03\x03\x03", "txt": b"caption 3",
                          "json": b'{"i":3}'}
    assert manifest["extensions"] == ["jpg", "json", "txt"]
    assert manifest["packed_by"]["options"]["key"] == "id"


def test_generated_keys_are_unique_across_inputs(tmp_path, cli_env):
    a = write_jsonl(tmp_path / "a.jsonl", records(5))
    b = write_csv(tmp_path / "b.csv", records(5))
    run(["pack", a, b, "--output", tmp_path / "out", "--max-count", 3], cli_env)
    _, samples = check_local_dataset(tmp_path / "out")
    keys = [s["__key__"] for s in samples]
    assert len(set(keys)) == len(keys) == 10


# --- shard sizing, reproducibility, parallelism ----------------------------------------------


def test_max_size_bounds_the_real_tar_bytes(tmp_path, cli_env):
    rows = [{"id": i, "text": "y" * (37 * i % 3000)} for i in range(120)]
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    run(["pack", source, "--output", tmp_path / "out", "--max-size", "20kB", "--max-count", 9],
        cli_env)
    manifest, samples = check_local_dataset(tmp_path / "out")
    assert len(samples) == 120
    for shard in manifest["shards"]:
        assert os.path.getsize(tmp_path / "out" / shard["url"]) <= 20_000
        assert shard["samples"] <= 9
    assert len(manifest["shards"]) > 120 // 9


@pytest.mark.slow
def test_reruns_and_workers_give_identical_bytes(tmp_path, cli_env):
    source = write_jsonl(tmp_path / "d.jsonl", records(400))
    csv_source = write_csv(tmp_path / "e.csv", records(100, 400))
    common = [source, csv_source, "--max-size", "16KiB"]
    run(["pack", *common, "--output", tmp_path / "one"], cli_env)
    run(["pack", *common, "--output", tmp_path / "again"], cli_env)
    run(["pack", *common, "--output", tmp_path / "two", "--workers", 2], cli_env)
    one = folder_bytes(tmp_path / "one")
    assert len(one) > 5
    assert folder_bytes(tmp_path / "again") == one
    assert folder_bytes(tmp_path / "two") == one


@pytest.mark.slow
def test_parts_merge_into_the_single_run_dataset(tmp_path, cli_env):
    source = write_jsonl(tmp_path / "d.jsonl", records(50))
    run(["pack", source, "--output", tmp_path / "single", "--max-count", 6], cli_env)
    for i in range(3):
        result = run(["pack", source, "--output", tmp_path / "parts", "--max-count", 6,
                      "--part", f"{i}/3"], cli_env)
    assert "index --merge" in result.stdout.decode()
    part_manifests = [tmp_path / "parts" / f"index.part-{i:03d}-of-003.json" for i in range(3)]
    assert not (tmp_path / "parts" / "index.json").exists()
    run(["index", "--merge", *part_manifests, "--output", tmp_path / "parts"], cli_env)
    single, single_samples = check_local_dataset(tmp_path / "single")
    merged, merged_samples = check_local_dataset(tmp_path / "parts")
    assert merged["shards"] == single["shards"]
    assert merged["packed_by"] == single["packed_by"]
    assert merged_samples == single_samples
    for shard in single["shards"]:
        assert (tmp_path / "parts" / shard["url"]).read_bytes() == \
            (tmp_path / "single" / shard["url"]).read_bytes()


# --- outputs ---------------------------------------------------------------------------------


def _check_remote(fs, prefix: str, count: int) -> None:
    """Read the manifest and shards back through an fsspec filesystem."""
    manifest = json.loads(fs.cat_file(f"{prefix}/index.json"))
    total = 0
    for shard in manifest["shards"]:
        data = fs.cat_file(f"{prefix}/{shard['url']}")
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        assert len(data) == shard["bytes"]
        total += len(samples_of(tar_members(data)))
    assert manifest["samples"] == total == count


@pytest.mark.parametrize("via", ["auto", "fsspec", "cli"])
@pytest.mark.slow
def test_output_to_s3(tmp_path, s3_bucket, cli_env, via):
    import s3fs

    source = write_jsonl(tmp_path / "d.jsonl", records(20))
    run(["pack", source, "--output", f"s3://{s3_bucket}/ds/", "--max-count", 10, "--via", via],
        cli_env)
    listing = subprocess.run(["aws", "s3", "ls", f"s3://{s3_bucket}/ds/"], env=cli_env,
                             capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in listing.splitlines())
    assert names == ["index.json", "shard-000000.tar", "shard-000001.tar"]
    fs = s3fs.S3FileSystem(anon=False, endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    _check_remote(fs, f"{s3_bucket}/ds", 20)
    if via == "cli":
        return  # each aws call costs ~0.7 s: the rest is the same for both
    error = fail(["pack", source, "--output", f"s3://{s3_bucket}/ds/", "--via", via], cli_env)
    assert "already exists" in error and "--overwrite" in error
    quiet = run(["pack", source, "--output", f"s3://{s3_bucket}/ds/", "--via", via,
                 "--overwrite", "--quiet"], cli_env)
    assert quiet.stdout == b"" and quiet.stderr == b""
    fs.invalidate_cache()
    assert json.loads(fs.cat_file(f"{s3_bucket}/ds/index.json"))["shards"][0]["samples"] == 20


def _gcs_fs():
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=os.environ["STORAGE_EMULATOR_HOST"], token="anon")


@pytest.mark.slow
def test_output_to_gcs_via_fsspec(tmp_path, gcs, cli_env):
    source = write_jsonl(tmp_path / "d.jsonl", records(12))
    env = {**cli_env, **gcs.env}
    run(["pack", source, "--output", "gs://bucket/fsspec/", "--max-count", 5], env)
    _check_remote(_gcs_fs(), "bucket/fsspec", 12)


STAND_IN_GCLOUD = """#!{python}
# Stand-in for `gcloud storage cp - gs://...` (the emulator rejects the real CLI's uploads): the
# same upload through the emulator's JSON API.
import os, sys, urllib.parse, urllib.request
args = sys.argv[1:]
assert args[:3] == ["storage", "cp", "-"], args
bucket, _, key = args[3].removeprefix("gs://").partition("/")
name = urllib.parse.quote(key, safe="")
urllib.request.urlopen(urllib.request.Request(
    f"{{os.environ['STORAGE_EMULATOR_HOST']}}/upload/storage/v1/b/{{bucket}}/o"
    f"?uploadType=media&name={{name}}",
    data=sys.stdin.buffer.read(), method="POST",
    headers={{"Content-Type": "application/octet-stream"}}))
with open(os.environ["STAND_IN_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
"""


@pytest.mark.slow
def test_output_to_gcs_via_cli_stand_in(tmp_path, gcs, cli_env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(STAND_IN_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**cli_env, **gcs.env, "STAND_IN_LOG": str(log),
           "PATH": f"{bin_dir}{os.pathsep}{cli_env['PATH']}"}
    source = write_jsonl(tmp_path / "d.jsonl", records(12))
    run(["pack", source, "--output", "gs://bucket/cli/", "--max-count", 5, "--via", "cli"], env)
    calls = log.read_text().splitlines()
    assert calls[-1] == "storage cp - gs://bucket/cli/index.json"  # the manifest last
    assert len(calls) == 4
    _check_remote(_gcs_fs(), "bucket/cli", 12)


# --- interop ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_webdataset_reads_the_shards(tmp_path, cli_env):
    import webdataset

    rows = [{"id": f"k{i}", "text": f"text {i}"} for i in range(25)]
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    run(["pack", source, "--output", tmp_path / "out", "--key", "id", "--field", "text=txt",
         "--max-count", 10], cli_env)
    manifest = json.loads((tmp_path / "out" / "index.json").read_text())
    urls = [str(tmp_path / "out" / s["url"]) for s in manifest["shards"]]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [f"k{i}" for i in range(25)]
    assert [s["txt"] for s in samples] == [f"text {i}".encode() for i in range(25)]
    assert len(samples) == manifest["samples"]
    # GNU tar lists them too
    listing = subprocess.run(["tar", "tf", urls[0]], capture_output=True, text=True, check=True)
    assert listing.stdout.split() == [f"k{i}.txt" for i in range(10)]


@pytest.mark.slow
def test_index_shards_from_shardwriter_and_gnu_tar(tmp_path, cli_env):
    import webdataset

    folder = tmp_path / "wds"
    folder.mkdir()
    with webdataset.ShardWriter(str(folder / "part-%03d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"s{i}", "txt": f"t{i}", "cls": i})
    run(["index", folder], cli_env)
    manifest, samples = check_local_dataset(folder)
    assert [s["__key__"] for s in samples] == [f"s{i}" for i in range(10)]
    assert manifest["extensions"] == ["cls", "txt"]
    assert "already exists" in fail(["index", folder], cli_env)
    run(["index", folder, "--overwrite", "--quiet"], cli_env)

    gnu = tmp_path / "gnu"
    (gnu / "files").mkdir(parents=True)
    for i in range(3):
        (gnu / "files" / f"x{i}.txt").write_text(f"gnu {i}")
    subprocess.run(["tar", "cf", "../shard.tar", "x0.txt", "x1.txt", "x2.txt"],
                   cwd=gnu / "files", check=True)
    run(["index", gnu], cli_env)
    manifest, samples = check_local_dataset(gnu)
    assert manifest["samples"] == 3 and samples[2] == {"__key__": "x2", "txt": b"gnu 2"}


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_records_are_named(tmp_path, cli_env):
    good = write_jsonl(tmp_path / "good.jsonl", records(3))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n\n{"id": "b", oops}\n')
    error = fail(["pack", good, bad, "--output", tmp_path / "o1"], cli_env)
    assert "bad.jsonl:3" in error and "malformed JSON" in error

    error = fail(["pack", good, "--output", tmp_path / "o2", "--key", "missing"], cli_env)
    assert "good.jsonl:1" in error and "'missing'" in error
    error = fail(["pack", good, "--output", tmp_path / "o3", "--field", "nope=txt"], cli_env)
    assert "good.jsonl:1" in error and "'nope'" in error

    dotted = write_csv(tmp_path / "dotted.csv", [{"id": "a"}, {"id": "b.c"}])
    error = fail(["pack", dotted, "--output", tmp_path / "o4", "--key", "id"], cli_env)
    assert "dotted.csv:3" in error and "'b.c'" in error and "'.'" in error

    twice = write_jsonl(tmp_path / "twice.jsonl", [{"id": "a"}, {"id": "b"}, {"id": "a"}])
    error = fail(["pack", twice, "--output", tmp_path / "o5", "--key", "id"], cli_env)
    assert "twice.jsonl:3" in error and "'a'" in error and "twice.jsonl:1" in error

    for name in ("o1", "o2", "o3", "o4", "o5"):
        assert not list((tmp_path / name).iterdir())


@pytest.mark.slow
def test_bad_inputs_and_options(tmp_path, cli_env):
    (tmp_path / "data.xml").write_text("<a/>")
    error = fail(["pack", tmp_path / "data.xml", "--output", tmp_path / "out"], cli_env)
    assert "data.xml" in error and "unknown input type" in error
    assert "no such file" in fail(["pack", tmp_path / "none.jsonl", "--output", tmp_path / "o"],
                                  cli_env)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    empty_csv = tmp_path / "empty.csv"
    empty_csv.write_text("id,text\n")
    error = fail(["pack", tmp_path / "empty.jsonl", empty_csv, "--output", tmp_path / "o"], cli_env)
    assert "no records" in error and "empty.jsonl" in error
    assert "no records" in fail(["pack", "-", "--output", tmp_path / "o"], cli_env, stdin=b"")
    source = write_jsonl(tmp_path / "d.jsonl", records(3))
    assert "--part" in fail(["pack", source, "--output", tmp_path / "o", "--part", "3/3"], cli_env)
    assert "not a size" in fail(["pack", source, "--output", tmp_path / "o", "--max-size", "big"],
                                cli_env)
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gzip.compress(b'{"a": 1}\n' * 1000)[:-20])
    assert "cut.jsonl.gz" in fail(["pack", truncated, "--output", tmp_path / "o"], cli_env)
    blobs = write_parquet(tmp_path / "blobs.parquet", [{"id": 1, "image": b"\xff\xd8"}])
    error = fail(["pack", blobs, "--output", tmp_path / "o"], cli_env)
    assert "blobs.parquet row 1" in error and "--field" in error
    big = write_jsonl(tmp_path / "big.jsonl", [{"text": "x" * 600}])
    error = fail(["pack", big, "--output", tmp_path / "o", "--max-size", 2100], cli_env)
    assert "big.jsonl:1" in error and "maximum shard size" in error


@pytest.mark.slow
def test_unwritable_destinations(tmp_path, s3, cli_env):
    source = write_jsonl(tmp_path / "d.jsonl", records(3))
    (tmp_path / "file").write_text("not a folder")
    error = fail(["pack", source, "--output", tmp_path / "file" / "out"], cli_env)
    assert "cannot create the output folder" in error
    error = fail(["pack", source, "--output", "s3://no-such-bucket/ds/"], cli_env)
    assert "s3://no-such-bucket/ds/" in error and "bucket" in error
    unreachable = {**cli_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    assert "127.0.0.1:9" in fail(["pack", source, "--output", "s3://bucket/ds/"], unreachable)
    no_credentials = {k: v for k, v in cli_env.items() if not k.startswith("AWS_ACCESS")
                      and not k.startswith("AWS_SECRET")}
    (tmp_path / "empty-config").write_text("")
    no_credentials.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "empty-config"),
                          AWS_CONFIG_FILE=str(tmp_path / "empty-config"),
                          AWS_EC2_METADATA_DISABLED="true")
    assert "credentials" in fail(["pack", source, "--output", "s3://bucket/ds/"], no_credentials)


@pytest.mark.slow
def test_a_failure_after_the_first_shards_leaves_nothing(tmp_path, cli_env):
    rows = records(30)
    lines = [json.dumps(r) for r in rows]
    lines[25] = '{"id": "broken"'
    source = tmp_path / "d.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    for workers in (1, 2):
        error = fail(["pack", source, "--output", out, "--max-count", 5, "--workers", workers],
                     cli_env)
        assert "d.jsonl:26" in error
        assert list(out.iterdir()) == []

    # With --overwrite the old manifest goes first: a failed run leaves none behind.
    good = write_jsonl(tmp_path / "good.jsonl", records(10))
    run(["pack", good, "--output", out, "--max-count", 5], cli_env)
    fail(["pack", source, "--output", out, "--max-count", 5, "--overwrite"], cli_env)
    assert not (out / "index.json").exists()


def test_interrupt_removes_written_shards(tmp_path):
    from wdstream.write.packer import pack

    source = write_jsonl(tmp_path / "d.jsonl", records(40))

    def interrupt_after_two_shards(status):
        if status.shards == 2:
            raise KeyboardInterrupt

    for workers in (1, 2):
        with pytest.raises(KeyboardInterrupt):
            pack([str(source)], str(tmp_path / "out"), max_count=5, workers=workers,
                 progress=interrupt_after_two_shards)
        assert list((tmp_path / "out").iterdir()) == []


def test_help_shows_examples(cli_env):
    for command in ("pack", "index"):
        text = run([command, "--help"], cli_env).stdout.decode()
        assert "Examples:" in text and f"wdstream {command}" in text


def test_ctrl_c_mid_run_leaves_nothing(tmp_path, cli_env):
    out = tmp_path / "out"
    process = subprocess.Popen(
        [WDSTREAM, "pack", "-", "--output", str(out), "--max-count", "2", "--workers", "2"],
        env=cli_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, as a terminal's Ctrl-C sees it
    )
    try:
        process.stdin.write("".join(json.dumps(r) + "\n" for r in records(9)).encode())
        process.stdin.flush()  # stdin stays open: the run is waiting for more records
        deadline = time.monotonic() + 30
        while len(list(out.glob("*.tar"))) < 2:
            assert time.monotonic() < deadline, "no shards written"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert "Traceback" not in stderr.decode() and stdout == b""
    assert list(out.iterdir()) == []


# --- pre-tokenized members: --tokenize with --tokenizer ------------------------------------------


def _texts(n: int) -> list[dict]:
    from tests.support.llm_data import documents

    return [{"id": f"t{i}", "text": text} for i, text in enumerate(documents(11, n, 120))]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    from tests.support.llm_data import documents, train_tokenizer

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return path, train_tokenizer(path, documents(99, 300), vocab_size=150)


def _npy(array) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.slow
def test_tokenize_stores_token_ids_as_npy(tmp_path, cli_env, tokenizer_file):
    import numpy as np

    path, tokenizer = tokenizer_file
    rows = _texts(150) + [{"id": "empty", "text": ""}]
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    common = [source, "--tokenizer", path, "--tokenize", "text=tokens.npy", "--field", "text=txt",
              "--key", "id", "--max-size", "12KiB"]
    result = run(["pack", *common, "--output", tmp_path / "one"], cli_env)
    assert "uint16" in result.stdout.decode()
    manifest, samples = check_local_dataset(tmp_path / "one")
    assert len(manifest["shards"]) > 3
    assert [s["__key__"] for s in samples] == [r["id"] for r in rows]
    for row, sample in zip(rows, samples, strict=True):
        ids = tokenizer.encode(row["text"], add_special_tokens=False).ids  # no EOS
        tokens = np.load(io.BytesIO(sample["tokens.npy"]), allow_pickle=False)
        assert tokens.dtype == np.dtype("<u2") and tokens.tolist() == ids
        assert sample["tokens.npy"] == _npy(np.asarray(ids, dtype="<u2"))  # np.save's bytes
        assert sample["txt"].decode() == row["text"]
    assert manifest["extensions"] == ["tokens.npy", "txt"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["tokenizer"] == {
        "file": "tokenizer.json", "sha256": digest, "dtype": "uint16",
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "columns": {"text": "tokens.npy"},
    }
    assert manifest["packed_by"]["options"]["tokenize"] == {"text": "tokens.npy"}

    # Tokenized by the writer processes: the same bytes with 2 workers. With --max-count
    # alone, the shard writers tokenize (no sizes are needed up front): the same again.
    run(["pack", *common, "--output", tmp_path / "two", "--workers", 2, "--quiet"], cli_env)
    assert folder_bytes(tmp_path / "two") == folder_bytes(tmp_path / "one")
    by_count = [source, "--tokenizer", path, "--tokenize", "text=tokens.npy", "--max-count", 40]
    run(["pack", *by_count, "--output", tmp_path / "c1", "--quiet"], cli_env)
    run(["pack", *by_count, "--output", tmp_path / "c2", "--workers", 2, "--quiet"], cli_env)
    assert folder_bytes(tmp_path / "c2") == folder_bytes(tmp_path / "c1")
    _, count_samples = check_local_dataset(tmp_path / "c1")
    assert [set(s) for s in count_samples] == [{"__key__", "tokens.npy"}] * len(rows)
    assert [s["tokens.npy"] for s in count_samples] == [s["tokens.npy"] for s in samples]


@pytest.mark.slow
def test_tokenized_parts_merge_into_the_single_run_dataset(tmp_path, cli_env, tokenizer_file):
    path, _ = tokenizer_file
    source = write_csv(tmp_path / "d.csv", _texts(60))
    common = [source, "--tokenizer", path, "--tokenize", "text=tokens.npy", "--quiet"]
    for limit in (["--max-count", 7], ["--max-size", "6KiB"]):
        single, parts = tmp_path / f"single{limit[0]}", tmp_path / f"parts{limit[0]}"
        run(["pack", *common, *limit, "--output", single], cli_env)
        for i in range(3):
            run(["pack", *common, *limit, "--output", parts, "--part", f"{i}/3"], cli_env)
        run(["index", "--merge", *sorted(parts.glob("index.part-*.json")), "--output", parts,
             "--quiet"], cli_env)
        single_manifest, single_samples = check_local_dataset(single)
        merged, merged_samples = check_local_dataset(parts)
        assert merged["shards"] == single_manifest["shards"]
        assert merged["tokenizer"] == single_manifest["tokenizer"]
        assert merged_samples == single_samples


@pytest.mark.slow
def test_tokenize_uses_uint32_beyond_65536_ids(tmp_path, cli_env):
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 70_000)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "big.json"))
    rows = [{"text": "w1 w65535 w65536 w69999 unknown"}, {"text": "w2"}]
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    run(["pack", source, "--tokenizer", tmp_path / "big.json", "--tokenize", "text=ids.npy",
         "--output", tmp_path / "out", "--quiet"], cli_env)
    manifest, samples = check_local_dataset(tmp_path / "out")
    assert manifest["tokenizer"]["dtype"] == "uint32"
    assert manifest["tokenizer"]["vocab_size"] == 70_000
    first = np.load(io.BytesIO(samples[0]["ids.npy"]))
    assert first.dtype == np.dtype("<u4") and first.tolist() == [1, 65535, 65536, 69999, 0]


@pytest.mark.slow
def test_tokenize_errors(tmp_path, cli_env, tokenizer_file):
    path, _ = tokenizer_file
    source = write_jsonl(tmp_path / "d.jsonl", _texts(20))
    tokenize = ["--tokenize", "text=tokens.npy"]
    error = fail(["pack", source, "--tokenizer", tmp_path / "missing.json", *tokenize,
                  "--output", tmp_path / "o"], cli_env)
    assert "missing.json" in error and "cannot read the tokenizer" in error
    for name, content in (("broken.json", "{not json"), ("other.json", '{"model": 3}')):
        (tmp_path / name).write_text(content)
        error = fail(["pack", source, "--tokenizer", tmp_path / name, *tokenize,
                      "--output", tmp_path / "o"], cli_env)
        assert name in error and "not a usable tokenizer.json" in error
    assert "--tokenizer" in fail(["pack", source, *tokenize, "--output", tmp_path / "o"], cli_env)
    assert "--tokenize" in fail(["pack", source, "--tokenizer", path, "--output", tmp_path / "o"],
                                cli_env)
    assert ".npy" in fail(["pack", source, "--tokenizer", path, "--tokenize", "text=tokens",
                           "--output", tmp_path / "o"], cli_env)
    error = fail(["pack", source, "--tokenizer", path, *tokenize, "--field", "id=tokens.npy",
                  "--output", tmp_path / "o"], cli_env)
    assert "both make a .tokens.npy member" in error
    assert not (tmp_path / "o").exists()  # the options are checked before the output

    # Records: a missing or non-text field is named, in either tokenizing path and any workers.
    bad = _texts(30)
    bad[21] = {"id": "t21", "text": ["not", "text"]}
    bad[25] = {"id": "t25"}
    write_jsonl(tmp_path / "bad.jsonl", bad)
    for limit, workers in ((["--max-size", "4KiB"], 1), (["--max-count", 5], 2)):
        out = tmp_path / f"out{workers}"
        error = fail(["pack", source, tmp_path / "bad.jsonl", "--tokenizer", path, *tokenize,
                      *limit, "--workers", workers, "--output", out], cli_env)
        assert "bad.jsonl:22" in error and "'text'" in error and "not text" in error
        assert list(out.iterdir()) == []
    missing = write_jsonl(tmp_path / "missing.jsonl", [{"id": "a"}])
    error = fail(["pack", missing, "--tokenizer", path, *tokenize, "--output", tmp_path / "o2"],
                 cli_env)
    assert "missing.jsonl:1" in error and "no column 'text'" in error
