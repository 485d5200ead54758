"""Hostile raw files (Arrow IPC, Parquet, JSON Lines, JSON arrays and their unit index): bytes patched so
that an array points outside its buffers, buffers and pages that expand enormously, headers
and footers that claim rows no bytes hold, and files whose cost grows with their size more
than linearly. Each attack runs in a subprocess under a memory limit and a timeout
(``run_limited``) and must end in wdstream's own error naming the file and where in it, or
in the documented skip, with bounded memory and time and no row dropped, invented or holding
bytes from outside the file.

A unit that fails is skipped whole under ``on_error="skip"`` (its rows are not handed out;
the others are): a file's unit here is the file (small files are one unit each)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.hostile.test_hostile_bombs import HEADROOM, run_limited
from wdstream.tables.arrow import _field, _message, _message_at, _offset, _table, batch_header

pytestmark = pytest.mark.usefixtures("single_rank")
MiB = 1 << 20


def read_all(limits: str = "None", on_error: str = "raise", expect=None) -> str:
    """Code iterating a StreamingDataset over ``paths[0]``; with ``expect``, asserting its
    ``(rows, characters of their text)`` (an AssertionError ends the runner: a failure)."""
    check = "" if expect is None else f"assert (rows, text) == {tuple(expect)}, (rows, text)"
    return f"""
        rows = text = 0
        for sample in StreamingDataset(paths[0], shuffle=False, share_manifest=False,
                                       limits={limits}, on_error={on_error!r}):
            rows += 1
            if sample is not None and isinstance(sample.get("text"), str):
                text += len(sample["text"])
        {check}
    """


def assert_refused(outcome: dict, kind: str, *words: str, seconds: float = 60) -> None:
    assert outcome["error"] == kind, outcome
    for word in words:
        assert word in outcome["message"], (word, outcome["message"])
    assert outcome["grown"] < HEADROOM, outcome
    assert outcome["seconds"] < seconds, outcome


# ---- Arrow IPC -------------------------------------------------------------------------------


def messages(data: bytes) -> list[tuple[int, int, int]]:
    """``(start, body start, body end)`` of each message of an IPC stream's bytes."""
    view, pos, found = memoryview(data), 0, []
    while pos < len(data) and data[pos:pos + 8] != b"\xff\xff\xff\xff\x00\x00\x00\x00":
        _, body, end = _message_at(view, pos)
        found.append((pos, body, end))
        pos = end
    return found


def saved_arrow(folder: Path, rows: int = 3000) -> Path:
    """The one ``.arrow`` file datasets' save_to_disk writes for id and text columns."""
    import datasets

    datasets.Dataset.from_dict({"id": list(range(rows)),
                                "text": [f"row {i} " * 5 for i in range(rows)]}
                               ).save_to_disk(str(folder), num_shards=1)
    [path] = folder.glob("*.arrow")
    return path


def patched_offset(path: Path, out: Path, value: int, batch: int = 1, slot: int = 10) -> Path:
    """``path`` with offset ``slot`` of the text column's offsets in record batch ``batch``
    set to ``value``."""
    data = bytearray(path.read_bytes())
    start = 8 if data[:6] == b"ARROW1" else 0
    found = messages(bytes(data[start:]))
    _, body, _ = found[batch]
    header = bytes(data[start + found[batch][0]:start + body])
    _, buffers, _ = batch_header(header[8:])
    at = start + body + buffers[3][0] + 4 * slot  # id: validity, values; text: validity, offsets
    data[at:at + 4] = value.to_bytes(4, "little", signed=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(data))
    return out


