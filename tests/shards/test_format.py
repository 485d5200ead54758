"""The shard format: tar writer and reader, sample rules, manifest, indexing and merging."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import tarfile

import pytest

from wdstream.errors import InputError, ManifestError, ShardError
from wdstream.shards import samples as samples_module
from wdstream.shards.index_shards import index_shards, merge_manifests
from wdstream.shards.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestNotFoundError,
    ShardInfo,
    load_manifest,
    write_manifest,
)
from wdstream.shards.samples import (
    StrayCount,
    check_key,
    iter_samples,
    sample_batches,
    split_name,
)
from wdstream.shards.tar_reader import iter_members
from wdstream.shards.tar_writer import END_SIZE, TarWriter, member_size

LONG_DIR_NAME = "d" * 90 + "/" + "e" * 60 + "/" + "f" * 95 + ".txt"  # > 100 bytes, splits at "/"
LONG_FLAT_NAME = "k" * 150 + ".json"  # > 100 bytes, no "/": GNU longname


def make_tar(members) -> bytes:
    out = io.BytesIO()
    writer = TarWriter(out)
    for name, data in members:
        writer.add(name, data)
    writer.close()
    assert writer.bytes_written == len(out.getvalue())
    return out.getvalue()


def sample_members(n=20, seed=0):
    rng = random.Random(seed)
    members = []
    for i in range(n):
        members.append((f"{i:06d}.json", json.dumps({"i": i}).encode()))
        members.append((f"{i:06d}.txt", rng.randbytes(rng.randrange(0, 3000))))
    return members


def tarfile_members(data: bytes):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers() if m.isreg()]


class ShortReads(io.RawIOBase):
    """A stream that returns at most ``step`` bytes per read, like a pipe or a socket."""

    def __init__(self, data: bytes, step: int):
        self._data, self._pos, self._step = data, 0, step

    def read(self, n=-1):
        n = self._step if n < 0 else min(n, self._step)
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk


# --- writer ----------------------------------------------------------------------------------


def test_writer_is_deterministic_and_compact():
    members = sample_members()
    first, second = make_tar(members), make_tar(members)
    assert first == second
    assert len(first) == sum(member_size(n, len(d)) for n, d in members) + END_SIZE
    assert first.endswith(bytes(1024)) and len(first) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(first)) as tf:
        infos = tf.getmembers()
    assert {(i.mtime, i.mode, i.uid, i.gid, i.uname, i.gname) for i in infos} == {
        (0, 0o644, 0, 0, "", "")
    }
    assert not any(i.pax_headers for i in infos)


def test_writer_keeps_order_and_rejects_bad_names():
    members = [("b.txt", b"1"), ("a.txt", b"2"), ("b.json", b"3")]
    assert [n for n, _ in iter_members(io.BytesIO(make_tar(members)), "x")] == [
        "b.txt",
        "a.txt",
        "b.json",
    ]
    with pytest.raises(InputError):
        TarWriter(io.BytesIO()).add("a\x00b.txt", b"")


ODD_MEMBERS = [
    ("plain.txt", b"hello"),
    ("empty.bin", b""),
    ("exact.bin", b"x" * 512),
    ("naïve-ünïcode.txt", "☃".encode()),
    (LONG_DIR_NAME, b"prefix field"),
    (LONG_FLAT_NAME, b"gnu longname"),
    ("g" * 100 + ".x", b"longname at 102 bytes"),
    ("a" * 100, b"exactly 100 bytes, no dot"),
]


def test_gnu_tar_lists_and_extracts(tmp_path):
    path = tmp_path / "odd.tar"
    path.write_bytes(make_tar(ODD_MEMBERS))
    listed = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
    assert listed.stdout.splitlines() == [n for n, _ in ODD_MEMBERS]
    assert listed.stderr == ""
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "xf", str(path), "-C", str(out)], check=True)
    for name, data in ODD_MEMBERS:
        assert (out / name).read_bytes() == data


def test_tarfile_and_our_reader_read_back():
    data = make_tar(ODD_MEMBERS)
    assert tarfile_members(data) == ODD_MEMBERS
    assert list(iter_members(io.BytesIO(data), "odd.tar")) == ODD_MEMBERS


def test_webdataset_reads_our_shards(tmp_path):
    import webdataset as wds

    members = sample_members(30)
    members.append(("000029.cls", b"7"))
    for i in range(2):
        (tmp_path / f"shard-{i}.tar").write_bytes(make_tar(members))
    url = str(tmp_path / "shard-{0..1}.tar")
    samples = list(wds.WebDataset(url, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(30)] * 2
    assert samples[0]["json"] == b'{"i": 0}' and samples[29]["cls"] == b"7"
    ours = list(iter_samples(iter_members(io.BytesIO(make_tar(members)), "u"), "u"))
    assert [sorted(s) for s in ours] == [sorted(set(s) - {"__local_path__"}) for s in samples[:30]]
    assert all(o["txt"] == s["txt"] for o, s in zip(ours, samples, strict=False))


def test_member_size_is_exact():
    rng = random.Random(1)
    names = [
        "a.b",
        "x" * 99 + ".y",
        "x" * 100,
        "x" * 101,
        LONG_DIR_NAME,
        LONG_FLAT_NAME,
        "ü" * 60 + ".txt",
        "dir/" * 40 + "f.txt",
        "z" * 600 + ".bin",
    ]
    sizes = [0, 1, 511, 512, 513, 1023, 1024, rng.randrange(5000)]
    for name in names:
        for size in sizes:
            out = io.BytesIO()
            writer = TarWriter(out)
            writer.add(name, bytes(size))
            assert writer.bytes_written == member_size(name, size), (name, size)
            writer.close()
            assert list(iter_members(io.BytesIO(out.getvalue()), "t")) == [(name, bytes(size))]


def _reference_header(name: bytes, size: int, typeflag: bytes, prefix: bytes = b"",
                      magic: bytes = b"ustar\x0000") -> bytes:
    """The writer's header as first written: every field joined, then all 512 bytes summed
    (the checksum field counted as spaces). The writer now precomputes the fixed fields."""
    size_field = (b"%011o\x00" % size if size < 8**11
                  else b"\x80" + size.to_bytes(11, "big"))
    header = b"".join((
        name.ljust(100, b"\x00"), b"0000644\x00", b"0000000\x00", b"0000000\x00", size_field,
        b"00000000000\x00", b"        ", typeflag, bytes(100), magic, bytes(64),
        b"0000000\x000000000\x00", prefix.ljust(155, b"\x00"), bytes(12),
    ))
    return header[:148] + b"%06o\x00 " % sum(header) + header[156:]


def _reference_member(name: str, size: int) -> bytes:
    """What the first writer wrote for ``add(name, bytes(size))``."""
    raw = name.encode("utf-8")
    split = None
    if len(raw) <= 100:
        split = (b"", raw)
    else:
        parts = raw.split(b"/")
        for i in range(1, len(parts)):
            prefix, rest = b"/".join(parts[:i]), b"/".join(parts[i:])
            if len(prefix) <= 155 and 0 < len(rest) <= 100:
                split = (prefix, rest)
                break
    out = b""
    if split is None:
        gnu = b"ustar  \x00"
        long_name = raw + b"\x00"
        out += _reference_header(b"././@LongLink", len(long_name), b"L", magic=gnu)
        out += long_name + bytes(-len(long_name) % 512)
        out += _reference_header(raw[:100], size, b"0", magic=gnu)
    else:
        out += _reference_header(split[1], size, b"0", prefix=split[0])
    return out + bytes(size) + bytes(-size % 512)


def test_headers_match_the_reference_and_tarfile():
    """Byte for byte the output of the original writer (fixed fields summed per member), on
    many names and sizes; and, for ustar names, the fields Python's tarfile writes for the same
    member (mode 0o644, mtime 0, no owner), but for devmajor/devminor, which tarfile leaves
    empty for regular files (and so the checksum)."""
    rng = random.Random(7)
    alphabet = "abcxyz0123456789._-/é☃"
    names = [n for n, _ in ODD_MEMBERS] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 320))) for _ in range(1500)
    ] + [f"{i:010d}.json" for i in range(0, 10**10, 10**10 // 97)]
    sizes = [0, 1, 7, 511, 512, 513, 4096, 100_000] + [rng.randrange(1 << 20) for _ in range(40)]
    for i, name in enumerate(names):
        size = sizes[i % len(sizes)]
        out = io.BytesIO()
        writer = TarWriter(out)
        writer.add(name, bytes(size))
        assert out.getvalue() == _reference_member(name, size), (name, size)
        assert writer.bytes_written == len(out.getvalue())
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime, info.uname, info.gname = size, 0o644, 0, "", ""
        try:
            expected = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
        except ValueError:  # a name ustar cannot hold: the writer uses a GNU longname entry
            assert len(out.getvalue()) > 512 + size + (-size % 512)
            continue
        header = out.getvalue()[:512]
        for start, stop in ((0, 148), (156, 329), (345, 512)):
            assert header[start:stop] == expected[start:stop], (name, start)
    # Sizes beyond the octal field (GNU base-256), through the header function itself.
    from wdstream.shards import tar_header

    for size in (8**11 - 1, 8**11, 5 << 40):
        assert tar_header.build_header(b"big.bin", size, b"0") == _reference_header(b"big.bin", size, b"0")


# --- reader on tars written by others ----------------------------------------------------------


def test_reader_on_webdataset_shardwriter_pax(tmp_path):
    import webdataset as wds

    pattern = str(tmp_path / "wds-%02d.tar")
    with wds.ShardWriter(pattern, maxcount=25, verbose=0) as sink:
        for i in range(40):
            sink.write(
                {"__key__": f"s{i:04d}", "json": {"i": i}, "txt": "t" * i, "bin": bytes([i]) * 700}
            )
    paths = sorted(tmp_path.glob("wds-*.tar"))
    assert len(paths) == 2
    data = paths[0].read_bytes()
    with tarfile.open(paths[0]) as tf:
        assert any(m.pax_headers for m in tf.getmembers())  # the PAX path is exercised
    members = iter_members(io.BytesIO(data), str(paths[0]))
    assert list(members) == tarfile_members(data)
    assert members.offset == len(data) and members.complete
    samples = list(iter_samples(iter_members(io.BytesIO(data), "u"), "u"))
    assert [s["__key__"] for s in samples] == [f"s{i:04d}" for i in range(25)]
    assert samples[3]["txt"] == b"ttt" and samples[3]["bin"] == bytes([3]) * 700


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar", "v7"])
def test_reader_on_gnu_tar(tmp_path, fmt):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_bytes(b"A" * 700)
    (src / "b.bin").write_bytes(os.urandom(5000))
    (src / "empty.txt").write_bytes(b"")
    os.symlink("b.bin", src / "link.bin")
    if fmt != "v7":
        (src / "sub" / ("M" * 95 + ".txt")).write_bytes(b"split into prefix and name")
        (src / ("ü" * 10 + ".txt")).write_bytes(b"unicode")
    if fmt in ("gnu", "posix"):  # a long name with no "/" to split at: 'L' or PAX path
        (src / ("L" * 130 + ".json")).write_bytes(b"{}")
    path = tmp_path / f"{fmt}.tar"
    subprocess.run(
        ["tar", f"--format={fmt}", "--sort=name", "-cf", str(path), "-C", str(src), "."], check=True
    )
    data = path.read_bytes()
    assert len(data) % 10240 == 0  # GNU tar pads to its record size
    members = iter_members(io.BytesIO(data), str(path))
    got = list(members)
    assert got == tarfile_members(data)
    assert "./sub/a.txt" in dict(got) and "./link.bin" not in dict(got)
    assert members.offset == len(data) and members.complete


def test_reader_with_short_reads():
    data = make_tar(ODD_MEMBERS + sample_members(10))
    expected = list(iter_members(io.BytesIO(data), "x"))
    for step in (1, 7, 512, 4096):
        members = iter_members(ShortReads(data, step), "x")
        assert list(members) == expected
        assert members.offset == len(data)


def test_reader_on_a_pipe():
    data = make_tar(sample_members(50))
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(data)
    proc.stdin.close()
    members = iter_members(proc.stdout, "pipe:cat")
    assert len(list(members)) == 100 and members.offset == len(data)
    proc.stdout.close()
    proc.wait()


# --- reader errors ---------------------------------------------------------------------------


def test_truncated_mid_member():
    data = make_tar([("a.txt", b"a" * 100), ("b.txt", b"b" * 2000)])
    cut = data[: 1024 + 512 + 700]  # inside b.txt's payload, which starts at byte 1536
    members = iter_members(io.BytesIO(cut), "s3://b/shard.tar")
    assert next(members) == ("a.txt", b"a" * 100)
    with pytest.raises(ShardError, match=r"s3://b/shard.tar: truncated member .* at byte 1024"):
        next(members)
    # the payload is complete but its padding is missing: still truncated
    cut = data[: 1024 + 512 + 2000]
    with pytest.raises(ShardError, match="truncated member"):
        list(iter_members(io.BytesIO(cut), "x"))


class Unseekable(io.BytesIO):
    def seekable(self) -> bool:
        return False


@pytest.mark.parametrize("stream", [io.BytesIO, Unseekable], ids=["seekable", "unseekable"])
def test_large_members_read_whole_or_joined(stream):
    """A payload from 128 KiB on is read with one exact read where the stream can seek (a
    local file), else joined from chunks; both give the same members, offsets and errors."""
    big = bytes(range(256)) * 1200 + b"tail"  # 307,204 bytes: not a multiple of 512
    data = make_tar([("a.bin", b"a" * 100), ("b.bin", big), ("c.bin", big[::-1]),
                     ("d.txt", b"d")])
    members = iter_members(stream(data), "x")
    assert list(members) == [("a.bin", b"a" * 100), ("b.bin", big), ("c.bin", big[::-1]),
                             ("d.txt", b"d")]
    assert members.complete and members.offset == len(data)
    b_start = 1024 + 512  # b.bin's payload
    for cut in (b_start + 1000, b_start + len(big), b_start + len(big) + 10):
        members = iter_members(stream(data[:cut]), "x")
        assert next(members)[0] == "a.bin"
        with pytest.raises(ShardError, match="truncated member .* at byte 1024"):
            next(members)


class ReadOnly:
    """A stream with only ``read``, which returns at most 5,000 bytes at a time."""

    def __init__(self, data: bytes):
        self._stream = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._stream.read(5000 if n < 0 else min(n, 5000))


class Target:
    """A payload target that takes ``.bin`` members into bytearrays it hands out."""

    def __init__(self):
        self.asked = []

    def __call__(self, name: str, size: int, region):
        assert region is None  # not a local file
        self.asked.append((name, size))
        if not name.endswith(".bin"):
            return None
        memory = bytearray(size)
        return memory, memoryview(memory)


@pytest.mark.parametrize("stream", [io.BytesIO, Unseekable, ReadOnly],
                         ids=["seekable", "unseekable", "read-only"])
def test_large_payloads_read_into_a_target(stream):
    """Regular members from 32 KiB on are offered to the payload target; those it takes are
    read into its memory (from the buffer, or straight from the stream), the others stay
    bytes; offsets and truncation errors are the same as without a target."""
    big = bytes(range(256)) * 1200 + b"tail"  # 307,204 bytes: not a multiple of 512
    first = b"f" * 200_000  # lies within the reader's first large read
    data = make_tar([("f.bin", first), ("a.bin", b"a" * 100), ("b.bin", big),
                     ("c.txt", big[::-1]), ("d.bin", big[:150_000])])
    target = Target()
    members = iter_members(stream(data), "x", target)
    got = list(members)
    assert [name for name, _ in got] == ["f.bin", "a.bin", "b.bin", "c.txt", "d.bin"]
    assert [bytes(payload) for _, payload in got] == [first, b"a" * 100, big, big[::-1],
                                                      big[:150_000]]
    assert [type(payload) for _, payload in got] == [bytearray, bytes, bytearray, bytes,
                                                     bytearray]
    assert target.asked == [("f.bin", len(first)), ("b.bin", len(big)), ("c.txt", len(big)),
                            ("d.bin", 150_000)]
    assert members.complete and members.offset == len(data)
    b_start = 512 + 200_192 + 1024 + 512  # b.bin's payload
    for cut in (b_start + 1000, b_start + len(big), b_start + len(big) + 10):
        members = iter_members(stream(data[:cut]), "x", Target())
        assert [next(members)[0], next(members)[0]] == ["f.bin", "a.bin"]
        with pytest.raises(ShardError, match=f"truncated member .* at byte {b_start - 512}"):
            next(members)


def test_large_payloads_left_in_a_local_file(tmp_path):
    """A target may leave a payload where it lies in a local file: the reader seeks past it
    and yields what the target gave, which knows the payload's place in the file; a file that
    ends inside such a payload (or its padding) is truncated as with reads."""
    from wdstream.sources.openers import open_read

    big = bytes(range(256)) * 1200 + b"tail"
    first = b"f" * 200_000  # lies within the reader's first large read
    data = make_tar([("f.bin", first), ("a.bin", b"a" * 100), ("b.bin", big),
                     ("c.txt", big[::-1])])
    path = tmp_path / "shard.tar"
    path.write_bytes(data)

    def leave_in_file(name, size, region):
        assert region is not None and region[0] == str(path)
        return ((region[1], size), None) if name.endswith(".bin") else None

    members = iter_members(open_read(str(path)), str(path), leave_in_file)
    got = list(members)
    assert [name for name, _ in got] == ["f.bin", "a.bin", "b.bin", "c.txt"]
    assert [data[p[0] : p[0] + p[1]] for _, p in got[::2]] == [first, big]
    assert got[1][1] == b"a" * 100 and got[3][1] == big[::-1]
    assert members.complete and members.offset == len(data)
    b_start = 512 + 200_192 + 1024 + 512
    for cut in (b_start + 1000, b_start + len(big), b_start + len(big) + 10):
        path.write_bytes(data[:cut])
        members = iter_members(open_read(str(path)), str(path), leave_in_file)
        assert [next(members)[0], next(members)[0]] == ["f.bin", "a.bin"]
        with pytest.raises(ShardError, match=f"truncated member .* at byte {b_start - 512}"):
            next(members)


def test_truncated_mid_header():
    data = make_tar([("a.txt", b"a" * 100), ("b.txt", b"b")])
    with pytest.raises(ShardError, match=r"shard.tar: truncated header at byte 1024"):
        list(iter_members(io.BytesIO(data[: 1024 + 300]), "shard.tar"))


def test_truncated_at_member_boundary_stops_cleanly():
    data = make_tar([("a.txt", b"a" * 100), ("b.txt", b"b" * 600), ("c.txt", b"c")])
    cut = data[: 1024 + 1536]  # after b.txt, no c.txt, no end marker
    members = iter_members(io.BytesIO(cut), "x")
    assert [n for n, _ in members] == ["a.txt", "b.txt"]
    assert members.offset == len(cut) and not members.complete
    empty = iter_members(io.BytesIO(b""), "x")
    assert list(empty) == [] and empty.offset == 0 and not empty.complete


def test_offset_counts_members_and_trailing_bytes():
    data = make_tar([("a.txt", b"a" * 100), ("b.txt", b"b" * 600)])
    members = iter_members(io.BytesIO(data + bytes(8192)), "x")
    next(members)
    assert members.offset == 1024
    next(members)
    assert members.offset == 1024 + 1536
    assert list(members) == [] and members.complete and members.offset == len(data) + 8192


def test_bad_checksum():
    data = bytearray(make_tar([("a.txt", b"a" * 100), ("b.txt", b"b")]))
    data[1024 + 10] ^= 0x01  # a byte of b.txt's name
    members = iter_members(io.BytesIO(bytes(data)), "gs://b/s.tar")
    assert next(members)[0] == "a.txt"
    with pytest.raises(ShardError, match=r"gs://b/s.tar: bad header checksum at byte 1024"):
        next(members)
    with pytest.raises(ShardError, match="bad header checksum at byte 0"):
        list(iter_members(io.BytesIO(b"not a tar" * 100), "x"))


def test_pax_overrides_size_and_path():
    # tarfile writes a PAX header for a non-ASCII name and for a float mtime
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in [("ä" * 120 + ".txt", b"x" * 10), ("plain.txt", b"y")]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1.5
            tf.addfile(info, io.BytesIO(data))
    data = out.getvalue()
    assert list(iter_members(io.BytesIO(data), "x")) == tarfile_members(data)


# --- samples ---------------------------------------------------------------------------------


def test_split_name():
    assert split_name("a/b.c.json") == ("a/b", "c.json")
    assert split_name("000001.JSON") == ("000001", "JSON")
    assert split_name("x.y/z.txt") == ("x.y/z", "txt")
    for bad in ["noext", "dir.d/noext", ".hidden", "a/.b"]:
        with pytest.raises(ShardError):
            split_name(bad)


def test_check_key():
    for good in ["000001", "img_001-a", "été", "a b"]:
        check_key(good, "data.jsonl line 1")
    for bad in ["", "   ", "a.b", "a/b", "a\nb", "k" * 201]:
        with pytest.raises(InputError, match="data.jsonl line 17"):
            check_key(bad, "data.jsonl line 17")


def test_iter_samples_groups_consecutive_members():
    members = [
        ("a.json", b"1"),
        ("a.TXT", b"2"),
        ("b.json", b"3"),
        ("a.json", b"4"),
        ("d/c.x.y", b"5"),
    ]
    samples = list(iter_samples(members, "u"))
    assert samples == [
        {"__key__": "a", "__url__": "u", "json": b"1", "txt": b"2"},
        {"__key__": "b", "__url__": "u", "json": b"3"},
        {"__key__": "a", "__url__": "u", "json": b"4"},
        {"__key__": "d/c", "__url__": "u", "x.y": b"5"},
    ]
    with pytest.raises(ShardError, match=r"shard.tar: sample 'a' has a duplicate extension 'json'"):
        list(iter_samples([("a.json", b""), ("a.JSON", b"")], "shard.tar"))
    with pytest.raises(ShardError, match="reserved"):
        list(iter_samples([("a.__key__", b"")], "shard.tar"))
    with pytest.raises(ShardError, match="sample 'a' has a reserved extension '__url__'"):
        list(iter_samples([("a.json", b""), ("a.__URL__", b"")], "shard.tar"))
    # members webdataset skips are skipped and counted, never fatal
    strays = StrayCount()
    members = [("README", b""), (".hidden", b""), ("__meta__", b""), ("a.txt", b"1"),
               ("__x__/a.txt", b""), ("a/.b.txt", b"2"), ("d.e/f", b"")]
    got = list(iter_samples(members, "shard.tar", strays))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in got] == [
        ("a", ["txt"]), ("a/", ["b.txt"])]
    assert strays.count == 5 and strays.names == ["README", ".hidden", "__meta__",
                                                  "__x__/a.txt", "d.e/f"]



def _grouped(lists, url="shard.tar"):
    """``sample_batches`` of ``lists``: the samples and strays given, then the error's text."""
    strays, got = StrayCount(), []
    try:
        for samples in sample_batches(iter(lists), url, strays):
            got += samples
    except ShardError as error:
        return got, strays.names, str(error)
    return got, strays.names, None


