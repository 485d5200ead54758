"""Parquet files streamed where they lie: a folder (at any depth), a pattern and a list,
local, through the moto S3 server and the GCS emulator; row groups as the plan's units, so the order is a
function of (seed, epoch), ranks get equal batches, resume is exact on the same layout and
elastic on another; columns read as asked; changed, truncated and hostile files are errors
that name the file."""

from __future__ import annotations

import os

import pytest

import wdstream
from tests.support.llm_data import as_rank
from tests.support.raw_data import (
    PARQUET_FILES,
    all_keys,
    counted,
    keys_of,
    loader_of,
    roundtrip,
    take,
    upload_tree,
    write_parquet,
)
from wdstream.errors import InputError, ManifestError, ShardError, ShardMismatchError

pytestmark = pytest.mark.usefixtures("single_rank")
TOTAL = sum(count for _, count, _ in PARQUET_FILES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("parquet"))


def test_a_folder_streams_every_row_once_with_its_columns(folder):
    ds = wdstream.StreamingDataset(str(folder), seed=3)
    assert list(ds.shards.samples) == [40, 30, 20, 20, 3, 30, 30, 30, 23]
    assert len(ds) == TOTAL
    batches = list(wdstream.DataLoader(ds, batch_size=5, num_workers=2))
    seen = counted(keys_of(batches))
    assert set(seen) == all_keys() and max(seen.values()) == 1
    assert tuple(batches[0]["tokens"].shape) == (5, 3)  # a list column: stacked, no lists
    for batch in batches:
        for key, text, url, tokens in zip(batch["__key__"], batch["text"], batch["__url__"],
                                          batch["tokens"], strict=True):
            name, row = key.rsplit(":", 1)
            assert text == f"{name} row {row}"
            assert url == os.path.join(str(folder), name)
            assert list(tokens) == [int(row), int(row) + 1, int(row) + 2]


@pytest.mark.slow
def test_the_order_is_a_function_of_seed_and_epoch(folder):
    first = keys_of(loader_of(str(folder)))
    assert keys_of(loader_of(str(folder))) == first
    assert keys_of(loader_of(str(folder), seed=4)) != first
    loader = loader_of(str(folder))
    loader.dataset.set_epoch(1)
    assert keys_of(loader) != first


def test_columns_read_only_their_chunks(folder, monkeypatch):
    from wdstream.tables import parquet

    spent = []
    reads = parquet.read_range
    monkeypatch.setattr(parquet, "read_range",
                        lambda file, start, length, access: spent.append(length)
                        or reads(file, start, length, access))

    def bytes_read(**options):
        ds = wdstream.StreamingDataset(str(folder), shuffle=False, **options)
        spent.clear()  # the row groups' reads, not the footers'
        samples = list(ds)
        return samples, sum(spent)

    everything, all_bytes = bytes_read()
    texts, text_bytes = bytes_read(columns=["text"])
    assert {k for s in texts for k in s} == {"text", "__key__", "__url__"}
    assert [s["text"] for s in texts] == [s["text"] for s in everything]
    assert text_bytes < all_bytes * 0.6
    keyed, _ = bytes_read(columns=["text"], key_column="id")
    assert [s["__key__"] for s in keyed] == [str(s["id"]) for s in everything]
    assert "id" not in keyed[0]


@pytest.mark.slow
def test_resume_is_exact_on_the_same_layout(folder):
    whole = keys_of(loader_of(str(folder)))
    loader = loader_of(str(folder))
    first = keys_of(take(loader, 7))
    resumed = loader_of(str(folder))
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(resumed) == whole


def test_resume_on_other_workers_and_batch_size_reads_every_row_once(folder):
    loader = loader_of(str(folder), batch_size=5, workers=2)
    first = keys_of(take(loader, 9))
    resumed = loader_of(str(folder), batch_size=3, workers=1)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    seen = counted(first, keys_of(resumed))
    assert set(seen) == all_keys() and max(seen.values()) == 1


@pytest.mark.slow
def test_ranks_get_equal_batches_and_resume_on_another_world_size(folder, monkeypatch):
    def run(world, state=None, n=None):
        out = []
        for rank in range(world):
            as_rank(monkeypatch, rank, world)
            loader = loader_of(str(folder), batch_size=4, workers=2)
            if state is not None:
                loader.load_state_dict(state)
            out.append(keys_of(take(loader, n) if n else loader))
            if rank == 0:
                saved = roundtrip(loader.state_dict())
        return out, saved

    whole, _ = run(3)
    assert len({len(b) for b in whole}) == 1
    seen = counted(*whole)
    assert max(seen.values()) == 1 and len(all_keys() - set(seen)) == TOTAL % 3
    first, state = run(2, n=6)
    rest, _ = run(3, state)
    assert len({len(b) for b in rest}) == 1
    seen = counted(*first, *rest)
    assert max(seen.values()) == 1 and len(all_keys() - set(seen)) < 3


@pytest.mark.slow
def test_s3_folder_pattern_and_list(s3, s3_bucket, folder):
    url = upload_tree(s3.client(), s3_bucket, folder, "hub/data")
    whole = keys_of(loader_of(url))
    seen = counted(whole)
    assert set(seen) == all_keys() and max(seen.values()) == 1
    assert keys_of(loader_of(url)) == whole
    top = counted(keys_of(loader_of(url + "part-*.parquet")))
    assert set(top) == {k for k in all_keys() if k.startswith("part-")}
    listed = wdstream.StreamingDataset([url + "part-1.parquet", url + "train/part-2.parquet"])
    assert len(listed) == 43 + 113
    assert list(listed)[0]["__url__"].startswith(url)
    loader = loader_of(url)
    first = keys_of(take(loader, 6))
    resumed = loader_of(url)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(resumed) == whole