@pytest.mark.slow
def test_arrow_offsets_outside_their_buffers_are_refused(tmp_path):
    """Offsets of a saved dataset's text column patched to point past the data buffer, far
    past it, backwards: a ShardError naming the file and the batch, never a sample of
    foreign bytes or a crash (the runner would exit with SIGSEGV); the IPC file format too;
    under on_error="skip" the batch's rows are skipped, the others read as they are."""
    import pyarrow as pa

    saved = saved_arrow(tmp_path / "saved")
    cases = {name: patched_offset(saved, tmp_path / name / "data.arrow", value)
             for name, value in [("past", 1 << 20), ("huge", 1 << 30), ("back", -5),
                                 ("negative", -(1 << 30))]}
    table = pa.ipc.open_stream(saved.read_bytes()).read_all()
    file_format = tmp_path / "ipc-file" / "whole.arrow"
    file_format.parent.mkdir()
    with pa.ipc.new_file(file_format, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    cases["file"] = patched_offset(file_format, tmp_path / "file" / "data.arrow", 1 << 20)
    text = sum(len(f"row {i} " * 5) for i in range(3000))
    outcomes = run_limited(*[(read_all(), [path.parent]) for path in cases.values()],
                           (read_all(on_error="skip", expect=(0, 0)), [cases["past"].parent]),
                           (read_all(expect=(3000, text)), [saved.parent]))
    for path, outcome in zip(cases.values(), outcomes, strict=False):
        assert_refused(outcome, "ShardError", str(path), "the record batch at byte",
                       "not valid Arrow")
    assert outcomes[-1]["error"] is None and outcomes[-2]["error"] is None, outcomes


def duplicated_batch(schema, batch, times: int, compression: str | None) -> bytes:
    """An IPC stream of ``batch`` ``times`` over: its message written once, its bytes
    repeated (a bomb costs what one batch costs to compress)."""
    import pyarrow as pa

    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema,
                           options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_batch(batch)
    data = sink.getvalue()
    schema_end = messages(data)[0][2]
    body = data[schema_end:-8]
    return data[:schema_end] + body * times + data[-8:]


def claimed_rows(data: bytes, rows: int) -> bytes:
    """The stream ``data`` with each record batch's header claiming ``rows`` rows (each
    must have a length written: not 0, a flatbuffer's default)."""
    out = bytearray(data)
    for start, body, _ in messages(data)[1:]:
        header = bytes(data[start + 8:body])
        message = _message(header)
        batch = _table(header, _offset(header, message, 2))
        at = start + 8 + _field(header, batch, 0)
        out[at:at + 8] = rows.to_bytes(8, "little")
    return bytes(out)


@pytest.mark.slow
def test_arrow_compression_bombs_and_claimed_rows(tmp_path):
    """A 32-batch stream of zstd (and lz4) buffers that decompresses to 8 GiB is planned
    without decompressing (its rows counted from the headers), and refused from its
    declared sizes past unit_bytes; a prefix claiming 1 TiB is refused; 1,000 empty batches
    claiming 2^31-1 rows each (with a column, and without any) are a ShardError while the
    dataset is built, not an epoch of 2x10^12 rows."""
    import numpy as np
    import pyarrow as pa

    zeros = pa.record_batch([pa.array(np.zeros(256 * MiB, np.int8))], names=["x"])
    files = {}
    for codec in ("zstd", "lz4"):
        files[codec] = tmp_path / codec / "bomb.arrow"
        files[codec].parent.mkdir()
        files[codec].write_bytes(duplicated_batch(zeros.schema, zeros, 32, codec))
    assert files["zstd"].stat().st_size < 600_000
    small = pa.record_batch([pa.array(np.zeros(4096, np.int8))], names=["x"])
    data = bytearray(duplicated_batch(small.schema, small, 1, "zstd"))
    _, body, _ = messages(bytes(data))[1]
    data[body:body + 8] = (1 << 40).to_bytes(8, "little")  # the buffer's uncompressed length
    files["prefix"] = tmp_path / "prefix" / "claim.arrow"
    files["prefix"].parent.mkdir()
    files["prefix"].write_bytes(bytes(data))
    empty = pa.record_batch([pa.array([0], pa.int8())], names=["x"])  # one row, patched
    none = pa.RecordBatch.from_struct_array(pa.array([{}], pa.struct([])))
    for name, batch in (("claims", empty), ("no-columns", none)):
        files[name] = tmp_path / name / "claims.arrow"
        files[name].parent.mkdir()
        files[name].write_bytes(claimed_rows(
            duplicated_batch(batch.schema, batch, 1000, None), 2**31 - 1))
    count = """
        ds = StreamingDataset(paths[0], shuffle=False, share_manifest=False)
        assert len(ds) == 32 * 256 * 2**20, len(ds)
    """
    outcomes = run_limited(
        (count, [files["zstd"].parent]), (count, [files["lz4"].parent]),
        *[(read_all("Limits(unit_bytes='64MiB')"), [files[c].parent]) for c in ("zstd", "lz4")],
        (read_all(), [files["prefix"].parent]),
        (read_all(), [files["claims"].parent]), (read_all(), [files["no-columns"].parent]))
    assert outcomes[0]["error"] is None and outcomes[1]["error"] is None, outcomes[:2]
    assert outcomes[0]["seconds"] < 30 and outcomes[0]["grown"] < 200 * MiB, outcomes[0]
    for codec, outcome in zip(("zstd", "lz4"), outcomes[2:4], strict=True):
        assert_refused(outcome, "LimitError", str(files[codec]), "the record batch at byte",
                       "268,435,456 bytes decoded", "unit_bytes")
    assert_refused(outcomes[4], "LimitError", str(files["prefix"]), "1,099,511,627,776",
                   "unit_bytes")
    for name, outcome in zip(("claims", "no-columns"), outcomes[5:], strict=True):
        assert_refused(outcome, "ShardError", str(files[name]), "claims 2147483647 rows",
                       "a row takes at least a bit", seconds=10)


# ---- Parquet -------------------------------------------------------------------------------


def dictionary_bomb(path: Path, value_bytes: int, rows: int) -> Path:
    """A Parquet file of one column: a dictionary of one ``value_bytes`` value and ``rows``
    indices to it (run-length encoded: a few bytes), without the Arrow schema that would
    have it read as a dictionary."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)),
                                            pa.array(["x" * value_bytes]))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": column}), path, compression="zstd", store_schema=False,
                   row_group_size=rows)
    return path


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def overstated(source: Path, out: Path, rows: int, claim: int) -> Path:
    """``source`` (one row group of ``rows``) with its footer claiming ``claim`` rows, in
    the row group and the file, and as many values in each column chunk (i64 fields that
    follow the field before: the bytes 0x16 and the varint)."""
    data = source.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length:-8]
    old, new = b"\x16" + varint(2 * rows), b"\x16" + varint(2 * claim)
    assert footer.count(old) == 4, footer.count(old)  # the file, the group, 2 columns
    footer = footer.replace(old, new)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data[:-8 - length] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    return out


@pytest.mark.slow
def test_parquet_dictionary_bombs_and_overstated_rows(tmp_path):
    """A file of a few KB whose one dictionary entry (1 MiB) is repeated by a million
    indices (a TiB decoded) is refused from its page headers before pyarrow decodes it; so
    is one within the default limit but past a lower unit_bytes; a footer that claims more
    rows than the pages hold (2^31-1, and 8 x the truth) is a ShardError; the same file as
    written reads every row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bomb = dictionary_bomb(tmp_path / "bomb" / "bomb.parquet", MiB, 1 << 20)
    assert bomb.stat().st_size < 20_000
    small = dictionary_bomb(tmp_path / "small" / "small.parquet", 1024, 64 * 1024)
    rows = [{"id": i, "text": f"row {i}"} for i in range(100)]
    plain = tmp_path / "plain" / "plain.parquet"
    plain.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), plain)
    claims = [overstated(plain, tmp_path / f"claim{claim}" / "c.parquet", 100, claim)
              for claim in (2**31 - 1, 800)]
    text = sum(len(row["text"]) for row in rows)
    outcomes = run_limited(
        (read_all(), [bomb.parent]),
        (read_all("Limits(unit_bytes='32MiB')"), [small.parent]),
        (read_all(expect=(64 * 1024, 64 * 1024 * 1024)), [small.parent]),
        *[(read_all(), [claim.parent]) for claim in claims],
        (read_all(expect=(100, text)), [plain.parent]),
        ("wdstream.pack([paths[0]], paths[1])", [bomb, tmp_path / "packed"]))
    assert_refused(outcomes[0], "LimitError", str(bomb), "row group 0, column 'text'",
                   "unit_bytes")
    assert_refused(outcomes[1], "LimitError", str(small), "unit_bytes")
    assert outcomes[2]["error"] is None, outcomes[2]
    for claim, outcome in zip(claims, outcomes[3:5], strict=True):
        assert_refused(outcome, "ShardError", str(claim), "row group 0",
                       "its pages hold 100 values; the footer claims", seconds=10)
    assert outcomes[5]["error"] is None, outcomes[5]
    assert_refused(outcomes[6], "InputError", str(bomb), "rows 1-1048576", "65536 MiB",
                   "the most pack decodes from one row group")


