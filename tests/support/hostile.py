"""Helpers for the hostile-dataset tests: a dataset whose manifest names what it should not,
a file outside it holding a secret, a marker a command would create, a local HTTP server that
records every request, and the installed ``wdstream`` command run with a timeout."""

from __future__ import annotations

import http.server
import io
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.shard_data import write_dataset
from wdstream.shards.tar_writer import TarWriter

SECRET = "TOP-SECRET-4242"
TIME_LIMIT = 20.0  # seconds a call of ``in_child`` may take
MEMORY_LIMIT = 1 << 30  # bytes its child may map beyond what the test process had
COUNTS = [3, 3]


def secret_shard(count: int = 3) -> bytes:
    """A valid shard whose samples carry SECRET: if it is ever read, SECRET shows in output."""
    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for index in range(count):
        writer.add(f"leak{index:03d}.txt", f"{SECRET} {index}".encode())
    writer.close()
    return buffer.getvalue()


@dataclass
class Scene:
    """Where everything is: ``dataset`` (a folder with index.json), ``outside`` (a shard
    outside it with the secret), ``marker`` (what a command from data would create),
    ``http`` (a server's base URL) and ``requests`` (the paths it was asked for)."""

    root: Path
    dataset: Path
    outside: Path
    marker: Path
    http: str
    requests: list

    @property
    def manifest(self) -> Path:
        return self.dataset / "index.json"

    def set_entry(self, url, *, index: int = 1) -> None:
        """Make shard ``index`` of the manifest name ``url`` (sized as the outside shard)."""
        doc = json.loads(self.manifest.read_text())
        shard = doc["shards"][index]
        doc["bytes"] += self.outside.stat().st_size - shard["bytes"]
        shard.update(url=url, bytes=self.outside.stat().st_size, sha256=None)
        self.manifest.write_text(json.dumps(doc))

    def assert_untouched(self, *outputs: str) -> None:
        """No command ran, the HTTP server was never asked, the secret never shown."""
        assert not self.marker.exists(), "a command from the data ran"
        assert self.requests == [], f"the HTTP server was contacted: {self.requests}"
        for text in outputs:
            assert SECRET not in text, "a file outside the dataset was read"


class _Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # the http.server name
        self.server.requests.append(self.path)
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@contextmanager
def hostile_scene(tmp_path: Path):
    """The Scene under ``tmp_path``, its HTTP server stopped at the end of the block (the
    ``scene`` fixture of conftest.py)."""
    dataset = tmp_path / "ds"
    write_dataset(dataset, COUNTS)
    outside = tmp_path / "outside" / "shard.tar"
    outside.parent.mkdir()
    outside.write_bytes(secret_shard())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.requests, server.body = [], outside.read_bytes()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    try:
        yield Scene(tmp_path, dataset, outside, tmp_path / "PWNED",
                    f"http://127.0.0.1:{server.server_address[1]}", server.requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def wdstream(*args, code=0, cwd=None, env=None, timeout=60):
    """Run the installed command; check its exit code and that no traceback leaked."""
    exe = shutil.which("wdstream", path=os.path.dirname(sys.executable)) or "wdstream"
    result = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                            env=env, timeout=timeout, errors="surrogateescape")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    return result


def commands(marker) -> dict[str, str]:
    """A command creating ``marker``, as a value names it: plainly, as one name of a brace
    pattern, or cut by braces so that only the expansion spells ``pipe:``."""
    return {"plain": f"pipe:touch {marker}",
            "braces": f"{{pipe:touch {marker},shard-000000.tar}}",
            "spelled": f"{{p,x}}ipe:touch {marker}"}


def in_child(function, time_limit: float = TIME_LIMIT, memory: int = MEMORY_LIMIT
             ) -> tuple[str, str]:
    """``function()`` in a forked child with a time limit and a memory limit (``memory``
    bytes beyond what the process maps): ("ok", what it returned) or (the exception's class
    name, its message); a child still running after ``time_limit`` seconds fails the test."""
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child():
        with open("/proc/self/status") as status:
            vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + memory, vm + memory))
        try:
            send.send(("ok", function()))
        except BaseException as error:  # handed to the test
            send.send((type(error).__name__, str(error)[:4000]))

    process = multiprocessing.get_context("fork").Process(target=child, daemon=True)
    process.start()
    try:
        assert receive.poll(time_limit), f"still running after {time_limit} s"
        return receive.recv()
    finally:
        process.kill()
        process.join()
