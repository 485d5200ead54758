"""Raw files cut into units once per node: the first process to build a dataset over a source leads
and publishes its units; the others wait for it and read no footer; an entry that describes
other files, or is damaged, is cut again; a job started again finds its entry."""

from __future__ import annotations

import threading

import pytest

import wdstream
from tests.sources.test_range_reads import gets_fixture  # noqa: F401 - the fixture gets
from tests.support.raw_data import upload_tree, write_parquet
from wdstream.tables import node_units
from wdstream.tables.files import find_files
from wdstream.tables.node_units import NodeUnits
from wdstream.tables.reads import Access
from wdstream.tables.units import cut_files

pytestmark = pytest.mark.usefixtures("single_rank")


@pytest.fixture
def folder(tmp_path):
    write_parquet(tmp_path / "data")
    return tmp_path / "data"


def _units_of(folder):
    files = find_files(str(folder / "train"))
    return files, cut_files(files, Access())


def _published(folder, tmp_path):
    """The files, their units, the shared folder and the entry published there for "src"."""
    files, file_units = _units_of(folder)
    share = str(tmp_path / "shared")
    with NodeUnits("src", None, share) as node:
        node.units(files, lambda: file_units)
    return files, file_units, share, node.path


def test_followers_wait_for_the_leader_and_cut_nothing(folder, tmp_path):
    files, file_units = _units_of(folder)
    share = str(tmp_path / "shared")
    leader = NodeUnits("s3://b/data/", None, share)
    follower = NodeUnits("s3://b/data/", None, share)
    assert leader.path is None and not leader.leader  # nothing touched before raw files
    assert (leader.lead(), leader.leader) == (True, True)
    assert (follower.lead(), follower.leader) == (False, False)
    got = []

    def follow():
        got.append(follower.units(files, lambda: pytest.fail("the follower cut")))

    waiting = threading.Thread(target=follow)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # until the leader is done
    assert leader.units(files, lambda: file_units) == file_units
    leader.close()
    waiting.join(5)
    follower.close()
    assert got == [file_units]
    with NodeUnits("s3://b/data/", None, share) as again:  # a job started again
        assert not again.lead() and again.leader
        assert again.units(files, lambda: pytest.fail("cut again")) == file_units
    with NodeUnits("s3://b/other/", None, share) as other:  # another source: its own entry
        assert other.lead()


def test_other_files_or_a_damaged_entry_are_cut_again(folder, tmp_path):
    files, file_units, share, path = _published(folder, tmp_path)
    changed = [files[0].__class__(files[0].url, files[0].name, files[0].size, "ETag:new"),
               *files[1:]]
    calls = []

    def cut():
        calls.append(1)
        return file_units

    with NodeUnits("src", None, share) as node:
        assert node.units(changed, cut) == file_units and calls == [1]
    data = open(path, "rb").read()
    for damaged in (data[:-1], data[:20], b"not an entry", data.replace(b'"units"', b'"unit"')):
        open(path, "wb").write(damaged)
        with NodeUnits("src", None, share) as node:
            assert node.units(changed, cut) == file_units
    assert len(calls) == 5
    assert node_units.read_entry(path, changed) == file_units  # published again, whole


def test_without_sharing_every_process_cuts(folder):
    files, file_units = _units_of(folder)
    with NodeUnits("src", None, False) as node:
        assert node.lead() and node.path is None and node.leader
        assert node.units(files, lambda: file_units) == file_units


def test_a_second_build_on_the_node_reads_no_footer(s3, s3_bucket, folder, tmp_path, gets):
    url = upload_tree(s3.client(), s3_bucket, folder / "train", "shared")
    share = str(tmp_path / "shared")
    first = wdstream.StreamingDataset(url, shuffle=False, share_manifest=share)
    assert gets  # the footers
    gets.clear()
    second = wdstream.StreamingDataset(url, shuffle=False, share_manifest=share)
    assert gets == []
    assert second.shards.fingerprint() == first.shards.fingerprint()
    assert [s["__key__"] for s in second] == [s["__key__"] for s in first]


def test_an_entry_others_may_write_or_a_link_is_not_used(folder, tmp_path):
    import os

    files, file_units, share, path = _published(folder, tmp_path)
    os.chmod(path, 0o666)
    assert node_units.read_entry(path, files) is None
    os.chmod(path, 0o600)
    os.rename(path, path + ".real")
    os.symlink(path + ".real", path)
    assert node_units.read_entry(path, files) is None
    with NodeUnits("src", None, share) as node:  # cut again, and published in its place
        assert node.units(files, lambda: file_units) == file_units
    assert not os.path.islink(path) and node_units.read_entry(path, files) == file_units


def test_a_source_of_shards_takes_no_lock_and_writes_nothing(s3, s3_bucket, tmp_path):
    from tests.support.shard_data import shard_bytes

    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shard-000000.tar").write_bytes(shard_bytes(0, 3))
    url = upload_tree(s3.client(), s3_bucket, tmp_path / "shards", "shards")
    share = tmp_path / "shared"
    assert len(list(wdstream.StreamingDataset(url, share_manifest=str(share)))) == 3
    assert not share.exists() or list(share.iterdir()) == []
