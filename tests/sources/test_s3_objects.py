"""S3 writes through botocore (``sources.s3_objects``): one PUT, or a multipart upload for large
objects, checked against the writer's SHA-256; and a packer from S3 to S3 that never starts
fsspec's I/O thread, so that its pool forks. All through the moto server."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.write.test_pack import folder_bytes, records, run, write_jsonl
from wdstream.errors import StreamError
from wdstream.sources.objects import delete, exists, open_write, read_bytes, write_bytes
from wdstream.sources.s3_objects import S3Writer

MiB = 1 << 20


def _pending_uploads(s3, bucket: str) -> list:
    return s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads") or []


def _stored_sha256(s3, bucket: str, key: str) -> str | None:
    head = s3.client().head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return head.get("ChecksumSHA256")


def test_auto_writes_s3_with_botocore_one_put_with_the_given_digest(s3, s3_bucket):
    url = f"s3://{s3_bucket}/w/x.tar"
    data = os.urandom(3 * MiB)
    out = open_write(url)
    assert isinstance(out, S3Writer)
    for start in range(0, len(data), MiB):
        out.write(data[start:start + MiB])
    assert not exists(url)  # nothing visible before commit
    out.commit(hashlib.sha256(data).digest())
    assert read_bytes(url) == data
    assert _stored_sha256(s3, s3_bucket, "w/x.tar") == \
        base64.b64encode(hashlib.sha256(data).digest()).decode()
    write_bytes(url, b"small")  # without a digest: botocore's own checksum
    assert read_bytes(url) == b"small"
    delete(url)
    assert not exists(url)
    delete(url)  # a missing object is fine


def test_large_objects_go_as_a_multipart_upload_and_abort_leaves_nothing(s3, s3_bucket):
    url = f"s3://{s3_bucket}/m/big.tar"
    data = os.urandom(12 * MiB)
    out = S3Writer(url, part_size=5 * MiB)
    for start in range(0, len(data), MiB):
        out.write(data[start:start + MiB])
    assert _pending_uploads(s3, s3_bucket)  # parts went out while writing
    assert not exists(url)
    out.commit()
    assert read_bytes(url) == data and not _pending_uploads(s3, s3_bucket)

    # An aborted multipart upload leaves the object before it as it was, and no upload.
    with pytest.raises(RuntimeError):
        with S3Writer(url, part_size=5 * MiB) as out:
            out.write(os.urandom(11 * MiB))
            raise RuntimeError("packing failed")
    assert read_bytes(url) == data and not _pending_uploads(s3, s3_bucket)


@pytest.mark.slow
def test_s3_write_errors_name_the_url(s3, s3_bucket):
    with pytest.raises(StreamError, match="s3://no-such-bucket-wd/x.tar") as info:
        write_bytes("s3://no-such-bucket-wd/x.tar", b"data")
    assert not info.value.transient
    assert not exists("s3://no-such-bucket-wd/x.tar")
    # a URL that names no object (a "folder") is left to s3fs, as before
    assert not isinstance(open_write(f"s3://{s3_bucket}/folder/"), S3Writer)


_PACK_AND_REPORT = """
import json, sys
import multiprocessing.forkserver as forkserver
from wdstream.write.packer import pack

manifest = pack([sys.argv[1]], sys.argv[2], max_count=13, workers=2)
print(json.dumps({
    "forkserver": getattr(forkserver._forkserver, "_forkserver_pid", None) is not None,
    "s3fs": "s3fs" in sys.modules, "aiobotocore": "aiobotocore" in sys.modules,
    "shards": [[s.url, s.sha256] for s in manifest.shards]}))
"""


@pytest.mark.slow
def test_pack_s3_to_s3_forks_its_pool_and_gives_the_local_bytes(tmp_path, s3, s3_bucket,
                                                                 cli_env):
    import zstandard

    plain = write_jsonl(tmp_path / "in.jsonl", records(100))
    zst = tmp_path / "in.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    client = s3.client()
    client.put_object(Bucket=s3_bucket, Key="raw/in.jsonl.zst", Body=zst.read_bytes())
    result = subprocess.run(
        [sys.executable, "-c", _PACK_AND_REPORT, f"s3://{s3_bucket}/raw/in.jsonl.zst",
         f"s3://{s3_bucket}/ds/"], env=cli_env, capture_output=True, timeout=120, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # no fsspec I/O thread in the packer: its workers fork, with botocore already loaded
    assert report == {**report, "forkserver": False, "s3fs": False, "aiobotocore": False}

    run(["pack", zst, "--output", tmp_path / "local", "--max-count", 13, "--quiet"], cli_env)
    local = folder_bytes(tmp_path / "local")
    assert len(report["shards"]) == 8
    for name, sha256 in report["shards"]:
        stored = client.get_object(Bucket=s3_bucket, Key=f"ds/{name}")["Body"].read()
        assert stored == local[name]
        assert _stored_sha256(s3, s3_bucket, f"ds/{name}") == \
            base64.b64encode(bytes.fromhex(sha256)).decode()
    index = client.get_object(Bucket=s3_bucket, Key="ds/index.json")["Body"].read()
    assert json.loads(index)["shards"] == json.loads(local["index.json"])["shards"]
