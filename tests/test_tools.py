"""tools/upload-shards.sh and tools/local-s3.sh, run with bash against a real moto server, the
real ``aws`` CLI (wrapped to inject failures) and, for gs://, a stand-in ``gcloud`` that talks to
the GCS emulator through gcsfs (the emulator rejects the real CLI's uploads)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import free_port

TOOLS = Path(__file__).resolve().parent.parent / "tools"
UPLOAD = TOOLS / "upload-shards.sh"
LOCAL_S3 = TOOLS / "local-s3.sh"


def packed_folder(path: Path, shards: int = 3) -> Path:
    from wdstream.write.packer import pack

    source = path.parent / f"{path.name}.jsonl"
    source.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(shards * 2)))
    pack([str(source)], str(path), max_count=2)
    return path


def tool_env(cli_env: dict, tmp_path: Path, **extra) -> dict:
    """The test environment with tmp_path/bin first on PATH (for stand-in commands)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    return {**cli_env, "PATH": f"{bin_dir}{os.pathsep}{cli_env['PATH']}", "UPLOAD_BACKOFF": "0",
            **extra}


def install(tmp_path: Path, name: str, text: str) -> Path:
    script = tmp_path / "bin" / name
    script.write_text(text)
    script.chmod(0o755)
    return script


# An aws wrapper: logs every call, fails the first upload of shard-000001.tar (FAIL_ONCE) or
# uploads an empty file instead of shard-000000.tar (TRUNCATE), else runs the real aws.
AWS_WRAPPER = """#!/usr/bin/env bash
echo "$*" >> "$AWS_CALL_LOG"
if [[ $1 == s3 && $2 == cp ]]; then
    args=("$@")
    source=${args[$# - 2]}
    if [[ ${FAIL_ONCE:-} && $source == *shard-000001.tar && ! -e $FAIL_ONCE ]]; then
        touch "$FAIL_ONCE"
        echo "simulated network failure" >&2
        exit 1
    fi
    if [[ ${TRUNCATE:-} && $source == *shard-000000.tar ]]; then
        : > "$TRUNCATE"
        args[$# - 2]=$TRUNCATE
        set -- "${args[@]}"
    fi
fi
exec "$REAL_AWS" "$@"
"""


def object_sizes(s3, bucket: str, prefix: str) -> dict[str, int]:
    listing = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {item["Key"][len(prefix):]: item["Size"] for item in listing.get("Contents", [])}


