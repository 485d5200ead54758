"""The tar reader's block scan (``wdstream.shards.tar_blocks``): runs of small members read as
lists (``TarMembers.batches()``, the way the stream reads shards) must give what reading them
one member at a time gives, errors included, wherever in a run the odd header sits; and the
scan must really read the usual shards (ours, tarfile's, webdataset's ShardWriter's)."""

from __future__ import annotations

import io
import tarfile

import pytest

from tests.shards.test_tar_reader import fix_checksum, member, mtime, pax, record, record_of, tar
from wdstream.errors import ShardError
from wdstream.shards.tar_reader import iter_members
from wdstream.shards.tar_writer import TarWriter

BLOCK = 512
RUN = 200  # members in a run: several times the headers the scan needs to start


def outcome(data: bytes, as_lists: bool, **kwargs) -> tuple[list, Exception | None]:
    """The members read before the first error, and that error (None: the tar read whole),
    read as lists (``batches()``) or one at a time."""
    members = iter_members(io.BytesIO(data), "s3://b/run.tar", **kwargs)
    got: list = []
    try:
        if as_lists:
            for batch in members.batches():
                got += batch
        else:
            got += members
    except Exception as error:  # compared; anything but a ShardError fails the tests
        return got, error
    return got, None


def outcome_both_ways(data: bytes, **kwargs) -> tuple[list, Exception | None]:
    """``outcome`` read as lists, which must be what reading one member at a time gives:
    the same members, then the same error."""
    lists, lists_error = outcome(data, True, **kwargs)
    one, one_error = outcome(data, False, **kwargs)
    assert lists == one and repr(lists_error) == repr(one_error), (lists_error, one_error)
    return lists, lists_error


def read_both(data: bytes, **kwargs) -> tuple[list, str | None]:
    """Members and error (its text), which must be the same read as lists and one at a
    time."""
    lists, lists_error = outcome_both_ways(data, **kwargs)
    assert lists_error is None or isinstance(lists_error, ShardError), lists_error
    return lists, None if lists_error is None else str(lists_error)


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers() if m.isreg()]


def pax_run(count: int = RUN, at: int | None = None, odd: bytes = b"") -> bytes:
    """Members each after an mtime PAX header (as ShardWriter writes them), with ``odd``
    in place of member ``at``'s."""
    parts = [pax(mtime(i)) + member(f"{i:05d}.json", b'{"i": %d}' % i) for i in range(count)]
    if at is not None:
        parts[at] = odd
    return tar(*parts)


def offset_of(data: bytes, name: bytes) -> int:
    return data.index(name) // BLOCK * BLOCK


def test_our_shards_are_read_by_the_scan(scanned):
    out = io.BytesIO()
    writer = TarWriter(out)
    expected = [(f"{i:06d}.txt", b"x" * (i * 37 % 1400)) for i in range(400)]
    for name, payload in expected:
        writer.add(name, payload)
    writer.close()
    assert read_both(out.getvalue()) == (expected, None)
    assert sum(scanned) >= 390


def test_shardwriter_shards_are_read_by_the_scan(tmp_path, scanned):
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "w-%02d.tar"), maxcount=400, verbose=0) as sink:
        for i in range(400):
            sink.write({"__key__": f"s{i:05d}", "json": {"i": i, "t": "x" * (i % 700)}})
    data = (tmp_path / "w-00.tar").read_bytes()
    assert read_both(data) == (tarfile_members(data), None)
    assert sum(scanned) >= 390


def test_a_bad_checksum_in_a_run_is_refused_where_it_is(scanned):
    data = bytearray(pax_run())
    at = offset_of(data, b"00030.json")
    data[at + 1] ^= 0x01  # the name changed, the checksum not
    members, error = read_both(bytes(data))
    assert [name for name, _ in members] == [f"{i:05d}.json" for i in range(30)]
    assert error == f"s3://b/run.tar: bad header checksum at byte {at}"
    assert sum(scanned) >= 29
    data = bytearray(pax_run())
    at = offset_of(data, b"00030.json") - 2 * BLOCK  # the PAX header before it
    data[at + 101] ^= 0x01  # its mode
    assert read_both(bytes(data))[1] == f"s3://b/run.tar: bad header checksum at byte {at}"