def test_a_footer_is_parsed_once_per_file_not_per_row_group(tmp_path, monkeypatch):
    """A file of 20,000 one-row groups (a footer of 3 MB): reading every row parses its
    footer a few times (planning, the columns, the reader), not once per row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import wdstream
    from wdstream.tables import parquet

    folder = tmp_path / "groups"
    folder.mkdir()
    pq.write_table(pa.table({"text": [f"r{i}" for i in range(20_000)]}),
                   folder / "g.parquet", row_group_size=1)
    calls = []
    real = parquet.parse_footer
    monkeypatch.setattr(parquet, "parse_footer", lambda *a: calls.append(1) or real(*a))
    texts = [s["text"] for s in wdstream.StreamingDataset(str(folder), shuffle=False,
                                                          share_manifest=False)]
    assert texts == [f"r{i}" for i in range(20_000)]
    assert len(calls) <= 3, len(calls)


# ---- JSON Lines ------------------------------------------------------------------------------


def zstd_of(piece: bytes, times: int) -> bytes:
    """``piece`` ``times`` over, as that many zstd frames of it (compressed once)."""
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(piece) * times


@pytest.mark.slow
def test_json_lines_blank_line_bombs_and_deep_rows(tmp_path):
    """A .jsonl.zst of 4 GiB of blank lines (a few hundred KB) is refused while planning in
    seconds, past 2^31-1 lines, or past a lower shard_bytes; rows among 256 MiB of blank
    lines plan and read in seconds, none dropped or invented; the user's limits reach JSON
    Lines (a line past sample_bytes); a row nested 100,000 deep is a ShardError, skipped
    under on_error="skip" with the other file's rows read."""
    folders = {name: tmp_path / name for name in ("blank", "sparse", "deep", "long")}
    for folder in folders.values():
        folder.mkdir()
    (folders["blank"] / "b.jsonl.zst").write_bytes(zstd_of(b"\n" * (16 * MiB), 256))
    assert (folders["blank"] / "b.jsonl.zst").stat().st_size < 1 * MiB
    row = json.dumps({"text": "x" * 10}).encode() + b"\n"
    (folders["sparse"] / "s.jsonl.zst").write_bytes(zstd_of(row + b"\n" * MiB, 256))
    (folders["sparse"] / "s.jsonl").write_bytes((row + b" \n\t\n" * (256 * 1024)) * 64)
    deep = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    (folders["deep"] / "a.jsonl").write_bytes(deep)
    (folders["deep"] / "b.jsonl").write_bytes(row * 7)
    (folders["long"] / "l.jsonl").write_bytes(row + json.dumps({"text": "y" * 4096}).encode())
    outcomes = run_limited(
        (read_all(), [folders["blank"]]),
        (read_all("Limits(shard_bytes='64MiB')"), [folders["blank"]]),
        (read_all(expect=(256 + 64, 320 * 10)), [folders["sparse"]]),
        (read_all(), [folders["deep"]]),
        (read_all(on_error="skip", expect=(7, 70)), [folders["deep"]]),
        (read_all("Limits(sample_bytes='1KiB')"), [folders["long"]]))
    assert_refused(outcomes[0], "ShardError", "b.jsonl.zst", "more than 2147483647 lines",
                   "blank ones included", seconds=45)
    assert_refused(outcomes[1], "LimitError", "b.jsonl.zst", "shard_bytes", seconds=10)
    assert outcomes[2]["error"] is None and outcomes[2]["seconds"] < 20, outcomes[2]
    assert_refused(outcomes[3], "ShardError", "a.jsonl: row 0", "nested deeper than 100")
    assert outcomes[4]["error"] is None, outcomes[4]
    assert_refused(outcomes[5], "ShardError", "l.jsonl", "longer than 1024 bytes")


