"""Real local servers for benchmarks and tests: processes listening on 127.0.0.1 on a free
port, and ``LocalS3``, a moto S3 server with the environment its clients need.

Standard library only (boto3 is imported by ``client()``), so that the test suite can import
it too (``tests/support/servers.py``) without the benchmarks' other dependencies.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no server on 127.0.0.1:{port} after {timeout}s")


def launch(command: list[str], port: int) -> subprocess.Popen:
    """Start a server process (its output discarded) and wait until it listens on ``port``.
    ``command[0]`` is looked up beside this interpreter first (a virtualenv's scripts)."""
    exe = shutil.which(command[0], path=os.path.dirname(sys.executable)) or command[0]
    process = subprocess.Popen([exe, *command[1:]], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
    except BaseException:
        stop(process)
        raise
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def environ(values: dict[str, str]):
    """Set environment variables for the duration of a block."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# moto reads an object's whole value for every GET, whatever its range (about 60 ms of CPU for
# 100 MB here): a cost S3 does not have, which punishes ranged reads. With ``whole_once`` the
# server keeps each value as one bytes object, read from its buffer once (a write drops it),
# so that a ranged GET costs moto its range, as it costs S3.
_MOTO_WHOLE_ONCE = (
    "import sys\n"
    "from moto.s3 import models\n"
    "_value = models.FakeKey.value\n"
    "def _get(self):\n"
    "    whole = self.__dict__.get('_whole_value')\n"
    "    if whole is None:\n"
    "        whole = self.__dict__['_whole_value'] = _value.fget(self)\n"
    "    return whole\n"
    "def _set(self, new):\n"
    "    self.__dict__.pop('_whole_value', None)\n"
    "    _value.fset(self, new)\n"
    "models.FakeKey.value = property(_get, _set)\n"
    "from moto.server import main\n"
    "sys.argv[0] = 'moto_server'\n"
    "main()\n"
)


class LocalS3:
    """A moto S3 server process. ``env`` is what a client needs (endpoint, fake credentials,
    plus ``extra_env``); ``restart()`` stops and starts it on the same port (its buckets are
    lost). ``whole_once``: each object's value read once, not on every GET (see above). As a
    context manager it is started and, at the end, stopped."""

    def __init__(self, port: int | None = None, extra_env: dict[str, str] | None = None,
                 whole_once: bool = False):
        self.whole_once = whole_once
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._config = tempfile.mkdtemp(prefix="wdstream-aws-")  # removed by stop()
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(Path(self._config, "config")),
            "AWS_SHARED_CREDENTIALS_FILE": str(Path(self._config, "credentials")),
            **(extra_env or {}),
        }

    def start(self) -> LocalS3:
        os.makedirs(self._config, exist_ok=True)
        Path(self._config, "config").write_text("[default]\nregion = us-east-1\n")
        args = ["-H", "127.0.0.1", "-p", str(self.port)]
        command = [sys.executable, "-c", _MOTO_WHOLE_ONCE, *args] if self.whole_once \
            else ["moto_server", *args]
        self.process = launch(command, self.port)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
        shutil.rmtree(self._config, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, folder: str | Path, bucket: str, prefix: str) -> str:
        """Upload every file of ``folder`` under ``s3://bucket/prefix/`` (the bucket is created
        if need be); returns that URL."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                key = f"{prefix}/{path.name}"
                client.upload_file(str(path), bucket, key)
                if self.whole_once:
                    # the server reads a value whole on its first GET (about 0.3 s of its CPU
                    # for 100 MB): paid here, not by the first case that reads the object
                    client.get_object(Bucket=bucket, Key=key, Range="bytes=0-0")["Body"].read()
        return f"s3://{bucket}/{prefix}/"


# gcp-storage-emulator answers one request at a time (http.server.HTTPServer): a ranged GET
# waits until the response before it has been written, so no two parts are served at once.
# The benchmarks' emulator is the same code on a thread per connection, as a store serves,
# with a listen backlog of 128 rather than http.server's 5: a loader's workers open 16 or more
# connections at once, and a connection dropped from a full backlog is retried by the kernel
# 1 s later, which alone made a GCS first batch take 1.2 s at times.
_THREADED_EMULATOR = (
    "import sys, http.server\n"
    "http.server.HTTPServer = http.server.ThreadingHTTPServer\n"
    "http.server.ThreadingHTTPServer.daemon_threads = True\n"
    "http.server.ThreadingHTTPServer.request_queue_size = 128\n"
    "from gcp_storage_emulator.__main__ import main\n"
    "sys.argv[0] = 'gcp-storage-emulator'\n"
    "main()\n"
)


class LocalGcs:
    """A gcp-storage-emulator process in memory, quiet, one thread per connection
    (``threaded``; else as the command runs it). ``env`` is what gcsfs and wdstream's GCS
    reader need. As a context manager it is started and, at the end, stopped."""

    def __init__(self, bucket: str = "bucket", port: int | None = None, threaded: bool = True):
        self.port = port or free_port()
        self.bucket, self.threaded = bucket, threaded
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.env = {"STORAGE_EMULATOR_HOST": self.endpoint,
                    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def start(self) -> LocalGcs:
        args = ["start", "--host", "127.0.0.1", "--port", str(self.port), "--default-bucket",
                self.bucket, "--in-memory", "--quiet"]
        command = [sys.executable, "-c", _THREADED_EMULATOR, *args] if self.threaded \
            else ["gcp-storage-emulator", *args]
        self.process = launch(command, self.port)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)

    def __enter__(self) -> LocalGcs:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def upload(self, folder: str | Path, prefix: str) -> str:
        """Upload every file of ``folder`` under ``gs://bucket/prefix/``; returns that URL."""
        import urllib.parse

        import urllib3

        http = urllib3.PoolManager()
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                query = urllib.parse.urlencode({"uploadType": "media",
                                                "name": f"{prefix}/{path.name}"})
                response = http.request(
                    "POST", f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?{query}",
                    body=path.read_bytes())
                if response.status != 200:
                    raise RuntimeError(f"upload of {path.name}: HTTP {response.status}")
        return f"gs://{self.bucket}/{prefix}/"