def test_a_header_inside_a_payload_is_payload(scanned):
    """A payload that holds whole, valid headers at block boundaries (a tar in a tar)."""
    inner = io.BytesIO()
    writer = TarWriter(inner)
    for i in range(40):
        writer.add(f"evil{i:03d}.json", b"{}")
    writer.close()
    parts = [member(f"{i:05d}.tar" if i == 20 else f"{i:05d}.json",
                    inner.getvalue() if i == 20 else b"%d" % i) for i in range(RUN)]
    data = tar(*parts)
    members, error = read_both(data)
    assert error is None and members == tarfile_members(data)
    assert [n for n, _ in members if n.startswith("evil")] == []
    assert members[20] == ("00020.tar", inner.getvalue())
    assert sum(scanned) >= RUN - 3  # but the first, the tar in a tar (large) and the next


@pytest.mark.parametrize("key", ["path", "size"])
def test_a_meaningful_record_in_a_run_is_applied(key, scanned):
    """A record of the mtime records' length (its PAX header the same bytes as theirs) that
    sets the member's path or size."""
    length = len(mtime(30))
    body = record_of("path", length, "p") if key == "path" else \
        record_of("size", length, "0", "3")
    assert pax(body)[:BLOCK] == pax(mtime(30))[:BLOCK]
    data = pax_run(at=30, odd=pax(body) + member("00030.json", b"abcdef"))
    members, error = read_both(data)
    assert error is None and members == tarfile_members(data)
    assert members[30] == (("p" * (length - 9), b"abcdef") if key == "path" else
                           ("00030.json", b"abc"))
    assert sum(scanned) >= RUN - 2


def test_a_record_of_another_key_or_length_in_a_run_is_read(scanned):
    odd = pax(record("mtime", "1796160775.5") + record("uname", "someone")) \
        + member("00030.json", b"x")
    data = pax_run(at=30, odd=odd)
    assert read_both(data) == (tarfile_members(data), None)
    odd = pax(record("mtime", "17961607751")) + member("00030.json", b"y")  # shorter
    data = pax_run(at=30, odd=odd)
    assert read_both(data) == (tarfile_members(data), None)
    assert sum(scanned) >= 2 * (RUN - 3)


@pytest.mark.parametrize("body", [
    mtime(30)[:-1] + b"0",  # no newline at its end
    b"2x" + mtime(30)[2:],  # a length that is not a number
    record("GNU.sparse.size", "100000000000000"),
])
def test_a_malformed_or_sparse_record_in_a_run_is_refused(body, scanned):
    data = pax_run(at=30, odd=pax(body) + member("00030.json", b"x"))
    members, error = read_both(data)
    assert len(members) == 30 and error is not None
    assert "bad PAX header" in error or "sparse member" in error


def test_other_entries_in_a_run_are_read_as_alone():
    """A directory, a link, a GNU long name, a prefixed name, two PAX headers: the general
    parser's rules, the same read as lists."""
    cases = {
        "directory": tarfile.TarInfo("somedir/"),
        "symlink": tarfile.TarInfo("00030.lnk"),
    }
    cases["directory"].type = tarfile.DIRTYPE
    cases["symlink"].type, cases["symlink"].linkname = tarfile.SYMTYPE, "00001.json"
    for info in cases.values():
        data = pax_run(at=30, odd=info.tobuf(tarfile.USTAR_FORMAT))
        assert read_both(data) == (tarfile_members(data), None)
    for name in ("k" * 150 + ".json", "d" * 90 + "/" + "e" * 60 + ".json"):  # GNU L, prefix
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(RUN):
                info = tarfile.TarInfo(name if i == 30 else f"{i:05d}.json")
                info.size = 2
                tf.addfile(info, io.BytesIO(b"{}"))
        data = out.getvalue()
        assert read_both(data) == (tarfile_members(data), None)
    data = pax_run(at=30, odd=pax(mtime(1)) + pax(mtime(2)) + member("00030.json", b"x"))
    assert "two PAX headers for one member" in read_both(data)[1]


def _with_size_field(part: bytes, field: bytes) -> bytes:
    """``part`` (a member: header, payload) with its header's size field replaced."""
    changed = bytearray(part)
    changed[124:136] = field
    fix_checksum(changed, 0)
    return bytes(changed)


@pytest.mark.parametrize("field", [
    b"000000001750",  # twelve digits, no terminator: 1,000
    b"00000001750 ",  # a space for the terminator
    b"00000001790\x00",  # not octal
    b" 0000001750\x00",  # a leading space
])
def test_size_fields_of_other_writers_in_a_run(field, scanned):
    """A run's last member (where no next header checks where it ends) with a size field the
    usual writers do not write: read as the general parser reads it."""
    last = member("00199.json", b"z" * 1000)
    data = pax_run(at=RUN - 1, odd=pax(mtime(RUN - 1)) + _with_size_field(last, field))
    members, error = read_both(data)
    if field == b"00000001790\x00":
        assert len(members) == RUN - 1 and "bad size field" in error
    else:
        assert error is None and members[-1] == ("00199.json", b"z" * 1000)
    assert sum(scanned) >= RUN - 2


