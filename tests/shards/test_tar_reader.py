"""PAX extended headers in the tar reader: the records it acts on (path, size, sparse), those
it ignores (mtime...), and headers that repeat an earlier one byte for byte (webdataset's
ShardWriter writes one per member), which the reader skips without parsing their record
again: every record that matters must still be seen, and every malformed one refused."""

from __future__ import annotations

import io
import tarfile

import pytest

from wdstream.errors import ShardError, ShardMismatchError
from wdstream.shards.tar_reader import iter_members
from wdstream.shards.tar_writer import END_SIZE

BLOCK = 512


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mtime, info.mode = size, kind, 0, 0o444
    return info.tobuf(tarfile.USTAR_FORMAT)


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def pax(records: bytes) -> bytes:
    """A PAX extended header ('x') with ``records`` as its payload, as tarfile writes it."""
    return _header("././@PaxHeader", len(records), tarfile.XHDTYPE) + _padded(records)


def record(key: str, value: str) -> bytes:
    """One PAX record, ``b"<length> <key>=<value>\\n"``, its length counting itself."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def fix_checksum(data: bytearray, at: int) -> None:
    """The checksum of the header at ``data[at:]`` made right again, as tar writes it."""
    header = data[at : at + BLOCK]
    header[148:156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\x00 " % sum(header)


def member(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + _padded(data)


def mtime(i: int) -> bytes:
    return record("mtime", f"1796160775.{i:07d}")  # one length for every i


def tar(*parts: bytes) -> bytes:
    return b"".join(parts) + bytes(END_SIZE)


def read(data: bytes, **kwargs) -> list[tuple[str, bytes]]:
    return list(iter_members(io.BytesIO(data), "s3://b/p.tar", **kwargs))


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers() if m.isreg()]


def test_repeated_mtime_headers_are_headers_like_the_first():
    parts = [pax(mtime(i)) + member(f"{i:06d}.json", b'{"i": %d}' % i) for i in range(50)]
    data = tar(*parts)
    assert pax(mtime(1))[:BLOCK] == pax(mtime(2))[:BLOCK]  # the headers skipped
    assert read(data) == tarfile_members(data) == [
        (f"{i:06d}.json", b'{"i": %d}' % i) for i in range(50)]


def test_shardwriter_shards_read_as_tarfile_reads_them(tmp_path):
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "w-%02d.tar"), maxcount=400, verbose=0) as sink:
        for i in range(400):
            sink.write({"__key__": f"s{i:05d}", "json": {"i": i, "t": "x" * (i % 50)}})
    data = (tmp_path / "w-00.tar").read_bytes()
    got = read(data)
    assert got == tarfile_members(data) and len(got) == 400


def record_of(key: str, length: int, fill: str = "0", last: str = "") -> bytes:
    """A record of ``key`` of exactly ``length`` bytes, its value ``fill``s then ``last``."""
    for count in range(length):
        made = record(key, fill * count + last)
        if len(made) == length:
            return made
    raise AssertionError(f"no {key} record of {length} bytes")


@pytest.mark.parametrize("key", ["path", "size"])
def test_a_meaningful_record_after_a_repeated_header_is_applied(key):
    # its header repeats the bytes of the mtime headers before it (same payload length),
    # but its one record sets the member's path or size
    first = mtime(0)
    body = record_of("path", len(first), "p") if key == "path" else \
        record_of("size", len(first), "0", "3")
    assert pax(body)[:BLOCK] == pax(first)[:BLOCK]
    data = tar(pax(first), member("a.txt", b"aaaa"),
               pax(body), member("b.txt", b"bbbb"),
               pax(mtime(2)), member("c.txt", b"cccc"))
    expected = tarfile_members(data)
    assert read(data) == expected
    assert expected[1] == (("p" * (len(body) - 9), b"bbbb") if key == "path" else
                           ("b.txt", b"bbb"))


def test_long_path_and_unknown_keys_in_pax():
    long_name = "dir/" + "n" * 200 + ".json"
    data = tar(pax(mtime(0)), member("a.txt", b"a"),
               pax(record("path", long_name) + record("mtime", "1.5")
                   + record("SCHILY.xattr.user.k", "v=w") + record("comment", "é")),
               member("short.json", b"{}"),
               pax(record("atime", "1.25")), member("b.txt", b"b"),
               pax(mtime(1)), member("c.txt", b"c"))
    assert read(data) == tarfile_members(data) == [
        ("a.txt", b"a"), (long_name, b"{}"), ("b.txt", b"b"), ("c.txt", b"c")]


def test_size_in_pax_overrides_the_header():
    payload = b"z" * 1000
    header = bytearray(_header("big.bin", 0))  # the header says 0 bytes; PAX says 1000
    data = tar(pax(mtime(0)), member("a.txt", b"a"),
               pax(record("size", "1000")), bytes(header), _padded(payload),
               pax(mtime(1)), member("b.txt", b"b"))
    assert read(data) == tarfile_members(data) == [
        ("a.txt", b"a"), ("big.bin", payload), ("b.txt", b"b")]


def _with_payload(first: bytes, payload: bytes) -> bytes:
    """A PAX header with the bytes of ``first``'s header and ``payload`` (of its length)."""
    assert len(payload) == len(first)
    return pax(first)[:BLOCK] + _padded(payload)


