"""wdstream groups tar members into samples exactly as webdataset (the installed package) does,
on shards written by GNU tar in each of its formats, Python's tarfile (PAX, UTF-8 names) and
webdataset's own TarWriter and ShardWriter: same keys, same extensions, same bytes, and the
members webdataset skips (no key.ext name, hidden basenames, __meta__ names, directories)
skipped and counted, never fatal."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile

import pytest

webdataset = pytest.importorskip("webdataset")

from wdstream.inspection import read_samples, verify  # noqa: E402
from wdstream.shards.index_shards import index_shard  # noqa: E402
from wdstream.shards.samples import StrayCount  # noqa: E402

LONG = "deep/" + "d" * 60 + "/" + "n" * 70  # over 100 bytes: ustar prefix or GNU/PAX names
NAMES = [
    "README",  # no extension: skipped
    ".hidden",  # hidden: skipped
    "__meta__",  # webdataset's metadata names: skipped
    "__info__/x.txt",
    "a.json", "a.txt",
    "b.tar.gz.JSON", "b.TXT",  # extensions are lowercased; the key ends at the first dot
    "dir.with.dots/c.json", "dir.with.dots/c.cls",
    "./d.txt", "./d.json",  # a ./ prefix stays in the key, as webdataset keeps it
    "sub/.hidden.txt",  # webdataset's rule makes this the key "sub/" (kept, as it does)
    "e.seg.000.npy", "e.json",
    "noext/f", "g.txt",
    LONG + ".json", LONG + ".txt",
    "h.txt", "h.json",
]
UTF8_NAMES = ["é/ü.txt", "é/ü.json", "日本.txt", "日本.json"]


def payload(name: str) -> bytes:
    return f"<{name}>".encode()


def write_tree(root, names) -> None:
    for name in names:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(payload(name))


def webdataset_samples(path) -> list[dict]:
    dataset = webdataset.WebDataset(str(path), shardshuffle=False, empty_check=False)
    return [{k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")}
            for sample in dataset]


def wdstream_samples(path) -> list[dict]:
    return [{k: v for k, v in sample.items() if k != "__url__"}
            for sample in read_samples(str(path))]


def assert_same(path) -> None:
    expected = webdataset_samples(path)
    assert expected, "webdataset found no samples"
    assert wdstream_samples(path) == expected


GNU_FORMATS = ["gnu", "oldgnu", "pax", "posix", "ustar", "v7"]


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar not installed")
@pytest.mark.parametrize("fmt", GNU_FORMATS)
def test_gnu_tar_formats(tmp_path, fmt):
    names = [n for n in NAMES if fmt != "v7" or len(n) < 100]
    if fmt in ("gnu", "pax", "posix"):
        names += UTF8_NAMES
    tree = tmp_path / "tree"
    write_tree(tree, names)
    members = ["sub", *names]  # a directory entry too
    shard = tmp_path / f"{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", "--no-recursion", "-cf", shard, "-C", tree,
                    *members], check=True)
    assert_same(shard)
    strays = StrayCount()
    info, _ = index_shard(str(shard), strays=strays)
    assert info.samples == len(webdataset_samples(shard))
    assert strays.count == 5  # README .hidden __meta__ __info__/x.txt noext/f
    gz = tmp_path / f"{fmt}.tar.gz"
    gz.write_bytes(gzip.compress(shard.read_bytes()))
    assert wdstream_samples(gz) == webdataset_samples(gz)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_python_tarfile(tmp_path, fmt):
    shard = tmp_path / "py.tar"
    names = NAMES + UTF8_NAMES if fmt != tarfile.USTAR_FORMAT else NAMES
    with tarfile.open(shard, "w", format=fmt, encoding="utf-8") as tar:
        for name in names:
            data = payload(name)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            if fmt == tarfile.PAX_FORMAT:
                info.pax_headers = {"comment": "x" * 200}
            tar.addfile(info, io.BytesIO(data))
    assert_same(shard)


def test_webdataset_writers(tmp_path):
    keys = ["plain", "with.dot", "UPPER", "dir/inner", "x" * 150]
    shard = tmp_path / "tw.tar"
    with webdataset.TarWriter(str(shard)) as writer:
        for key in keys:
            writer.write({"__key__": key, "txt": f"t {key}", "json": {"k": key},
                          "seg.CLS": b"3"})
    assert_same(shard)
    pattern = str(tmp_path / "sw-%06d.tar")
    with webdataset.ShardWriter(pattern, maxcount=2) as writer:
        for i in range(5):
            writer.write({"__key__": f"s{i:04d}", "txt": f"t{i}", "bin": bytes([i]) * 3000})
    shards = sorted(tmp_path.glob("sw-*.tar"))
    assert len(shards) == 3
    for path in shards:
        assert_same(path)
    report = verify(str(tmp_path / "sw-{000000..000002}.tar"), deep=True)
    assert report.ok and sum(c.samples for c in report.shards) == 5