def test_lists_of_one_member_samples_group_as_members_one_by_one(monkeypatch):
    """Lists whose members are each a sample of its own are grouped a list at a time: the
    same samples, strays and errors as member by member, wherever the lists are cut."""
    rng = random.Random(5)
    pieces = ["a", "b", "Σ", "x1", ".", ".", "/", "_", "__", "\n", "JSON", "__key__", "ΑΣ"]
    for case in range(600):
        names = []
        # a third of the cases: one extension for (nearly) every name, as most shards have
        one = rng.choice(['json', 'TXT', 'x.y', 'ΑΣ', 'a.json']) if case % 3 == 2 else None
        for i in range(rng.randrange(1, 40)):
            if one is not None and rng.random() < 0.97:
                names.append(f"{rng.choice(['', 'k.', 'k'])}{i:04d}.{one}")
            elif case % 3 and rng.random() < 0.9:  # mostly the usual shape
                names.append(f"{i:04d}.{rng.choice(['json', 'TXT', 'cls', 'x.y', 'ΑΣ'])}")
            else:
                names.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 6))))
            if rng.random() < 0.05 and names:  # a key again, right after
                names.append(names[-1].split(".")[0] + ".other")
        members = [(name, b"%d" % i) for i, name in enumerate(names)]
        cuts = sorted({0, len(members), *rng.sample(range(len(members)), min(3, len(members)))})
        lists = [members[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
        fast = _grouped(lists)
        with monkeypatch.context() as patched:
            patched.setattr(samples_module, "_one_member_samples", lambda batch, key: None)
            assert fast == _grouped(lists), (case, names)
    lists = [[(f"{i:04d}.json", b"x") for i in range(j, j + 10)] for j in range(0, 50, 10)]
    calls = []
    real = samples_module._one_member_samples
    monkeypatch.setattr(samples_module, "_one_member_samples",
                        lambda batch, key: calls.append(real(batch, key)) or calls[-1])
    assert len(_grouped(lists)[0]) == 50 and all(calls)  # the usual lists: the quick way

# --- manifest --------------------------------------------------------------------------------


def example_manifest(base="/data/set") -> Manifest:
    return Manifest(
        shards=[
            ShardInfo("shard-000000.tar", 3, 10240, "a" * 64),
            ShardInfo("s3://o/x.tar", 2, 2048, None),
        ],
        extensions=["json", "txt"],
        extra={"packed_by": "test", "keys": ["a", "z"]},
        base=base,
    )


def test_manifest_round_trip_and_urls():
    m = example_manifest()
    text = m.to_json()
    doc = json.loads(text)
    assert doc["format"] == "wdstream" and doc["version"] == 1
    assert doc["samples"] == 5 and doc["bytes"] == 12288 and list(doc)[-1] == "shards"
    back = Manifest.from_json(text, base="/data/set", where="index.json")
    assert back == m and back.to_json() == text
    assert (m.samples, m.bytes) == (5, 12288)
    assert m.shard_url(1) == "s3://o/x.tar"
    assert m.shard_url(0).replace(os.sep, "/") == "/data/set/shard-000000.tar"
    assert Manifest([], base="s3://b/p/").to_json().endswith('"shards": []}\n')


def test_manifest_fingerprint_is_stable():
    m = example_manifest()
    assert m.fingerprint() == example_manifest(base="s3://elsewhere").fingerprint()
    assert (
        m.fingerprint() == "2e20657db6d17bf3"
    )  # pinned: resume states saved earlier must still match
    changed = Manifest(shards=m.shards[:1] + [ShardInfo("s3://o/x.tar", 3, 2048, None)])
    assert changed.fingerprint() != m.fingerprint()
    # sha256 and extras are not part of the identity
    same = Manifest(shards=[ShardInfo(s.url, s.samples, s.bytes, None) for s in m.shards])
    assert same.fingerprint() == m.fingerprint()


def _doc():
    return json.loads(example_manifest().to_json())


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda d: d.pop("shards"), "'shards'"),
        (lambda d: d.update(format="other"), "'format'"),
        (lambda d: d.update(version="1"), "'version'"),
        (lambda d: d.update(version=2), "'version'"),
        (lambda d: d.update(extensions="json"), "'extensions'"),
        (lambda d: d.update(samples=6), "'samples'"),
        (lambda d: d.update(bytes=-1), "'bytes'"),
        (lambda d: d["shards"][1].pop("url"), r"'shards\[1\].url'"),
        (lambda d: d["shards"][0].update(samples=True), r"'shards\[0\].samples'"),
        (lambda d: d["shards"][0].update(bytes=1.5), r"'shards\[0\].bytes'"),
        (lambda d: d["shards"][0].update(sha256="xyz"), r"'shards\[0\].sha256'"),
        (lambda d: d["shards"].append(3), r"'shards\[2\]'"),
    ],
)
def test_manifest_validation_names_the_key(change, key):
    doc = _doc()
    change(doc)
    with pytest.raises(ManifestError, match=rf"s3://b/index.json: key {key}"):
        Manifest.from_json(json.dumps(doc), base="s3://b", where="s3://b/index.json")


