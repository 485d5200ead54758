"""Cloud clients, one per process and environment: botocore's S3 client and fsspec
filesystems (s3fs, gcsfs, any other), and the fsspec read source."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from wdstream.sources.bodies import CHUNK_SIZE, BodySource

_clients: dict[tuple, object] = {}
_clients_lock = threading.RLock()  # a make() may ask for another client (s3_ranges)


def _free_lock_in_child() -> None:
    """A forked process (a DataLoader worker) starts with the lock free: a thread of its
    parent, a body's reader connecting, may hold it at the fork, and no thread of the
    child would ever release it."""
    global _clients_lock
    _clients_lock = threading.RLock()


os.register_at_fork(after_in_child=_free_lock_in_child)

# Settings that change which client we need: a new one is made when one of them changes.
_CLIENT_SETTINGS = {
    "s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_DEFAULT_REGION",
           "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
           "AWS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
           "https_proxy", "no_proxy"),
    "gs": ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
           "CLOUDSDK_CONFIG"),
}


def cached_client(kind: str, scheme: str, timeout: float, make: Callable[[], object]):
    """One client per process (clients do not survive a fork), kind, timeout and environment."""
    key = (os.getpid(), kind, timeout, tuple(os.environ.get(n) for n in _CLIENT_SETTINGS[scheme]))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = make()
    return client


def s3_client(timeout: float):
    """The process's botocore S3 client with connect and read timeouts of ``timeout``.

    botocore resolves the endpoint (``AWS_ENDPOINT_URL``), region and credentials the usual way.
    """

    def make():
        import botocore.config

        # Uploads (s3_objects) always carry a signed checksum header: their bodies need not
        # be hashed once more for the signature, also over plain HTTP.
        config = botocore.config.Config(
            connect_timeout=timeout, read_timeout=timeout, max_pool_connections=32,
            s3={"payload_signing_enabled": False},
        )
        return _botocore_session().create_client("s3", config=config)

    return cached_client("botocore", "s3", timeout, make)


def s3_ca_bundle() -> str | None:
    """The CA bundle botocore checks S3's certificates with (``AWS_CA_BUNDLE``, the config's
    ``ca_bundle``, else its default), for the ranged reader's presigned GETs."""
    from botocore.httpsession import get_cert_path

    with _clients_lock:
        session = _botocore_session()
    return session.get_config_variable("ca_bundle") or get_cert_path(True)


_sessions: dict[tuple, object] = {}


def _botocore_session():
    """A botocore session per environment (called with ``_clients_lock`` held).

    Unlike clients, sessions are kept across a fork: a session holds no connection, only the
    loaded service models and the resolved configuration, so a DataLoader worker makes its
    client from the session the main process already loaded (the manifest read) rather than
    parse the S3 model again (docs/decisions.md)."""
    import botocore.session

    key = tuple(os.environ.get(n) for n in _CLIENT_SETTINGS["s3"])
    session = _sessions.get(key)
    if session is None:
        session = _sessions[key] = botocore.session.Session()
    return session


def filesystem(url: str, timeout: float = 60.0):
    """``(fs, path)`` for an fsspec URL: its store's (``Store.filesystem``).

    Listing caches are off: a shard written meanwhile, by us or by another process, must show
    up. s3fs and gcsfs instances are cached here rather than by fsspec so that a changed
    endpoint or identity in the environment gets a new one; s3fs gets botocore timeouts of
    ``timeout``.
    """
    from wdstream.sources.stores import store_for  # the stores make them with this module

    return store_for(url).filesystem(url, timeout)



class FsspecSource(BodySource):
    def __init__(self, url: str, start: int, timeout: float):
        self.url, self.start, self.timeout = url, start, timeout

    def run(self, put):
        fs, path = filesystem(self.url, self.timeout)
        with fs.open(path, "rb") as file:
            if self.start:
                file.seek(self.start)
            while chunk := file.read(CHUNK_SIZE):
                if not put(chunk):
                    return

