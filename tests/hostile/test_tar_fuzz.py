"""A deterministic tar fuzzer: header mutations (checksums fixed up) of shards with long names,
PAX and GNU headers, read by our reader and by Python's tarfile.

Every mutated shard must be either refused with wdstream's own error, or read exactly as
tarfile reads it, or (where tarfile refuses it or stops early) read as the unmutated shard.
Anything else -- above all a payload yielded under another member's name -- fails. Runs of
many small members are also read as lists (``TarMembers.batches()``, where the reader scans
a buffer's headers as one array: ``tar_blocks``), which must give what reading them one at
a time gives, the same error included.
``WDSTREAM_FUZZ_CASES`` sets the number of mutations (default 3000, a few seconds),
``WDSTREAM_FUZZ_SEED`` the seed (default 12).
"""

from __future__ import annotations

import io
import os
import random
import tarfile

import pytest

from tests.shards.test_tar_blocks import outcome_both_ways
from tests.shards.test_tar_reader import fix_checksum
from wdstream.errors import WdstreamError
from wdstream.shards.tar_reader import iter_members
from wdstream.shards.tar_writer import TarWriter

BLOCK = 512
CASES = int(os.environ.get("WDSTREAM_FUZZ_CASES", "3000"))
SEED = int(os.environ.get("WDSTREAM_FUZZ_SEED", "12"))


def _payload(rng: random.Random, i: int) -> bytes:
    return b"<%d>" % i + rng.randbytes(rng.choice((0, 5, 300, 511, 512, 700, 1500)))


def _names(i: int) -> str:
    kinds = (f"{i:06d}.txt", "k" * 150 + f"{i}.json",
             "d" * 90 + f"/{i:03d}" + "e" * 60 + ".bin", f"dir/{i:06d}.cls")
    return kinds[i % len(kinds)]


def our_shard(rng):
    out = io.BytesIO()
    writer = TarWriter(out)
    members = [(_names(i), _payload(rng, i)) for i in range(10)]
    for name, data in members:
        writer.add(name, data)
    writer.close()
    return out.getvalue()


def tarfile_shard(rng, fmt):
    out = io.BytesIO()
    pax = {"comment": "global"} if fmt == tarfile.PAX_FORMAT else None
    with tarfile.open(fileobj=out, mode="w", format=fmt, pax_headers=pax) as tf:
        for i in range(10):
            if i == 3:
                info = tarfile.TarInfo("l" * 120 + "/dir")
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            if i == 6:
                info = tarfile.TarInfo(f"{i:06d}.lnk")
                info.type, info.linkname = tarfile.SYMTYPE, "t" * 130
                tf.addfile(info)
            data = _payload(rng, i)
            info = tarfile.TarInfo(_names(i) if i % 3 else f"ü{i:05d}" + "n" * 110 + ".txt")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def many_shard(rng, fmt=None):
    """100 small members: by our writer (``fmt`` None), or by tarfile with a PAX header of a
    fractional mtime before each (as webdataset's ShardWriter writes them)."""
    members = [(f"{i:06d}." + ("json", "txt", "cls")[i % 3],
                b"<%d>" % i + rng.randbytes(rng.choice((0, 5, 300, 507, 508, 509, 700, 1500))))
               for i in range(100)]
    out = io.BytesIO()
    if fmt is None:
        writer = TarWriter(out)
        for name, data in members:
            writer.add(name, data)
        writer.close()
        return out.getvalue()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for i, (name, data) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1796160775.25 + i / 1000
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def headers(data: bytes) -> list[tuple[int, int]]:
    """(offset, payload size) of every header block of a well-formed tar."""
    found, pos = [], 0
    while pos + BLOCK <= len(data) and data[pos : pos + BLOCK] != bytes(BLOCK):
        header = data[pos : pos + BLOCK]
        size = int(header[124:136].split(b"\x00")[0].strip() or b"0", 8)
        found.append((pos, size))
        if header[156:157] in (b"1", b"2", b"3", b"4", b"5", b"6"):
            size = 0
        pos += BLOCK + size + (-size % BLOCK)
    return found


