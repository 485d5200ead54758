"""Large manifests parsed once per node (wdstream.shards.shared): one process parses, the others
map its arrays, with the meaning of a private parse; a stale, tampered or planted copy is never
used; sharing can be turned off."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

import wdstream
from wdstream.errors import OptionError
from wdstream.shards import compact, shared
from wdstream.shards.manifest import Manifest, ShardInfo, load_manifest

COUNT = compact.SMALL + 5


def shard_list(count: int = COUNT, samples: int = 7) -> list[ShardInfo]:
    return [ShardInfo(f"part-{i % 2}/shard-{i:06d}.tar", samples + i % 3, 10_240 + i,
                      hashlib.sha256(str(i).encode()).hexdigest() if i % 5 else None,
                      hashlib.md5(str(i).encode()).hexdigest() if i % 3 else None,
                      f"k\u00e9y-{i}" if i % 4 else None) for i in range(count)]


@pytest.fixture
def dataset(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "index.json").write_text(Manifest(shard_list(), extensions=["json"],
                                                extra={"packed": {"by": "test"}}).to_json())
    return folder


@pytest.fixture
def parses(monkeypatch):
    """Counts the large manifests this process parses."""
    count = []
    parse = compact.parse_manifest

    def counting(text):
        count.append(1)
        return parse(text)

    monkeypatch.setattr(compact, "parse_manifest", counting)
    return count


def described(manifest: Manifest) -> str:
    """Everything a manifest says, as one digest."""
    rows = [tuple(vars(s).values()) for s in manifest.shards]
    return hashlib.sha256(json.dumps([rows, manifest.extensions, manifest.extra,
                                      manifest.samples, manifest.bytes,
                                      manifest.fingerprint()]).encode()).hexdigest()


def private(folder) -> Manifest:
    return load_manifest(str(folder), share=False)


def entries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(shared.ENTRY_SUFFIX))


CHILD = textwrap.dedent("""
    import hashlib, json, sys
    import wdstream
    from wdstream.shards import compact
    parsed = []
    parse = compact.parse_manifest
    compact.parse_manifest = lambda text: parsed.append(1) or parse(text)
    ds = wdstream.StreamingDataset(sys.argv[1], share_manifest=sys.argv[2])
    m = ds.manifest
    rows = [tuple(vars(s).values()) for s in m.shards]
    print(json.dumps({"parsed": len(parsed),
                      "mapped": m.shards.mapped_from is not None,
                      "digest": hashlib.sha256(json.dumps([rows, m.extensions, m.extra,
                                m.samples, m.bytes, m.fingerprint()]).encode()).hexdigest(),
                      "url": ds.shards.urls[3], "len": len(ds)}))
