"""Real local servers for tests: a moto S3 server and a GCS emulator, each a separate process
listening on 127.0.0.1 on a free port.

The process plumbing and the S3 server are the benchmarks' (``benchmarks/local_servers.py``,
standard library only): benchmarks run from a checkout with only the package installed, so
they cannot lean on the test tree, while the tests can import them.
"""

from __future__ import annotations

import http.server
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager

from benchmarks.local_servers import LocalS3, environ, free_port, launch, stop  # noqa: E402

__all__ = ["GcsEmulator", "MotoServer", "environ", "free_port", "http_server"]


class MotoServer(LocalS3):
    """A moto S3 server process (``LocalS3``) whose clients give up after two attempts, so a
    test of a failing server fails fast."""

    def __init__(self, port: int | None = None):
        super().__init__(port, extra_env={"AWS_MAX_ATTEMPTS": "2"})


class GcsEmulator:
    """gcp-storage-emulator in memory, with the environment gcsfs and ``gcloud storage`` need."""

    def __init__(self, bucket: str = "bucket", port: int | None = None):
        self.port = port or free_port()
        self.bucket = bucket
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process = None
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
        os.makedirs(self._config, exist_ok=True)
        self.process = launch(["gcp-storage-emulator", "start", "--host", "127.0.0.1",
                               "--port", str(self.port), "--default-bucket", self.bucket,
                               "--in-memory"], self.port)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
        shutil.rmtree(self._config, ignore_errors=True)


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # http.server's 5 drops a reader's parts opened at once (1 s)


@contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]):
    """``handler`` served on 127.0.0.1 by a thread per connection; yields the base URL."""
    server = _Server(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
