"""The JSON Lines unit index scanned by Ray tasks (``wdstream index SOURCE --output URL --ray
N``, ``wdstream.tables.ray_index.cut_on_ray``) on a local Ray started here: the index is the
one a single machine writes, a file that cannot be scanned is the task's own error naming
it, and no index is written then."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

import wdstream
from tests.support.raw_data import JSONL_FILES, jsonl_keys, write_jsonl
from wdstream.errors import InputError, ShardError
from wdstream.tables.files import RawFile, find_files
from wdstream.tables.ray_index import byte_runs, cut_on_ray
from wdstream.tables.reads import Access
from wdstream.tables.units import cut_files

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_rank")]


@pytest.fixture(scope="module")
def local_ray():
    """A 2-CPU Ray on this machine; yields the address a ``wdstream`` subprocess connects to."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def index(cli_env, *args, address=None):
    env = {**cli_env, "RAY_ADDRESS": address} if address else cli_env
    return subprocess.run(["wdstream", "index", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_index_is_the_one_machine_index(tmp_path, local_ray, cli_env):
    source = write_jsonl(tmp_path / "lines")
    one = index(cli_env, str(source), "--output", str(tmp_path / "one.json"), "-q")
    assert one.returncode == 0, one.stderr
    many = index(cli_env, str(source), "--output", str(tmp_path / "ray.json"), "--ray", "3",
                 address=local_ray)
    assert many.returncode == 0, many.stderr
    assert json.loads((tmp_path / "ray.json").read_text()) == \
        json.loads((tmp_path / "one.json").read_text())
    assert re.search(rf"files\W+{len(JSONL_FILES)}\b", many.stdout), many.stdout
    ds = wdstream.StreamingDataset(str(source), index=str(tmp_path / "ray.json"), shuffle=False)
    assert {s["__key__"] for s in ds} == jsonl_keys()


def test_more_tasks_than_files_and_the_order_kept(tmp_path, local_ray):
    source = write_jsonl(tmp_path / "lines")
    files = find_files(str(source))
    file_units = cut_on_ray(files, Access(), tasks=16)
    assert file_units == cut_files(files, Access())


def test_a_file_that_cannot_be_scanned_is_its_error_and_no_index(tmp_path, local_ray, cli_env):
    source = write_jsonl(tmp_path / "lines")
    (source / "b.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00 not gzip at all")
    files = find_files(str(source))
    with pytest.raises(ShardError, match="b.jsonl.gz"):
        cut_on_ray(files, Access(), tasks=2)
    failed = index(cli_env, str(source), "--output", str(tmp_path / "ray.json"), "--ray", "2",
                   address=local_ray)
    assert failed.returncode != 0 and "b.jsonl.gz" in failed.stderr, failed.stderr
    assert not (tmp_path / "ray.json").exists()


def test_option_mistakes(tmp_path, cli_env):
    with pytest.raises(InputError, match="at least 1"):
        cut_on_ray([], Access(), tasks=0)
    source = write_jsonl(tmp_path / "lines")
    wrong = subprocess.run(["wdstream", "index", str(source), "--ray", "2"], env=cli_env,
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "--ray" in wrong.stderr


def test_runs_of_about_equal_bytes_in_order():
    files = [RawFile(f"/d/{i}", str(i), size, "") for i, size in enumerate([50, 10, 10, 30, 0])]
    runs = byte_runs(files, 2)
    assert [[f.name for f in run] for run in runs] == [["0"], ["1", "2", "3", "4"]]
    assert [f.name for run in byte_runs(files, 99) for f in run] == ["0", "1", "2", "3", "4"]
    assert byte_runs(files[:1], 3) == [files[:1]]