def test_manifest_not_json():
    with pytest.raises(ManifestError, match="m.json: not valid JSON"):
        Manifest.from_json("{", where="m.json")
    with pytest.raises(ManifestError, match="m.json: expected a JSON object"):
        Manifest.from_json("[]", where="m.json")


def test_load_and_write_manifest_local(tmp_path):
    m = example_manifest(base=None)
    url = write_manifest(m, str(tmp_path))
    assert url.endswith(MANIFEST_NAME) and (tmp_path / MANIFEST_NAME).exists()
    for source in (str(tmp_path), str(tmp_path / MANIFEST_NAME)):
        with pytest.raises(ManifestError, match=r"shards\[1\].url 's3://o/x.tar': a URL"):
            load_manifest(source)  # a shard in another bucket needs the opt-in
        loaded = load_manifest(source, allow_external_shards=True)
        assert loaded.shards == m.shards and loaded.extra == m.extra
        assert loaded.shard_url(0) == os.path.join(str(tmp_path), "shard-000000.tar")
    with pytest.raises(ManifestNotFoundError, match="no manifest"):
        load_manifest(str(tmp_path / "missing"))
    part = write_manifest(m, str(tmp_path / "parts"), name="index.part-001-of-003.json")
    assert part == os.path.join(str(tmp_path / "parts"), "index.part-001-of-003.json")
    assert load_manifest(part, allow_external_shards=True).shards == m.shards
    assert not (tmp_path / "parts" / MANIFEST_NAME).exists()