@pytest.mark.slow
@pytest.mark.parametrize("read", ["one GET a range", "ranged parts"])
def test_s3_file_changed_since_the_plan_is_an_error(s3, s3_bucket, folder, monkeypatch, read):
    from wdstream.sources import range_reads, s3_objects

    if read == "ranged parts":  # a range read as open_read's stream
        monkeypatch.setattr(range_reads, "ONE_REQUEST_BYTES", 0)

    head = s3_objects.head

    def no_head(url, *args):
        assert not url.endswith(".parquet"), f"a HEAD of {url}: the GETs carry the listed ETag"
        return head(url, *args)

    monkeypatch.setattr(s3_objects, "head", no_head)
    url = upload_tree(s3.client(), s3_bucket, folder, "changing")
    ds = wdstream.StreamingDataset(url, shuffle=False, retries=0)
    assert len(list(ds)) == len(ds)
    s3.client().upload_file(str(folder / "part-1.parquet"), s3_bucket, "changing/part-0.parquet")
    with pytest.raises(ShardMismatchError, match=r"part-0.parquet: changed since the plan \(the "
                                                 r"store no longer holds version \""):
        list(ds)


def test_a_rewritten_or_truncated_local_file_is_an_error_naming_it(tmp_path):
    write_parquet(tmp_path)
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False, retries=0)
    path = tmp_path / "part-1.parquet"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ShardMismatchError, match="part-1.parquet: changed since the plan"):
        list(ds)


def hostile(tmp_path, tail: bytes) -> str:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 200 + tail)
    return str(path)


def test_a_footer_claiming_gigabytes_is_refused_before_it_is_read(tmp_path):
    source = hostile(tmp_path, (3 * 2**30).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(ShardError, match=r"bad.parquet: its footer claims 3221225472 bytes"):
        wdstream.StreamingDataset(source)


def test_a_garbage_footer_is_a_clean_error(tmp_path):
    source = hostile(tmp_path, b"\x19\xff" * 40 + (80).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(ShardError, match=r"bad.parquet: its footer cannot be read"):
        wdstream.StreamingDataset(source)


def test_a_footer_pointing_outside_the_file_is_a_clean_error(tmp_path, folder):
    data = (folder / "part-0.parquet").read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    source = hostile(tmp_path, data[-(length + 8):])  # the real footer over 200 bytes
    ds = wdstream.StreamingDataset(source, retries=0)
    with pytest.raises(ShardError, match=r"bad.parquet: row group 0, column 'id': bytes .* "
                                         r"lie outside"):
        list(ds)


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"id,text\n1,a\n")
    with pytest.raises(ShardError, match="x.parquet: not a Parquet file"):
        wdstream.StreamingDataset(str(path))


def test_option_mistakes_fail_when_built(folder, tmp_path):
    with pytest.raises(InputError, match=r"part-0.parquet: no column 'txt' \(its columns: id, "):
        wdstream.StreamingDataset(str(folder), columns=["txt"])
    with pytest.raises(InputError, match=r"part-0.parquet: no column 'uid' \(its columns: id, "):
        wdstream.StreamingDataset(str(folder), key_column="uid")
    with pytest.raises(InputError, match="columns must be a non-empty list"):
        wdstream.StreamingDataset(str(folder), columns="text")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ManifestError, match="no Parquet, JSON Lines or Arrow files"):
        wdstream.StreamingDataset(str(tmp_path))


@pytest.mark.slow
def test_gcs_folder_streams_and_resumes(gcs, tmp_path):
    flat = [("part-0.parquet", 70, 40), ("part-1.parquet", 43, 20)]
    from tests.sources.test_gcs_ranged import upload

    write_parquet(tmp_path, flat)
    for name, _, _ in flat:
        upload(gcs, f"raw-parquet/{name}", (tmp_path / name).read_bytes())
    url = f"gs://{gcs.bucket}/raw-parquet/"
    keys = {f"{name}:{i}" for name, count, _ in flat for i in range(count)}
    whole = keys_of(loader_of(url))
    seen = counted(whole)
    assert set(seen) == keys and max(seen.values()) == 1
    loader = loader_of(url)
    first = keys_of(take(loader, 4))
    resumed = loader_of(url)
    resumed.load_state_dict(roundtrip(loader.state_dict()))
    assert first + keys_of(resumed) == whole


@pytest.mark.slow
def test_gcs_file_changed_since_the_plan_is_an_error(gcs, tmp_path):
    from tests.sources.test_gcs_ranged import upload

    write_parquet(tmp_path, [("part-0.parquet", 30, 10), ("part-1.parquet", 20, 10)])
    for name in ("part-0.parquet", "part-1.parquet"):
        upload(gcs, f"changing/{name}", (tmp_path / name).read_bytes())
    ds = wdstream.StreamingDataset(f"gs://{gcs.bucket}/changing/", shuffle=False, retries=0)
    assert len(list(ds)) == 50
    upload(gcs, "changing/part-0.parquet", (tmp_path / "part-1.parquet").read_bytes())
    with pytest.raises(ShardMismatchError, match=r"part-0.parquet: changed since the plan \(the "
                                                 r"store no longer holds version \d+\)"):
        list(ds)