@pytest.mark.slow
def test_json_arrays_never_closed_deep_or_broken(tmp_path):
    """A .json.zst (a few MB) of one string never closed over 1 GiB is refused past the
    longest row (256 MiB) while planning, without holding it, or past a lower shard_bytes; an
    element a million brackets deep, or a million "[" where objects should be, is a ShardError
    at once; an element that is not JSON fails its unit, skipped under on_error="skip" with
    the other file's rows read."""
    folders = {name: tmp_path / name for name in ("open", "deep", "brackets", "bad")}
    for folder in folders.values():
        folder.mkdir()
    (folders["open"] / "o.json.zst").write_bytes(
        zstd_of(b'[{"text": "', 1) + zstd_of(b"x" * (16 * MiB), 64))
    (folders["deep"] / "d.json").write_bytes(b'[{"text": ' + b"[" * 1_000_000)
    (folders["brackets"] / "b.json").write_bytes(b"[" * 1_000_000)
    (folders["bad"] / "a.json").write_bytes(b'[{"text": "a"}, {"text": 1,}]')
    (folders["bad"] / "b.json").write_text(json.dumps([{"text": "x" * 10}] * 7))
    source = "paths[0] + '/*.json*'"
    outcomes = run_limited(
        (read_all().replace("paths[0]", source), [folders["open"]]),
        (read_all("Limits(shard_bytes='64MiB')").replace("paths[0]", source),
         [folders["open"]]),
        (read_all().replace("paths[0]", source), [folders["deep"]]),
        (read_all().replace("paths[0]", source), [folders["brackets"]]),
        (read_all().replace("paths[0]", source), [folders["bad"]]),
        (read_all(on_error="skip", expect=(7, 70)).replace("paths[0]", source),
         [folders["bad"]]))
    assert_refused(outcomes[0], "ShardError", "o.json.zst: element 0 of the JSON array (byte 1)",
                   "is longer than 268435456 bytes")
    assert outcomes[0]["grown"] < 128 * MiB, outcomes[0]
    assert_refused(outcomes[1], "LimitError", "o.json.zst", "shard_bytes", seconds=10)
    assert_refused(outcomes[2], "ShardError", "d.json: element 0 of the JSON array (byte 1) "
                   "nests deeper than 100 levels", seconds=10)
    assert_refused(outcomes[3], "ShardError", "b.json: element 0 of the JSON array (byte 1) "
                   "is not a JSON object", seconds=10)
    assert_refused(outcomes[4], "ShardError", "a.json: row 1 (byte 16) is not JSON")
    assert outcomes[5]["error"] is None, outcomes[5]


