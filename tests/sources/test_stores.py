"""The stores: ``store_for`` picks one per scheme, each does the same operations its own way."""

from __future__ import annotations

import os

import pytest

from wdstream.errors import InputError
from wdstream.sources.stores import store_for
from wdstream.sources.stores.s3 import S3Store
from wdstream.sources.writers import LocalWriter


@pytest.mark.parametrize("url, kind", [
    ("/data/x.tar", "LocalStore"), ("file:///data/x.tar", "LocalStore"),
    ("pipe:cat x.tar", "PipeStore"), ("s3://b/x.tar", "S3Store"), ("s3a://b/x.tar", "S3Store"),
    ("gs://b/x.tar", "GcsStore"), ("gcs://b/x.tar", "GcsStore"), ("memory://x", "FsspecStore"),
    ("https://host/x.tar", "HttpStore"),
])
def test_one_store_per_scheme_picked_once(url, kind):
    store = store_for(url)
    assert type(store).__name__ == kind
    assert store_for(url) is store  # stores hold no state: one per scheme


def test_capabilities_say_what_callers_check():
    local, pipe, s3, other = (store_for(u) for u in ("x.tar", "pipe:true", "s3://b/k", "memory://k"))
    assert (local.local, local.remote, local.runs_command) == (True, False, False)
    assert (pipe.local, pipe.remote, pipe.runs_command) == (False, False, True)
    assert (s3.buckets, s3.chains_names, s3.version_fields) == (True, False, ("ETag", "etag"))
    assert (other.buckets, other.chains_names, other.version_fields) == (False, True, ())
    assert store_for("http://h/x").paths_are_urls and not other.paths_are_urls


def test_a_pipe_is_read_and_nothing_else(tmp_path):
    store = store_for("pipe:printf abc")
    with store.open_read("pipe:printf abc") as stream:
        assert stream.read() == b"abc"
    assert store.version("pipe:printf abc") is None
    with pytest.raises(InputError, match="cannot write to a pipe"):
        store.open_write("pipe:cat > x", "auto")
    for operation in (store.exists, store.size, store.delete, store.list):
        with pytest.raises(InputError, match="not a stored object"):
            operation("pipe:printf abc")


def test_a_local_folder_is_listed_with_sizes(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"12345")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.tar").write_bytes(b"12")
    store = store_for(str(tmp_path))
    top = {e["name"]: (e["type"], e["size"]) for e in store.list(str(tmp_path) + "/")}
    assert top == {f"{tmp_path}/a.tar": ("file", 5), f"{tmp_path}/sub": ("directory", 0)}
    everything = {e["name"]: e["size"] for e in store.list(str(tmp_path), recursive=True)}
    assert everything == {f"{tmp_path}/a.tar": 5, f"{tmp_path}/sub/b.tar": 2}


def test_a_local_version_changes_with_the_file_and_a_folder_has_none(tmp_path):
    path = tmp_path / "x.tar"
    path.write_bytes(b"one")
    store = store_for(str(path))
    before = store.version(str(path))
    assert before["size"] == 3 and before["inode"] == os.stat(path).st_ino
    path.write_bytes(b"other")
    assert store.version(str(path)) != before
    assert store.version(str(tmp_path)) is None and store.version(str(tmp_path / "no")) is None
    assert isinstance(store.open_write(str(tmp_path / "w.tar"), "auto"), LocalWriter)


def test_s3_describes_versions_lists_and_deletes_with_its_own_client(s3, s3_bucket):
    url = f"s3://{s3_bucket}/p/x.tar"
    store = store_for(url)
    assert isinstance(store, S3Store) and store.quick_size(url) is None
    with store.open_write(url, "auto") as out:
        out.write(b"abcdef")
    version = store.version(url)
    assert version["size"] == 6 and version["ETag"]
    described, start = store.head_and_start(url, 4)
    assert start == b"abcd" and described["ETag"] == version["ETag"]
    assert store.quick_size(url) == 6 and store.exists(url)
    assert [(e["name"], e["size"]) for e in store.list(f"s3://{s3_bucket}/", recursive=True)] \
        == [(f"{s3_bucket}/p/x.tar", 6)]
    assert store.folder_path(f"s3://{s3_bucket}/p/") == f"{s3_bucket}/p"
    store.delete(url)
    assert not store.exists(url) and store.version(url) is None
