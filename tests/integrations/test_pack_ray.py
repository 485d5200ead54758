"""Packing on Ray (``wdstream.write.cluster.pack_on_ray``, ``wdstream pack --ray N``) on a local
Ray started here (``ray.init()``), with inputs and outputs on a folder and on the moto S3
server: the result is byte-identical to one machine's ``pack``, and a failed part publishes
nothing."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.servers import environ
from tests.write.test_pack import fail, folder_bytes, records, run, write_jsonl

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray(moto_server):
    """A 2-CPU Ray on this machine, its workers started with the S3 server's environment;
    yields the address a ``wdstream`` subprocess connects to (RAY_ADDRESS)."""
    with environ(moto_server.env):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


def _inputs(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", records(40))
    b = write_jsonl(tmp_path / "b.jsonl", records(33, 40))
    return [a, b]


def test_ray_pack_equals_one_machine_pack(tmp_path, local_ray, s3, s3_bucket):
    from wdstream.write.cluster import pack_on_ray
    from wdstream.write.packer import pack

    inputs = _inputs(tmp_path)
    pack(inputs, tmp_path / "one", max_count=6, key="id")
    manifest = pack_on_ray(inputs, tmp_path / "ray", parts=3, max_count=6, key="id")
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "ray")
    assert manifest.samples == 73 and manifest.url == str(tmp_path / "ray" / "index.json")

    # from S3 to S3, more parts than shards
    client = s3.client()
    for path in inputs:
        client.put_object(Bucket=s3_bucket, Key=f"raw/{path.name}", Body=path.read_bytes())
    pack_on_ray([f"s3://{s3_bucket}/raw/*.jsonl"], f"s3://{s3_bucket}/ds/", parts=16,
                max_count=6, key="id")
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="ds/")["Contents"]
    remote = {item["Key"][3:]: client.get_object(Bucket=s3_bucket, Key=item["Key"])["Body"].read()
              for item in listed}
    local = folder_bytes(tmp_path / "one")
    assert remote.keys() == local.keys()
    assert {n: d for n, d in remote.items() if n != "index.json"} == \
        {n: d for n, d in local.items() if n != "index.json"}
    assert json.loads(remote["index.json"])["shards"] == json.loads(local["index.json"])["shards"]


def test_a_failed_part_publishes_nothing(tmp_path, local_ray):
    from wdstream.errors import InputError
    from wdstream.write.cluster import pack_on_ray

    rows = [json.dumps(r) for r in records(60)]
    rows[45] = '{"id": "broken"'  # in shard 7 (6 a shard): part 1 of 3 owns it
    source = tmp_path / "bad.jsonl"
    source.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"bad.jsonl:46: malformed JSON"):
        pack_on_ray([source], out, parts=3, max_count=6)
    assert not out.exists() or list(out.iterdir()) == []
    with pytest.raises(InputError, match="no such file"):
        pack_on_ray([tmp_path / "missing.jsonl"], out, parts=2)


def test_cli_packs_on_ray(tmp_path, local_ray, cli_env):
    inputs = _inputs(tmp_path)
    env = {**cli_env, "RAY_ADDRESS": local_ray}
    run(["pack", f"{tmp_path}/*.jsonl", "--output", tmp_path / "one", "--max-count", 10,
         "--quiet"], cli_env)
    result = run(["pack", f"{tmp_path}/*.jsonl", "--output", tmp_path / "ray", "--max-count", 10,
                  "--ray", 4], env)
    assert b"samples" in result.stdout
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "ray")
    error = fail(["pack", *inputs, "--output", tmp_path / "ray", "--ray", 2], env)
    assert "already exists" in error
    assert "--part" in fail(["pack", *inputs, "--output", tmp_path / "x", "--ray", 2,
                             "--part", "0/2"], env)
    assert not os.path.exists(tmp_path / "x")
    rows = [json.dumps(r) for r in records(30)]
    rows[25] = "[1, 2]"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(rows) + "\n")
    error = fail(["pack", bad, "--output", tmp_path / "bad", "--max-count", 5, "--ray", 3], env)
    assert f"{bad}:26: expected a JSON object" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "bad").exists() or list((tmp_path / "bad").iterdir()) == []