@pytest.mark.parametrize("form", ["%07o\x00", "%06o7\x00", "%06o\x00\x00", "%06o  ", "colon"])
def test_checksum_fields_of_other_writers_in_a_run(form, scanned):
    """A member in the middle of a run with its checksum written another way (seven digits,
    a NUL for the space...), or with a digit too many, or with ':' (the digit after '7') as
    its last digit, the field then worth the checksum if it were a digit: read as the
    general parser reads it."""
    part = member("00100.json", b"x" * 700)
    header = bytearray(part[:BLOCK])
    header[148:156] = b" " * 8
    if form == "colon":
        while (sum(header) - 10) % 8:
            header[103] += 1  # a digit of the mode, which the reader does not read
        field = b"%05o:\x00 " % ((sum(header) - 10) // 8)
    else:
        field = (form % sum(header)).encode("latin-1")
    header[148:148 + len(field)] = field
    data = pax_run(at=100, odd=pax(mtime(100)) + bytes(header) + part[BLOCK:])
    members, error = read_both(data)
    if form in ("%06o7\x00", "colon"):  # the digits read are not the checksum
        assert len(members) == 100 and "bad header checksum" in error
    else:
        assert error is None and members[100] == ("00100.json", b"x" * 700)
    assert sum(scanned) >= 99


def _set_name_field(data: bytearray, index: int, field: bytes) -> None:
    """Member ``index``'s name field (100 bytes) in a ``pax_run`` set to ``field``."""
    at = offset_of(data, b"%05d.json" % index)
    data[at : at + 100] = field[:100].ljust(100, b"\x00")
    fix_checksum(data, at)


def test_names_of_any_bytes_in_a_run(scanned):
    """The scan decodes a run's names together; names holding a newline, bytes that are not
    UTF-8, bytes after the name's NUL or no NUL at all read as they do one at a time."""
    data = bytearray(pax_run())
    for index, field in [(20, b"00020\n.json"), (21, b"\xff\xfe.json"),
                         (22, b"00022.json\x00junk"), (23, b"%099d.j" % 23)]:
        _set_name_field(data, index, field)
    members, error = read_both(bytes(data))
    assert error is None and len(members) == RUN
    assert [name for name, _ in members[20:24]] == [
        "00020\n.json", "\udcff\udcfe.json", "00022.json", f"{23:099d}.j"[:100]]
    assert sum(scanned) >= RUN - 1
    # the same names in separate runs, one odd name each
    for field in (b"00020\n.json", b"00022.json\x00junk"):
        data = bytearray(pax_run())
        _set_name_field(data, 20, field)
        members, error = read_both(bytes(data))
        assert error is None and members[20][0] == field.split(b"\x00")[0].decode()


def test_empty_members_in_a_run(scanned):
    """An empty regular member named like a directory is a directory entry (skipped); an
    empty file is a member."""
    data = pax_run(at=30, odd=pax(mtime(30)) + member("somedir/", b""))
    data = data.replace(member("00031.json", b'{"i": 31}'), member("00031.json", b""))
    members, error = read_both(data)
    assert error is None and len(members) == RUN - 1
    assert "somedir/" not in dict(members) and dict(members)["00031.json"] == b""
    assert sum(scanned) >= RUN - 2

def test_a_run_cut_short_or_past_its_recorded_length(scanned):
    data = pax_run()
    at = offset_of(data, b"00150.json")
    members, error = read_both(data[: at + BLOCK + 3])
    assert len(members) == 150 and "truncated member" in error
    members, error = read_both(data[: at + BLOCK + 3], limit=at + BLOCK + 3)
    assert len(members) == 150 and f"runs past the {at + BLOCK + 3} bytes" in error
    assert sum(scanned) >= 2 * 149


def test_a_payload_for_the_target_in_a_run_goes_to_it(scanned):
    large = bytes(range(256)) * 160  # 40 KiB: offered to a payload target
    data = pax_run(at=30, odd=pax(mtime(30)) + member("00030.json", large))
    offered = []

    def target(name, size, region):
        offered.append((name, size))
        memory = bytearray(size)
        return memory, memoryview(memory)

    members, error = read_both(data, payload_target=target)
    assert error is None and offered == [("00030.json", len(large))] * 2  # once per read
    assert members[30] == ("00030.json", bytearray(large))
    assert members[:30] + members[31:] == [m for m in tarfile_members(data) if m[0] != "00030.json"]