# --- index and merge -------------------------------------------------------------------------


def write_shards(folder, counts, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n in enumerate(counts):
        members = [(f"{i}-{m}", d) for m, d in sample_members(n, seed + i)]
        path = folder / f"shard-{i:06d}.tar"
        path.write_bytes(make_tar(members))
        paths.append(str(path))
    return paths


def test_index_shards_counts_and_digests(tmp_path):
    paths = write_shards(tmp_path / "ds", [5, 0, 12])
    progress = []
    manifest = index_shards(paths, base=str(tmp_path / "ds"), workers=2, progress=progress.append)
    assert [s.url for s in manifest.shards] == [
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    assert [s.samples for s in manifest.shards] == [5, 0, 12]
    for shard, path in zip(manifest.shards, paths, strict=True):
        data = open(path, "rb").read()
        assert shard.bytes == len(data) and shard.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.extensions == ["json", "txt"] and manifest.samples == 17
    assert sum(progress) == manifest.bytes
    # shards outside the base keep an absolute URL
    outside = index_shards(paths[:1], base=str(tmp_path / "other"))
    assert outside.shards[0].url == os.path.abspath(paths[0])


def test_index_shards_foreign_tars(tmp_path):
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "w-%d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(15):
            sink.write({"__key__": f"k{i}", "cls": i})
    paths = sorted(str(p) for p in tmp_path.glob("w-*.tar"))
    manifest = index_shards(paths, base=str(tmp_path))
    assert [s.samples for s in manifest.shards] == [10, 5] and manifest.extensions == ["cls"]


def test_index_shards_errors(tmp_path):
    paths = write_shards(tmp_path, [3, 3])
    data = open(paths[1], "rb").read()
    open(paths[1], "wb").write(data[:1700])
    with pytest.raises(ShardError, match="shard-000001.tar: truncated"):
        index_shards(paths, base=str(tmp_path))
    open(paths[1], "wb").write(data[:-END_SIZE])  # all members, no end marker
    with pytest.raises(ShardError, match="shard-000001.tar: no end-of-archive marker"):
        index_shards(paths, base=str(tmp_path))
    dup = tmp_path / "dup.tar"
    dup.write_bytes(make_tar([("a.json", b"1"), ("b.json", b"2"), ("a.json", b"3")]))
    assert index_shards([str(dup)], base=str(tmp_path)).samples == 3
    with pytest.raises(ShardError, match="dup.tar: key 'a' appears in two samples"):
        index_shards([str(dup)], base=str(tmp_path), unique_keys=True)


def test_merge_manifests(tmp_path):
    a = Manifest(
        [ShardInfo("s-0.tar", 2, 1024, None), ShardInfo("s-1.tar", 1, 512, None)],
        ["json"],
        base="s3://bkt/data/a",
        url="s3://bkt/data/a/index.json",
    )
    b = Manifest([ShardInfo("s-0.tar", 4, 2048, "b" * 64)], ["txt", "json"], base="s3://bkt/data/b")
    c = Manifest([ShardInfo("gs://o/x.tar", 1, 512, None)], ["cls"], base="gs://o")
    merged = merge_manifests([a, b, c], "s3://bkt/data")
    assert [s.url for s in merged.shards] == ["a/s-0.tar", "a/s-1.tar", "b/s-0.tar", "gs://o/x.tar"]
    assert merged.samples == 8 and merged.shards[2].sha256 == "b" * 64
    assert merged.extensions == ["cls", "json", "txt"]
    assert merged.extra["merged_from"] == [
        "s3://bkt/data/a/index.json",
        "s3://bkt/data/b",
        "gs://o",
    ]
    elsewhere = merge_manifests([a], "s3://bkt/other/")
    assert elsewhere.shards[0].url == "s3://bkt/data/a/s-0.tar"
    with pytest.raises(ManifestError, match="s-0.tar"):
        merge_manifests([a, b, a], "s3://bkt/data")
    # round trip through JSON keeps merged_from
    assert (
        Manifest.from_json(merged.to_json()).extra["merged_from"][0] == "s3://bkt/data/a/index.json"
    )


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_index_reads_gnu_tar(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i:03d}.txt").write_text(str(i))
        (src / f"{i:03d}.cls").write_text("1")
    path = tmp_path / "g.tar"
    subprocess.run(["tar", "--sort=name", "-cf", str(path), "-C", str(src), "."], check=True)
    manifest = index_shards([str(path)], base=str(tmp_path))
    assert manifest.samples == 4 and manifest.shards[0].bytes == path.stat().st_size


def test_reader_fuzz_raises_only_shard_errors():
    """Damaged tars either parse or raise ShardError, never another exception."""
    rng = random.Random(5)
    base = make_tar(ODD_MEMBERS + sample_members(5))
    for _ in range(300):
        data = bytearray(base[: rng.randrange(len(base) + 1)])
        for _ in range(rng.randrange(4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            for _ in iter_samples(iter_members(io.BytesIO(bytes(data)), "f"), "f"):
                pass
        except ShardError:
            pass


def test_index_and_manifest_on_s3(s3_bucket):
    from wdstream.sources.objects import write_bytes

    prefix = f"s3://{s3_bucket}/ds/"
    datas = [make_tar(sample_members(n, seed=n)) for n in (3, 4)]
    for i, data in enumerate(datas):
        write_bytes(f"{prefix}shard-{i}.tar", data)
    with pytest.raises(ManifestNotFoundError, match=f"{prefix}index.json: no manifest"):
        load_manifest(prefix)
    shard_urls = [f"{prefix}shard-{i}.tar" for i in range(2)]
    manifest = index_shards(shard_urls, base=prefix, workers=2)
    assert [s.url for s in manifest.shards] == ["shard-0.tar", "shard-1.tar"]
    assert [s.sha256 for s in manifest.shards] == [hashlib.sha256(d).hexdigest() for d in datas]
    assert write_manifest(manifest, prefix) == f"{prefix}index.json"
    loaded = load_manifest(f"s3://{s3_bucket}/ds")
    assert loaded.shards == manifest.shards and loaded.samples == 7
    assert loaded.shard_url(1) == f"{prefix}shard-1.tar"
    assert load_manifest(f"{prefix}index.json").shard_url(0) == f"{prefix}shard-0.tar"