@pytest.mark.slow
def test_upload_to_s3_retries_and_puts_the_manifest_last(tmp_path, s3, s3_bucket, cli_env):
    folder = packed_folder(tmp_path / "ds", shards=2)
    log = tmp_path / "aws.log"
    env = tool_env(cli_env, tmp_path, AWS_CALL_LOG=str(log), FAIL_ONCE=str(tmp_path / "failed"),
                   REAL_AWS=shutil.which("aws"))
    install(tmp_path, "aws", AWS_WRAPPER)
    result = subprocess.run(["bash", UPLOAD, "-j", "3", folder, f"s3://{s3_bucket}/ds"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "shard-000001.tar: attempt 1 failed, retrying" in result.stderr
    local = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert object_sizes(s3, s3_bucket, "ds/") == local
    calls = log.read_text().splitlines()
    assert calls[-1].startswith("s3 cp") and calls[-1].endswith(f"s3://{s3_bucket}/ds/index.json")
    assert sum(call.startswith("s3 cp") for call in calls) == len(local) + 1  # one retry
    assert any(call.startswith("s3 ls") for call in calls)  # sizes checked in one listing


def test_upload_withholds_the_manifest_when_a_size_is_wrong(tmp_path, s3, s3_bucket, cli_env):
    folder = packed_folder(tmp_path / "ds", shards=2)
    env = tool_env(cli_env, tmp_path, AWS_CALL_LOG=str(tmp_path / "aws.log"),
                   TRUNCATE=str(tmp_path / "empty.tar"), REAL_AWS=shutil.which("aws"))
    install(tmp_path, "aws", AWS_WRAPPER)
    result = subprocess.run(["bash", UPLOAD, folder, f"s3://{s3_bucket}/ds/"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "shard-000000.tar" in result.stderr and "index.json not uploaded" in result.stderr
    assert "index.json" not in object_sizes(s3, s3_bucket, "ds/")


def test_upload_gives_up_after_the_attempts(tmp_path, s3, s3_bucket, cli_env):
    folder = packed_folder(tmp_path / "ds", shards=1)
    env = tool_env(cli_env, tmp_path)
    install(tmp_path, "aws", "#!/usr/bin/env bash\necho 'access denied' >&2\nexit 1\n")
    result = subprocess.run(["bash", UPLOAD, "-r", "2", folder, f"s3://{s3_bucket}/ds/"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "failed after 2 attempts" in result.stderr and "access denied" in result.stderr
    assert object_sizes(s3, s3_bucket, "ds/") == {}


STAND_IN_GCS_CLI = """#!{python}
# Stand-in for `gcloud storage cp FILE gs://...` / `gsutil -q cp FILE gs://...` and
# `gcloud storage ls -l gs://.../` / `gsutil ls -l gs://.../`, printing what they print, through
# the emulator's JSON API (the emulator rejects the real CLIs' uploads). urllib rather than
# gcsfs: it starts in a fraction of the time.
import json, os, sys, urllib.parse, urllib.request
endpoint = os.environ["STORAGE_EMULATOR_HOST"]
command = [arg for arg in sys.argv[1:] if arg != "-q"]
if os.path.basename(sys.argv[0]) == "gsutil":
    command = ["storage", *command]
bucket, _, key = command[-1].removeprefix("gs://").partition("/")
if command[:2] == ["storage", "cp"]:
    with open(command[2], "rb") as file:
        data = file.read()
    name = urllib.parse.quote(key, safe="")
    urllib.request.urlopen(urllib.request.Request(
        f"{{endpoint}}/upload/storage/v1/b/{{bucket}}/o?uploadType=media&name={{name}}",
        data=data, method="POST", headers={{"Content-Type": "application/octet-stream"}}))
elif command[:3] == ["storage", "ls", "-l"]:
    query = urllib.parse.urlencode({{"prefix": key, "delimiter": "/"}})
    listing = json.load(urllib.request.urlopen(f"{{endpoint}}/storage/v1/b/{{bucket}}/o?{{query}}"))
    items = listing.get("items", [])
    for item in items:
        print(f"{{item['size']:>10}}  2026-01-01T00:00:00Z  gs://{{bucket}}/{{item['name']}}")
    print(f"TOTAL: {{len(items)}} objects")
else:
    sys.exit(f"stand-in gcloud: unexpected {{command}}")
"""


@pytest.mark.parametrize("cli", ["gcloud", "gsutil"])
def test_upload_to_gcs(tmp_path, gcs, cli_env, cli):
    import gcsfs

    folder = packed_folder(tmp_path / "ds", shards=1)
    env = tool_env(cli_env, tmp_path, UPLOAD_GCS_CLI=cli, **gcs.env)
    install(tmp_path, cli, STAND_IN_GCS_CLI.format(python=sys.executable))
    result = subprocess.run(["bash", UPLOAD, folder, f"gs://bucket/{cli}/"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    fs = gcsfs.GCSFileSystem(endpoint_url=gcs.endpoint, token="anon")
    remote = {e["name"].rsplit("/", 1)[1]: e["size"] for e in fs.ls(f"bucket/{cli}", detail=True)}
    assert remote == {p.name: p.stat().st_size for p in folder.iterdir()}


def test_upload_usage_errors(tmp_path, cli_env):
    for args in ([], [str(tmp_path)], [str(tmp_path), "/local/dest"],
                 [str(tmp_path / "missing"), "s3://bucket/x/"]):
        result = subprocess.run(["bash", UPLOAD, *args], env=cli_env, capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 2, args
        assert "usage" in result.stderr or "upload-shards:" in result.stderr
    result = subprocess.run(["bash", UPLOAD, str(tmp_path), "s3://bucket/x/"], env=cli_env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "no *.tar files" in result.stderr


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _exports(text: str) -> dict[str, str]:
    lines = [line.removeprefix("export ") for line in text.splitlines() if line.startswith("export ")]
    return dict(line.split("=", 1) for line in lines)


def test_local_s3_in_the_background(tmp_path, cli_env):
    port = free_port()
    pid_file = tmp_path / "s3.pid"
    result = subprocess.run(
        ["bash", LOCAL_S3, "--background", "--pid-file", pid_file, "--bucket", "demo", str(port)],
        env=cli_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    pid = int(pid_file.read_text())
    try:
        exports = _exports(result.stdout)
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        env = {**cli_env, **exports}
        listing = subprocess.run(["aws", "s3", "ls"], env=env, capture_output=True, text=True,
                                 check=True, timeout=60)
        assert "demo" in listing.stdout
    finally:
        os.kill(pid, signal.SIGTERM)


def test_local_s3_in_the_foreground_stops_on_ctrl_c(cli_env):
    port = free_port()
    process = subprocess.Popen(["bash", LOCAL_S3, str(port)], env=cli_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(4)]
        assert lines[0] == f"export AWS_ENDPOINT_URL=http://127.0.0.1:{port}\n"
        assert _listening(port)
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                              aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name="us-east-1")
        assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["wdstream"]
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert not _listening(port)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("args", [["--bucket"], ["--nope"], ["1", "2"], ["--bucket", "A!"]])
def test_local_s3_usage_errors(args, cli_env):
    result = subprocess.run(["bash", LOCAL_S3, *args], env=cli_env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "usage" in result.stderr or "bad bucket name" in result.stderr