""")


@pytest.mark.slow
def test_processes_of_a_node_parse_once_and_map_the_rest(dataset, tmp_path):
    """Four processes started together: one parses and publishes, all four end up with the
    node-local arrays mapped, and each sees what a private parse gives."""
    directory = tmp_path / "shared"
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(dataset), str(directory)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["parsed"] for r in results) == [0, 0, 0, 1]
    assert all(r["mapped"] for r in results)
    expected = private(dataset)
    assert {r["digest"] for r in results} == {described(expected)}
    assert {r["url"] for r in results} == {str(dataset / "part-1/shard-000003.tar")}
    assert len(entries(directory)) == 1
    assert (os.stat(directory).st_mode & 0o777) == 0o700


def test_a_mapped_manifest_reads_as_a_private_one(dataset, tmp_path, parses):
    directory = tmp_path / "shared"
    first = load_manifest(str(dataset), share=directory)
    second = load_manifest(str(dataset), share=directory)
    assert len(parses) == 1 and second.shards.mapped_from is not None
    expected = private(dataset)
    assert described(first) == described(second) == described(expected)
    assert second.url == expected.url and second.base == expected.base
    assert second.shard_url(9) == expected.shard_url(9)
    assert second.to_json() == (dataset / "index.json").read_text()
    plain = wdstream.StreamingDataset(str(dataset), share_manifest=False, seed=4)
    mapped = wdstream.StreamingDataset(str(dataset), share_manifest=directory, seed=4)
    assert mapped.plan(0, 2, 2).stream_spans(1, 1) == plain.plan(0, 2, 2).stream_spans(1, 1)
    assert mapped.fingerprint() == plain.fingerprint()


def corrupt(path, where: str) -> None:
    data = bytearray(path.read_bytes())
    if where == "column":
        data[-100] ^= 1
    elif where == "header":
        at = data.index(b'"text_bytes": ') + len(b'"text_bytes": ')
        data[at] = ord("9") if data[at] != ord("9") else ord("8")
    elif where == "truncated":
        del data[len(data) // 2:]
    elif where == "magic":
        data[0] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["column", "header", "truncated", "magic"])
def test_a_tampered_copy_is_refused_and_parsed_again(dataset, tmp_path, parses, where, caplog):
    directory = tmp_path / "shared"
    load_manifest(str(dataset), share=directory)
    (entry,) = entries(directory)
    corrupt(directory / entry, where)
    again = load_manifest(str(dataset), share=directory)
    assert len(parses) == 2 and "ignored" in caplog.text
    load_manifest(str(dataset), share=directory)  # the copy written again is used
    assert len(parses) == 2
    assert described(again) == described(private(dataset))


def test_a_planted_link_or_a_copy_open_to_others_is_not_used(dataset, tmp_path, parses):
    directory = tmp_path / "shared"
    load_manifest(str(dataset), share=directory)
    (entry,) = entries(directory)
    (directory / entry).chmod(0o666)  # writable by anyone: not trusted
    load_manifest(str(dataset), share=directory)
    assert len(parses) == 2
    (entry,) = entries(directory)
    elsewhere = tmp_path / "elsewhere"
    os.replace(directory / entry, elsewhere)
    os.symlink(elsewhere, directory / entry)
    before = elsewhere.read_bytes()
    again = load_manifest(str(dataset), share=directory)
    assert len(parses) == 3  # not followed
    assert described(again) == described(private(dataset))
    assert not (directory / entry).is_symlink() and elsewhere.read_bytes() == before


def test_a_directory_others_can_write_is_not_used(dataset, tmp_path, parses, caplog):
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o777)
    load_manifest(str(dataset), share=directory)
    load_manifest(str(dataset), share=directory)
    assert len(parses) == 2 and not os.listdir(directory)
    assert "not a directory of this user alone" in caplog.text


def test_a_changed_manifest_is_parsed_again_and_the_old_copy_dropped(dataset, tmp_path,
                                                                      parses):
    directory = tmp_path / "shared"
    load_manifest(str(dataset), share=directory)
    old = entries(directory)
    changed = Manifest(shard_list(samples=9), extensions=["json"]).to_json()
    (dataset / "index.json").write_text(changed)
    fresh = load_manifest(str(dataset), share=directory)
    assert len(parses) == 2 and fresh.to_json() == changed
    assert len(entries(directory)) == 1 and entries(directory) != old


def test_sharing_can_be_turned_off(dataset, tmp_path, parses, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    wdstream.StreamingDataset(str(dataset), share_manifest=False)
    wdstream.StreamingDataset(str(dataset), share_manifest=False)
    assert len(parses) == 2 and not os.listdir(tmp_path / "tmp")
    monkeypatch.setenv(shared.ENVIRONMENT, "0")
    wdstream.StreamingDataset(str(dataset))
    assert len(parses) == 3 and not os.listdir(tmp_path / "tmp")
    monkeypatch.delenv(shared.ENVIRONMENT)
    wdstream.StreamingDataset(str(dataset))  # the default: a directory of this user's in TMPDIR
    wdstream.StreamingDataset(str(dataset))
    assert len(parses) == 4
    top = tmp_path / "tmp" / f"wdstream-{os.getuid()}"
    assert (os.stat(top).st_mode & 0o777) == 0o700 and len(entries(top / "manifests")) == 1
    with pytest.raises(OptionError, match="share_manifest"):
        wdstream.StreamingDataset(str(dataset), share_manifest=3)


def test_a_manifest_on_s3_is_shared_by_its_etag(s3, s3_bucket, tmp_path, parses):
    client = s3.client()
    text = Manifest(shard_list(), extensions=["json"]).to_json()
    client.put_object(Bucket=s3_bucket, Key="d/index.json", Body=text.encode())
    directory = tmp_path / "shared"
    url = f"s3://{s3_bucket}/d/"
    load_manifest(url, share=directory)
    mapped = load_manifest(url, share=directory)
    assert len(parses) == 1 and mapped.to_json() == text
    assert mapped.shard_url(2) == f"s3://{s3_bucket}/d/part-0/shard-000002.tar"
    changed = Manifest(shard_list(samples=9), extensions=["json"]).to_json()
    client.put_object(Bucket=s3_bucket, Key="d/index.json", Body=changed.encode())
    assert load_manifest(url, share=directory).to_json() == changed
    assert len(parses) == 2


def test_small_manifests_are_not_copied(tmp_path, parses):
    folder = tmp_path / "small"
    folder.mkdir()
    (folder / "index.json").write_text(Manifest(shard_list(20)).to_json())
    directory = tmp_path / "shared"
    assert len(load_manifest(str(folder), share=directory).shards) == 20
    assert os.listdir(directory) == []  # not even a lock


def test_workers_stream_a_mapped_manifest_as_a_private_one(tmp_path, monkeypatch):
    """DataLoader workers read through the mapped arrays (inherited by fork) and deliver the
    epoch a private parse gives."""
    from tests.support.shard_data import all_keys, write_dataset

    counts = [5, 7, 6, 4]
    folder = tmp_path / "data"
    write_dataset(folder, counts)
    monkeypatch.setattr(compact, "SMALL", 1)  # arrays (and so sharing) for 4 shards

    def epoch(share):
        dataset = wdstream.StreamingDataset(str(folder), seed=3, share_manifest=share)
        loader = wdstream.DataLoader(dataset, batch_size=4, num_workers=2)
        return dataset, [k for batch in loader for k in batch["__key__"]]

    directory = tmp_path / "shared"
    _, expected = epoch(False)
    epoch(directory)
    dataset, keys = epoch(directory)
    assert dataset.manifest.shards.mapped_from is not None
    assert keys == expected and set(keys) == all_keys(counts)


def test_a_default_directory_others_may_enter_is_not_used(dataset, tmp_path, parses,
                                                           monkeypatch, caplog):
    """The default directory sits in a temporary directory everyone shares: one that someone
    made beforehand, open to others, is not trusted."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    top = tmp_path / "tmp" / f"wdstream-{os.getuid()}"
    top.mkdir(parents=True)
    top.chmod(0o755)
    load_manifest(str(dataset), share=True)
    load_manifest(str(dataset), share=True)
    assert len(parses) == 2 and not os.listdir(top)
    assert "not a directory of this user alone" in caplog.text
