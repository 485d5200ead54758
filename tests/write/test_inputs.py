"""``wdstream pack`` reading its inputs from where they live: s3:// (the moto server), gs:// (the
GCS emulator), http:// (a local server) and glob patterns, streamed; and reading any input in
linear time, with the longest record bounded. Run as the installed command."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import time
from pathlib import Path

import pytest

from tests.support.servers import http_server
from tests.write.test_pack import (
    check_local_dataset,
    fail,
    folder_bytes,
    records,
    run,
    write_csv,
    write_jsonl,
    write_parquet,
)
from wdstream.errors import InputError


def _zst(path: Path, data: bytes) -> Path:
    import zstandard

    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return path


def _inputs(folder: Path) -> list[Path]:
    """One input of every kind, in a folder: JSON Lines (plain, .gz, .zst), Parquet, CSV, TSV
    and a folder of files grouped into samples."""
    folder.mkdir()
    plain = write_jsonl(folder / "a.jsonl", records(7))
    gz = folder / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes().replace(b'"r', b'"g')))
    zst = _zst(folder / "c.jsonl.zst", plain.read_bytes().replace(b'"r', b'"z'))
    parquet = write_parquet(folder / "d.parquet", records(5, 100))
    csv_file = write_csv(folder / "e.csv", records(4, 200))
    tsv_file = write_csv(folder / "f.tsv", records(3, 300), delimiter="\t")
    return [plain, gz, zst, parquet, csv_file, tsv_file]


def _upload(client, bucket: str, prefix: str, files: list[Path], root: Path) -> list[str]:
    urls = []
    for path in files:
        key = f"{prefix}/{path.relative_to(root).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        urls.append(f"s3://{bucket}/{key}")
    return urls


def _photos(folder: Path) -> Path:
    folder.mkdir()
    for name, data in [("cat.jpg", b"\xff\xd8cat"), ("cat.json", b'{"label": 1}'),
                       ("dog.jpg", b"\xff\xd8dog"), ("dog.json", b'{"label": 2}')]:
        (folder / name).write_bytes(data)
    return folder


def _s3_files(client, bucket: str, prefix: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"] for item in listed)


@pytest.mark.slow
def test_every_input_kind_from_s3_packs_like_local_files(tmp_path, s3, s3_bucket, cli_env):
    root = tmp_path / "in"
    files = _inputs(root)
    photos = _photos(tmp_path / "photos")
    client = s3.client()
    urls = _upload(client, s3_bucket, "raw", files, root)
    _upload(client, s3_bucket, "raw", sorted(photos.iterdir()), tmp_path)  # raw/photos/...
    run(["pack", *files, photos, "--output", tmp_path / "local", "--max-count", 6], cli_env)
    run(["pack", *urls, f"s3://{s3_bucket}/raw/photos/", "--output", tmp_path / "remote",
         "--max-count", 6, "--workers", 2], cli_env)
    local, remote = folder_bytes(tmp_path / "local"), folder_bytes(tmp_path / "remote")
    assert local.keys() == remote.keys()
    assert {n: d for n, d in local.items() if n != "index.json"} == \
        {n: d for n, d in remote.items() if n != "index.json"}
    manifest, samples = check_local_dataset(tmp_path / "remote")
    assert manifest["samples"] == 7 * 3 + 5 + 4 + 3 + 2
    assert manifest["packed_by"]["inputs"][0] == urls[0]
    assert samples[-1]["jpg"] == b"\xff\xd8dog" and samples[-1]["__key__"] == "dog"

    # ...and to S3: the same shards
    run(["pack", *urls, f"s3://{s3_bucket}/raw/photos/", "--output", f"s3://{s3_bucket}/out/",
         "--max-count", 6, "--quiet"], cli_env)
    for name, data in local.items():
        if name != "index.json":
            assert client.get_object(Bucket=s3_bucket, Key=f"out/{name}")["Body"].read() == data


@pytest.mark.slow
def test_globs_expand_in_sorted_order(tmp_path, s3, s3_bucket, cli_env):
    client = s3.client()
    root = tmp_path / "raw"
    paths = []
    for day, part, start in [("2026-02", 1, 30), ("2026-01", 1, 10), ("2026-01", 0, 0),
                             ("2025-12", 0, 90), ("2026-02", 0, 20)]:
        folder = root / day
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(_zst(folder / f"part-{part}.jsonl.zst",
                          b"".join(json.dumps(r).encode() + b"\n" for r in records(3, start))))
    (root / "2026-01" / "notes.txt").write_text("not an input")
    _upload(client, s3_bucket, "raw", paths, root)
    run(["pack", f"s3://{s3_bucket}/raw/2026-*/part-*.jsonl.zst", "--output", tmp_path / "a",
         "--key", "id", "--quiet"], cli_env)
    _, samples = check_local_dataset(tmp_path / "a")
    # 2026-01/part-0, 2026-01/part-1, 2026-02/part-0, 2026-02/part-1
    assert [s["__key__"] for s in samples] == [f"r{i}" for s in (0, 10, 20, 30)
                                                for i in range(s, s + 3)]
    run(["pack", f"s3://{s3_bucket}/raw/**/*.jsonl.zst", "--output", tmp_path / "b",
         "--key", "id", "--quiet"], cli_env)
    _, samples = check_local_dataset(tmp_path / "b")
    assert [s["__key__"] for s in samples][:3] == ["r90", "r91", "r92"] and len(samples) == 15
    # local globs follow the same rules
    run(["pack", f"{root}/**/*.jsonl.zst", "--output", tmp_path / "c", "--key", "id",
         "--quiet"], cli_env)
    assert folder_bytes(tmp_path / "b").keys() == folder_bytes(tmp_path / "c").keys()
    assert (tmp_path / "b" / "shard-000000.tar").read_bytes() == \
        (tmp_path / "c" / "shard-000000.tar").read_bytes()


@pytest.mark.slow
def test_remote_input_errors_name_the_url_and_publish_nothing(tmp_path, s3, s3_bucket,
                                                              cli_env):
    client = s3.client()
    good = "".join(json.dumps(r) + "\n" for r in records(20))
    bad = good + '{"id": "broken", \n'
    client.put_object(Bucket=s3_bucket, Key="raw/part-3.jsonl.zst",
                      Body=_zst(tmp_path / "x.zst", bad.encode()).read_bytes())
    out = f"s3://{s3_bucket}/out/"
    error = fail(["pack", f"s3://{s3_bucket}/raw/part-3.jsonl.zst", "--output", out,
                  "--max-count", 5], cli_env)
    assert f"s3://{s3_bucket}/raw/part-3.jsonl.zst:21: malformed JSON" in error
    assert _s3_files(client, s3_bucket, "out/") == []

    error = fail(["pack", f"s3://{s3_bucket}/raw/missing.jsonl", "--output", out], cli_env)
    assert f"s3://{s3_bucket}/raw/missing.jsonl: not found" in error
    error = fail(["pack", f"s3://{s3_bucket}/raw/*.parquet", "--output", out], cli_env)
    assert f"s3://{s3_bucket}/raw/*.parquet: no objects match" in error
    error = fail(["pack", "s3://no-such-bucket/raw/a.jsonl", "--output", out], cli_env)
    assert "s3://no-such-bucket/raw/a.jsonl" in error and "bucket" in error
    no_credentials = {k: v for k, v in cli_env.items() if not k.startswith("AWS_")}
    no_credentials.update(AWS_ENDPOINT_URL=s3.endpoint, AWS_CONFIG_FILE="/dev/null",
                          AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_EC2_METADATA_DISABLED="true")
    error = fail(["pack", f"s3://{s3_bucket}/raw/part-3.jsonl.zst", "--output", tmp_path / "o"],
                 no_credentials)
    assert f"s3://{s3_bucket}/raw/part-3.jsonl.zst" in error and "credentials" in error
    assert not (tmp_path / "o").exists()
    assert _s3_files(client, s3_bucket, "out/") == []


@pytest.mark.slow
def test_inputs_from_gcs(tmp_path, gcs, cli_env):
    import gcsfs

    fs = gcsfs.GCSFileSystem(endpoint_url=os.environ["STORAGE_EMULATOR_HOST"], token="anon")
    root = tmp_path / "in"
    files = _inputs(root)
    for path in files:
        fs.pipe_file(f"bucket/raw/{path.name}", path.read_bytes())
    env = {**cli_env, **gcs.env}
    run(["pack", *files, "--output", tmp_path / "local", "--max-count", 8], env)
    run(["pack", "gs://bucket/raw/*", "--output", tmp_path / "remote", "--max-count", 8], env)
    local, remote = folder_bytes(tmp_path / "local"), folder_bytes(tmp_path / "remote")
    assert {n: d for n, d in local.items() if n != "index.json"} == \
        {n: d for n, d in remote.items() if n != "index.json"}
    error = fail(["pack", "gs://bucket/raw/none-*.jsonl", "--output", tmp_path / "x"], env)
    assert "gs://bucket/raw/none-*.jsonl: no objects match" in error


@pytest.fixture
def http_folder(tmp_path):
    """A local HTTP server serving a folder (with Content-Length, as object stores do)."""
    folder = tmp_path / "www"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    with http_server(Quiet) as base:
        yield folder, base


@pytest.mark.slow
def test_inputs_over_http(tmp_path, http_folder, cli_env):
    folder, base = http_folder
    plain = write_jsonl(folder / "a.jsonl", records(9))
    write_parquet(folder / "b.parquet", records(4, 50))
    run(["pack", plain, folder / "b.parquet", "--output", tmp_path / "local", "--max-count", 4],
        cli_env)
    run(["pack", f"{base}/a.jsonl", f"{base}/b.parquet", "--output", tmp_path / "remote",
         "--max-count", 4], cli_env)
    local, remote = folder_bytes(tmp_path / "local"), folder_bytes(tmp_path / "remote")
    assert {n: d for n, d in local.items() if n != "index.json"} == \
        {n: d for n, d in remote.items() if n != "index.json"}
    assert f"{base}/missing.jsonl" in fail(["pack", f"{base}/missing.jsonl", "--output",
                                            tmp_path / "x"], cli_env)


def test_progress_counts_input_bytes_of_the_listed_total(tmp_path, s3, s3_bucket):
    import wdstream
    from wdstream.cli.pack import describe_progress

    root = tmp_path / "in"
    files = _inputs(root)
    urls = _upload(s3.client(), s3_bucket, "raw", files, root)
    seen = []
    wdstream.pack(urls, tmp_path / "out", max_count=4,
                  progress=lambda status: seen.append((status.input_bytes, status.input_total)))
    total = sum(path.stat().st_size for path in files)
    assert {t for _, t in seen} == {total}
    read = [b for b, _ in seen]
    assert read == sorted(read) and read[-1] == total and read[0] < total
    from wdstream.write.packer import PackProgress

    status = PackProgress(records=10, input_bytes=500_000, input_total=2_000_000)
    assert describe_progress(status, 1.0).startswith("500.0 kB of 2.0 MB read · 10 records")


# --- reading in linear time, longest record bounded -------------------------------------------


@pytest.mark.slow
def test_a_huge_line_is_refused_early_and_long_lines_read_in_linear_time(tmp_path, cli_env):
    huge = tmp_path / "huge.jsonl.gz"
    with gzip.open(huge, "wb", compresslevel=1) as file:
        file.write(b'{"ok": 1}\n')
        block = b" " * (1 << 20)
        for _ in range(300):  # 300 MiB of spaces on line 2, in a 300 kB file
            file.write(block)
    started = time.monotonic()
    error = fail(["pack", huge, "--output", tmp_path / "out"], cli_env)
    assert f"{huge}:2: longer than 256 MiB" in error
    assert time.monotonic() - started < 20
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())

    csv_file = tmp_path / "wide.csv"
    with open(csv_file, "w") as file:
        file.write("a,b\n1,2\n3," + "x" * (300 << 20))
    error = fail(["pack", csv_file, "--output", tmp_path / "out"], cli_env)
    assert f"{csv_file}:3: longer than 256 MiB" in error

    # a 40 MB line (ten read chunks) among short ones is read once, not re-joined per chunk
    long_lines = tmp_path / "long.jsonl"
    text = "y" * (40 * 1000**2)
    long_lines.write_text('{"n": 0}\n' + json.dumps({"n": 1, "text": text}) + '\n{"n": 2}\n')
    run(["pack", long_lines, "--output", tmp_path / "long", "--quiet"], cli_env)
    _, samples = check_local_dataset(tmp_path / "long")
    assert [json.loads(s["json"])["n"] for s in samples] == [0, 1, 2]
    assert json.loads(samples[1]["json"])["text"] == text


def test_line_splitting_over_chunk_boundaries(tmp_path):
    from wdstream.write import jsonl_inputs as inputs

    lines = [b'{"i": %d, "pad": "%s"}' % (i, b"p" * (i * 37 % 700)) for i in range(600)]
    data = b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n\n  \n" + b'{"last": 1}'
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    for chunk in (1, 2, 7, 4096, 1 << 20):
        got = []
        original = inputs._CHUNK
        inputs._CHUNK = chunk
        try:
            for batch in inputs.read_jsonl(str(path), max_record=10_000):
                got += list(zip(batch.numbers, batch.values, strict=True))
        finally:
            inputs._CHUNK = original
        assert got == [(i + 1, line) for i, line in enumerate(lines)] + [(603, b'{"last": 1}')]
    with pytest.raises(InputError, match=r"x.jsonl:\d+: longer than"):
        list(inputs.read_jsonl(str(path), max_record=699))


@pytest.mark.slow
def test_workers_read_lines_from_the_file_and_give_the_same_bytes(tmp_path, cli_env):
    # pool workers read a plain file's lines again by byte range: a BOM, blank and
    # whitespace-only lines, CRLF and a last line without a newline must come out the same
    lines = [json.dumps(r) for r in records(60)]
    text = "\ufeff" + lines[0] + "\r\n\n" + "\n".join(lines[1:30]) + "\n  \t\n\n" + \
        "\r\n".join(lines[30:]) + "\n\n" + '{"last": true}'
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(text.encode())
    for workers in (1, 2):
        run(["pack", source, "--output", tmp_path / f"w{workers}", "--max-count", 7,
             "--workers", workers, "--quiet"], cli_env)
    assert folder_bytes(tmp_path / "w1") == folder_bytes(tmp_path / "w2")
    _, samples = check_local_dataset(tmp_path / "w2")
    assert [json.loads(s["json"]).get("id") for s in samples] == \
        [r["id"] for r in records(60)] + [None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:20]) + "\n\n{oops\n" + "\n".join(lines[20:]) + "\n")
    error = fail(["pack", bad, "--output", tmp_path / "bad", "--max-count", 7, "--workers", 2],
                 cli_env)
    assert f"{bad}:22: malformed JSON" in error


# --- compressed and remote JSON Lines read by a pool worker -----------------------------------


def _mixed_text(count: int, last: bool = True) -> bytes:
    """JSON Lines with a BOM, blank and whitespace-only lines, CRLF and (``last``) a last
    record without an id nor a final newline."""
    lines = [json.dumps(r) for r in records(count)]
    half = count // 2
    return ("\ufeff" + lines[0] + "\r\n\n" + "\n".join(lines[1:half]) + "\n  \t\n\n"
            + "\r\n".join(lines[half:]) + "\n\n" + ('{"last": true}' if last else "")).encode()


@pytest.mark.slow
def test_workers_decompress_inputs_and_give_the_same_shards(tmp_path, s3, s3_bucket, cli_env):
    # .zst, .gz and remote JSON Lines are read by a pool worker with --workers > 1: the same
    # shards and manifest as one process reading them, inputs in order, across file ends
    text = _mixed_text(90)
    zst = _zst(tmp_path / "a.jsonl.zst", text)
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(text.replace(b'"r', b'"g')))
    plain = tmp_path / "c.jsonl"
    plain.write_bytes(text.replace(b'"r', b'"p'))
    client = s3.client()
    client.put_object(Bucket=s3_bucket, Key="raw/d.jsonl.zst", Body=zst.read_bytes())
    remote = f"s3://{s3_bucket}/raw/d.jsonl.zst"
    for workers in (1, 2, 3):
        run(["pack", zst, plain, remote, gz, "--output", tmp_path / f"w{workers}",
             "--max-count", 13, "--workers", workers, "--quiet"], cli_env)
    assert folder_bytes(tmp_path / "w1") == folder_bytes(tmp_path / "w2") == \
        folder_bytes(tmp_path / "w3")
    manifest, samples = check_local_dataset(tmp_path / "w2")
    assert manifest["samples"] == 4 * 91 and len(samples) == 4 * 91
    # with --key the reading process parses the records a worker read: same shards again
    keyed = _zst(tmp_path / "keyed.jsonl.zst", _mixed_text(90, last=False))
    for workers in (1, 2):
        run(["pack", keyed, "--key", "id", "--output", tmp_path / f"k{workers}",
             "--max-count", 13, "--workers", workers, "--quiet"], cli_env)
    assert folder_bytes(tmp_path / "k1") == folder_bytes(tmp_path / "k2")


@pytest.mark.slow
def test_errors_from_a_reading_worker_name_the_file_and_line(tmp_path, cli_env):
    lines = [json.dumps(r) for r in records(40)]
    bad = _zst(tmp_path / "bad.jsonl.zst",
               ("\n".join(lines[:30]) + "\n\n{oops\n" + "\n".join(lines[30:]) + "\n").encode())
    for extra in ([], ["--key", "id"]):  # parsed by a shard writer, or by the reading process
        error = fail(["pack", bad, "--output", tmp_path / "o", "--max-count", 7,
                      "--workers", 2, *extra], cli_env)
        assert f"{bad}:32: malformed JSON" in error and len(error.splitlines()) == 1
        assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress("\n".join(lines).encode())[:-40])
    error = fail(["pack", cut, "--output", tmp_path / "o", "--workers", 2], cli_env)
    assert f"{cut}: cannot read after line" in error
    huge = tmp_path / "huge.jsonl.gz"
    with gzip.open(huge, "wb", compresslevel=1) as file:
        file.write(b'{"ok": 1}\n{"ok": 2}\n')
        for _ in range(260):  # 260 MiB of spaces on line 3
            file.write(b" " * (1 << 20))
    error = fail(["pack", huge, "--output", tmp_path / "o", "--workers", 2], cli_env)
    assert f"{huge}:3: longer than 256 MiB" in error
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_a_reading_worker_leaves_workers_processes_writing(tmp_path):
    # With --workers 2 and a compressed input, one process reads while two write shards
    # (which also wait on their uploads): the pool has one process more than --workers.
    from wdstream.write.pool import PoolWriter
    from wdstream.write.record_batches import MAX_RECORD, ReadCounter

    line = json.dumps({"text": "x" * 1000}).encode() + b"\n"
    zst = _zst(tmp_path / "big.jsonl.zst", line * (16 << 10))  # 16 MiB: several batches
    writer = PoolWriter("auto", 2, reads=True)
    done = False
    try:
        batches = writer.read_batches(str(zst), MAX_RECORD, ReadCounter())
        first = next(batches)  # the reader is busy: it waits to send the next batch
        # two jobs of 0.5 s run in two processes (with only --workers processes, both would
        # queue for the one process the reader leaves free)
        jobs = [writer._pool.submit(_pid_after, 0.5) for _ in range(2)]
        assert len({job.result() for job in jobs}) == 2
        assert len(first.values) + sum(len(batch.values) for batch in batches) == 16 << 10
        done = True
    finally:
        writer.close(failed=not done)  # a failure stops the reader, which waits on its pipe