FIRST = mtime(0)  # b"28 mtime=1796160775.0000000\n"


@pytest.mark.parametrize("payload", [
    FIRST[:-1] + b"0",  # no newline at the record's end
    b"27" + FIRST[2:-1] + b"\n",  # a record a byte short: the last byte starts another
    FIRST[:8] + b"_" + FIRST[9:],  # no "=" in the record
    b"2x" + FIRST[2:],  # a length that is not a number
    b"99" + FIRST[2:],  # a length past the payload
    FIRST[:3] + b"=" + FIRST[3:8] + FIRST[9:],  # an empty key
])
def test_malformed_records_after_a_repeated_header_are_refused(payload):
    data = tar(pax(FIRST), member("a.txt", b"a"), _with_payload(FIRST, payload),
               member("b.txt", b"b"))
    members = iter_members(io.BytesIO(data), "s3://b/p.tar")
    assert next(members) == ("a.txt", b"a")
    with pytest.raises(ShardError, match=r"s3://b/p.tar: bad PAX header at byte 2048"):
        next(members)


def test_a_sparse_record_after_a_repeated_header_is_refused():
    sparse = record_of("GNU.sparse.size", len(FIRST), "1")
    data = tar(pax(FIRST), member("a.txt", b"a"), _with_payload(FIRST, sparse),
               member("b.txt", b"b"))
    with pytest.raises(ShardError, match="sparse member"):
        read(data)


def test_two_pax_headers_for_one_member_are_refused_when_repeated():
    data = tar(pax(mtime(0)), member("a.txt", b"a"), pax(mtime(1)), pax(mtime(2)),
               member("b.txt", b"b"))
    with pytest.raises(ShardError, match="two PAX headers for one member"):
        read(data)


def test_a_repeated_header_at_the_end_is_an_error():
    body = pax(mtime(0)) + member("a.txt", b"a") + pax(mtime(1))
    with pytest.raises(ShardError, match="end-of-archive marker after an extended header"):
        read(body + bytes(END_SIZE))
    with pytest.raises(ShardError, match="stream ends after an extended header"):
        read(body)


def test_a_repeated_header_cut_short_is_truncated():
    body = pax(mtime(0)) + member("a.txt", b"a") + pax(mtime(1))
    cut = body[: len(body) - BLOCK + 10]  # the second header whole, its record cut
    members = iter_members(io.BytesIO(cut), "x")
    assert next(members) == ("a.txt", b"a")
    with pytest.raises(ShardError, match="truncated member"):
        next(members)


def test_a_repeated_header_past_the_recorded_length_is_refused():
    data = tar(pax(mtime(0)), member("a.txt", b"a"), pax(mtime(1)), member("b.txt", b"b"))
    limit = 2048 + BLOCK + 10  # inside the second PAX header's record
    with pytest.raises(ShardError, match=f"runs past the {limit} bytes") as error:
        read(data[:limit], limit=limit)
    assert not isinstance(error.value, ShardMismatchError)


def test_a_corrupt_header_after_repeated_ones_fails_its_checksum():
    parts = [pax(mtime(i)) + member(f"{i}.txt", b"x") for i in range(4)]
    data = bytearray(tar(*parts))
    data[2 * 2048 + 1024 + 3] ^= 0x04  # the third member's name, its checksum left as it was
    with pytest.raises(ShardError, match="bad header checksum at byte 5120"):
        read(bytes(data))
    data = bytearray(tar(*parts))
    data[2 * 2048 + 100] ^= 0x01  # the third PAX header's mode
    with pytest.raises(ShardError, match="bad header checksum at byte 4096"):
        read(bytes(data))
