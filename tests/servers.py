"""Real local servers for tests and benchmarks: a moto S3 server and a GCS emulator, each a
separate process listening on 127.0.0.1 on a free port."""

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


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class MotoServer:
    """A moto S3 server process. ``env`` is what a client needs (endpoint, fake credentials);
    ``restart()`` stops and starts it on the same port (its buckets are lost)."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._config = tempfile.mkdtemp(prefix="wdstream-aws-")
        Path(self._config, "config").write_text("[default]\nregion = us-east-1\n")
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(Path(self._config, "config")),
            "AWS_SHARED_CREDENTIALS_FILE": str(Path(self._config, "credentials")),
            "AWS_MAX_ATTEMPTS": "2",
        }

    def start(self) -> MotoServer:
        moto = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
        self.process = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


class GcsEmulator:
    """gcp-storage-emulator in memory, with the environment gcsfs and ``gcloud storage`` need."""

    def __init__(self, bucket: str = "bucket", port: int | None = None):
        self.port = port or free_port()
        self.bucket = bucket
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._config = tempfile.mkdtemp(prefix="wdstream-gcloud-")
        self.env = {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "CLOUDSDK_CONFIG": self._config,
            "CLOUDSDK_CORE_PROJECT": "test",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": self.endpoint + "/",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "BOTO_CONFIG": "/dev/null",
        }

    def start(self) -> GcsEmulator:
        exe = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable))
        self.process = subprocess.Popen(
            [exe or "gcp-storage-emulator", "start", "--host", "127.0.0.1",
             "--port", str(self.port), "--default-bucket", self.bucket, "--in-memory"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


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