def _size_field(rng, size):
    choice = rng.randrange(6)
    if choice == 0:
        return b"%011o\x00" % max(0, size + rng.randint(-600, 600))
    if choice == 1:
        return b"%011o\x00" % (3 << 29)  # 1.5 GiB
    if choice == 2:
        return b"\x80" + rng.randrange(1 << 40).to_bytes(11, "big")
    if choice == 3:
        return b"\xff" * 12  # base-256 -1
    if choice == 4:
        return rng.randbytes(12)
    return b"%011o\x00" % rng.choice((0, 1, 511, 512, 513, 1024))


def mutate(rng: random.Random, original: bytes) -> bytes:
    data = bytearray(original)
    blocks = headers(original)
    at, size = rng.choice(blocks)
    kind = rng.randrange(11)
    if kind == 0:
        data[at + 156] = rng.choice(b"0\x0012567LKxXgSDVMN Q")
    elif kind == 1:
        data[at + 124 : at + 136] = _size_field(rng, size)
    elif kind == 2:  # the name: a byte, a cut, a trailing slash
        where = at + rng.randrange(100)
        data[where] = rng.choice((0, 47, 46, rng.randrange(256)))
    elif kind == 3:  # the prefix field
        prefix = rng.choice((b"", b"pre", b"x" * 155, rng.randbytes(20)))
        data[at + 345 : at + 500] = prefix.ljust(155, b"\x00")
    elif kind == 4:  # the magic
        data[at + 257 : at + 265] = rng.choice((b"ustar\x0000", b"ustar  \x00", bytes(8),
                                                b"garbage!"))
    elif kind == 5:  # any header byte but the checksum
        where = rng.choice([i for i in range(BLOCK) if not 148 <= i < 156])
        data[at + where] = rng.randrange(256)
    elif kind == 6 and size:  # a byte of an extended header's payload (no checksum covers it)
        where = at + BLOCK + rng.randrange(size)
        data[where] = rng.choice(b"0123456789 =\n\x00/" + bytes([rng.randrange(256)]))
        return bytes(data)
    elif kind == 7:  # a member (and its padding) removed
        end = at + BLOCK + size + (-size % BLOCK)
        del data[at:end]
        return bytes(data)
    elif kind == 8:  # an extended entry duplicated in front of another member
        ext = [(a, s) for a, s in blocks if original[a + 156 : a + 157] in b"LKxXg"]
        if ext:
            a, s = rng.choice(ext)
            entry = original[a : a + BLOCK + s + (-s % BLOCK)]
            where = rng.choice(blocks)[0]
            data[where:where] = entry
        return bytes(data)
    elif kind == 9:  # an entry of a random kind inserted (long names before odd types)
        entry = bytearray(original[at : at + BLOCK])
        entry[156] = rng.choice(b"LxgKSV")
        body = rng.choice((b"spoofed.txt\x00", b"12 path=a.b\n", b"30 GNU.sparse.map=0,1\n"))
        entry[124:136] = b"%011o\x00" % len(body)
        data[at:at] = bytes(entry) + body.ljust(BLOCK, b"\x00")
        fix_checksum(data, at)
        return bytes(data)
    else:  # the end marker cut short
        end = len(original.rstrip(b"\x00"))
        del data[end + (-end % BLOCK) :]
        return bytes(data)
    fix_checksum(data, at)
    return bytes(data)


def tarfile_view(data: bytes):
    """tarfile's regular members, or None where it refuses the tar or stops before its end."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tf:
            found = []
            for info in tf:
                if info.isreg() and not (info.name.endswith("/") and not info.size):
                    # (an empty regular member named like a directory is a directory to us)
                    found.append((info.name, tf.extractfile(info).read()))
            stopped = tf.offset
    except Exception:  # any refusal of tarfile's counts as one
        return None
    return found if data[stopped : stopped + BLOCK] == bytes(BLOCK) else None


class Trickle(io.RawIOBase):
    """Not seekable, short reads: the reader's other code path."""

    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def readable(self):
        return True

    def read(self, n=-1):
        n = 700 if n < 0 else min(n, 700)
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk


def ours(data: bytes, seekable: bool, limit: int | None):
    stream = io.BytesIO(data) if seekable else Trickle(data)
    return list(iter_members(stream, "fuzz.tar", limit=limit))


def ours_as_lists(data: bytes, seekable: bool, limit: int | None):
    """Read as lists and one at a time, which must agree: the same members, then the same
    error. Always from a seekable stream (``seekable`` aside): its buffers are large enough
    for a scan."""
    got, error = outcome_both_ways(data, limit=limit)
    if error is not None:
        raise error
    return got


@pytest.mark.slow
def test_fuzzed_headers_never_misattribute_payloads():
    rng = random.Random(SEED)
    bases = [our_shard(rng), tarfile_shard(rng, tarfile.PAX_FORMAT),
             tarfile_shard(rng, tarfile.GNU_FORMAT)]
    fuzz(rng, bases, ours, CASES)


@pytest.mark.slow
def test_fuzzed_runs_of_small_members_read_alike_as_lists(scanned):
    rng = random.Random(SEED + 1)
    bases = [many_shard(rng), many_shard(rng, tarfile.PAX_FORMAT)]
    cases = CASES // 5
    fuzz(rng, bases, ours_as_lists, cases)
    assert sum(scanned) > cases * 60  # the scan read most members, not the general parser


def fuzz(rng, bases, reader, cases: int) -> None:
    views = [tarfile_view(base) for base in bases]
    for base, view in zip(bases, views, strict=True):
        assert view is not None and reader(base, True, None) == view
    outcomes = {"refused": 0, "as tarfile": 0, "as unmutated": 0}
    failures = []
    for case in range(cases):
        index = case % len(bases)
        mutated = mutate(rng, bases[index])
        limit = len(mutated) if case % 5 == 0 else None
        try:
            read = reader(mutated, seekable=case % 2 == 0, limit=limit)
        except WdstreamError:
            outcomes["refused"] += 1
            continue
        except Exception as exc:  # reported below
            failures.append((case, f"{type(exc).__name__}: {exc}"))
            continue
        expected = tarfile_view(mutated)
        if expected is not None and read == expected:
            outcomes["as tarfile"] += 1
        elif read == views[index]:
            outcomes["as unmutated"] += 1
        else:
            diff = [(n, p[:12]) for n, p in read if (n, p) not in (expected or views[index])]
            failures.append((case, f"read differently: {diff[:3]}"))
    assert not failures, f"{len(failures)} of {cases}: {failures[:10]}"
    assert all(outcomes.values()), outcomes


@pytest.mark.parametrize("typeflag", [b"V", b"D", b"Q", b"5", b"2"])
def test_a_long_name_is_spent_on_the_member_after_it(typeflag):
    """GNU 'L' then a member of another type: the long name was that member's, not the next's."""
    out = io.BytesIO()
    writer = TarWriter(out)
    writer.add("k" * 150 + ".txt", b"first")
    writer.add("000001.txt", b"second")
    writer.close()
    data = bytearray(out.getvalue())
    first = BLOCK + BLOCK  # the 'L' entry and its name block, then the member's header
    data[first + 156] = typeflag[0]
    if typeflag in (b"5", b"2"):  # no payload: a directory, a symbolic link
        data[first + 124 : first + 136] = b"%011o\x00" % 0
        del data[first + BLOCK : first + 2 * BLOCK]
    fix_checksum(data, first)
    assert list(iter_members(io.BytesIO(bytes(data)), "x")) == [("000001.txt", b"second")]
    assert tarfile_view(bytes(data)) == [("000001.txt", b"second")]