# ---- the unit index of JSON Lines files ---------------------------------------------------


def write_index(folder: Path, index: Path, units: dict[str, list[list[int]]]) -> None:
    """An index of the JSON Lines files under ``folder`` (their real sizes and tags) whose
    units are ``units[name]``, as ``[start, end, rows]``."""
    from wdstream.tables.files import find_files
    from wdstream.tables.formats import FileUnits, Unit
    from wdstream.tables.unit_index import index_document

    files = find_files(str(folder))
    file_units = [FileUnits([Unit(s, r, 0, e) for s, e, r in units[f.name]]) for f in files]
    index.write_text(json.dumps(index_document(files, file_units)))


def test_an_index_cannot_make_one_read_cover_a_huge_file(tmp_path):
    """A unit of 3 GB (a sparse file) is refused when the index is read, as is one past a
    lower unit_bytes, rows more than its bytes could hold, and a compressed file cut in
    two: before any byte of the files is read."""
    import wdstream
    from wdstream.errors import ManifestError

    folder = tmp_path / "data"
    folder.mkdir()
    with open(folder / "huge.jsonl", "wb") as out:
        out.truncate(3 << 30)
    index = tmp_path / "index.json"
    cases = [({"huge.jsonl": [[0, 3 << 30, 1]]}, None, "at most 2,147,483,648 bytes a unit"),
             ({"huge.jsonl": [[0, 4 * MiB, 10], [4 * MiB, 3 << 30, 1]]}, "1MiB",
              "at most 1,048,576 bytes"),
             ({"huge.jsonl": [[0, 30, 11]]}, None, "11 rows in 30 bytes")]
    for units, limit, words in cases:
        write_index(folder, index, units)
        limits = wdstream.Limits(unit_bytes=limit) if limit else None
        with pytest.raises(ManifestError, match="huge.jsonl") as error:
            wdstream.StreamingDataset(str(folder), index=str(index), limits=limits,
                                      share_manifest=False)
        assert words in str(error.value)
    (folder / "huge.jsonl").unlink()
    (folder / "c.jsonl.gz").write_bytes(__import__("gzip").compress(b'{"a": 1}\n' * 10))
    size = (folder / "c.jsonl.gz").stat().st_size
    write_index(folder, index, {"c.jsonl.gz": [[0, 10, 5], [10, size, 5]]})
    with pytest.raises(ManifestError, match="a compressed file is one unit, not 2"):
        wdstream.StreamingDataset(str(folder), index=str(index), share_manifest=False)


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_an_index_that_miscounts_rows_is_an_error_and_its_fix_is_used(tmp_path, name):
    """An index that counts 5 or 9 rows where 7 are is an error naming the file when the
    unit is read (not 5 rows silently); the node's shared plan made from it is not used
    once the index is corrected in place: the corrected counts are."""
    import gzip

    import wdstream
    from wdstream.errors import ShardError

    folder, index, share = tmp_path / "data", tmp_path / "index.json", tmp_path / "shared"
    folder.mkdir()
    data = b"".join(json.dumps({"text": f"r{i}"}).encode() + b"\n" for i in range(7))
    (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    size = (folder / name).stat().st_size

    def stream(count: int) -> wdstream.StreamingDataset:
        write_index(folder, index, {name: [[0, size, count]]})
        return wdstream.StreamingDataset(str(folder), index=str(index), shuffle=False,
                                         share_manifest=str(share))

    for count, words in ((5, "hold more rows, not the 5"), (9, "hold 7 rows, not the 9")):
        ds = stream(count)
        assert len(ds) == count
        with pytest.raises(ShardError, match=name) as error:
            list(ds)
        assert words in str(error.value)
    fixed = stream(7)
    assert len(fixed) == 7
    assert [s["text"] for s in fixed] == [f"r{i}" for i in range(7)]
