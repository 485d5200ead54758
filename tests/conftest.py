"""Shared fixtures: real S3 (moto server) and GCS (gcp-storage-emulator) processes on
127.0.0.1, their client environment applied to this process and to subprocesses, small
generated datasets, and a count of the tar reader's block scans."""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import socket
import sys
import threading

import pytest

from tests.support.servers import GcsEmulator, MotoServer, environ

_bucket_numbers = itertools.count()

# gcsfs reads this once, when a test first imports it: its experimental bucket-type lookup
# (gRPC) cannot reach an emulator and waits 60 s a call
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")



def _installed(distribution: str) -> bool:
    """Whether a distribution is installed (by its metadata: tests/axolotl/ on sys.path
    would pass for an importable "axolotl")."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# tests/axolotl/ runs in tox's "axolotl" env, which installs axolotl; elsewhere it is skipped
collect_ignore = [] if _installed("axolotl") else ["axolotl"]


@pytest.fixture
def single_rank(monkeypatch):
    """One process, not a rank of a job: no RANK / WORLD_SIZE from the environment."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.fixture
def scene(tmp_path):
    """A dataset whose manifest tests make name what it should not, with a secret outside it
    and a recording HTTP server (``hostile.Scene``)."""
    from tests.support.hostile import hostile_scene

    with hostile_scene(tmp_path) as scene:
        yield scene


@pytest.fixture(scope="session")
def moto_server():
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3(moto_server):
    """The moto server with its client environment set in os.environ (and so inherited by
    subprocesses such as ``wdstream`` and ``aws``)."""
    with environ(moto_server.env):
        yield moto_server


@pytest.fixture
def s3_bucket(s3):
    """A fresh, empty bucket name on the moto server."""
    return s3.create_bucket(f"test-bucket-{next(_bucket_numbers)}-{os.getpid()}")


@pytest.fixture(scope="session")
def gcs_emulator():
    server = GcsEmulator().start()
    yield server
    server.stop()


@pytest.fixture
def gcs(gcs_emulator):
    """The GCS emulator with the environment for gcsfs and ``gcloud storage`` set."""
    with environ(gcs_emulator.env):
        yield gcs_emulator


@pytest.fixture
def cli_env():
    """The environment for running the installed ``wdstream`` command in a subprocess."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture
def silent_endpoint():
    """An HTTP endpoint that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    server.settimeout(0.1)
    connections, done = [], threading.Event()

    def accept():
        while not done.is_set():
            try:
                connections.append(server.accept()[0])
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    done.set()
    thread.join()
    for connection in connections:
        connection.close()
    server.close()


@pytest.fixture
def scanned(monkeypatch) -> list[int]:
    """The members each block scan of the tar reader gave (0: it gave none)."""
    from wdstream.shards import tar_reader

    counts: list[int] = []
    real_scan = tar_reader.scan_members

    def counted(*args, **kwargs):
        found = real_scan(*args, **kwargs)
        counts.append(len(found[0]) if found else 0)
        return found

    monkeypatch.setattr(tar_reader, "scan_members", counted)
    return counts
