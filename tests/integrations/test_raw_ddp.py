"""Parquet files on the moto S3 server read by a DDP job under torchrun (tests/support/ddp_job.py,
2 ranks x 2 workers): one rank reads the footers and the other its plan; a rank killed with
SIGKILL and the job resumed from its checkpoint gives exactly the batches of the
uninterrupted run; resumed on 3 ranks, every row exactly once."""

from __future__ import annotations

import json

import pytest

from tests.integrations.test_ddp import batch_lists, read_run, torchrun
from tests.support.raw_data import all_keys, counted, upload_tree, write_parquet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def parquet_url(moto_server, tmp_path_factory):
    folder = write_parquet(tmp_path_factory.mktemp("raw-ddp"))
    client = moto_server.client()
    client.create_bucket(Bucket="raw-ddp")
    return upload_tree(client, "raw-ddp", folder, "hub")


def test_sigkill_then_resume_gives_the_uninterrupted_batches(moto_server, parquet_url,
                                                             tmp_path):
    full = tmp_path / "full"
    torchrun(moto_server, parquet_url, 2, full, "--workers", 2, "--checkpoint",
             full / "ckpt.json", "--every", 4, "--keep-checkpoints", "--share",
             tmp_path / "share")
    footers = sorted(run["meta"]["footers_read"] for run in read_run(full, 2))
    assert footers == [0, 3]  # one rank cut the node's 3 files into units, the other read them
    whole = batch_lists(read_run(full, 2))
    assert len(whole[0]) == len(whole[1])
    seen = counted(*whole)
    assert max(seen.values()) == 1 and len(all_keys() - set(seen)) < 2 * 4

    killed, checkpoint = tmp_path / "killed", tmp_path / "ckpt.json"
    result, output = torchrun(moto_server, parquet_url, 2, killed, "--workers", 2,
                              "--checkpoint", checkpoint, "--every", 4, "--die-at", 10,
                              "--die-rank", 1, expect_ok=False)
    assert result.returncode != 0 and "(SIGKILL)" in output, output
    saved = json.loads(checkpoint.read_text())
    assert saved["batch"] == 8
    resumed = tmp_path / "resumed"
    torchrun(moto_server, parquet_url, 2, resumed, "--workers", 2, "--resume", checkpoint)
    before = batch_lists(read_run(killed, 2), upto=8)
    after = batch_lists(read_run(resumed, 2))
    assert [b + a for b, a in zip(before, after, strict=True)] == whole

    elastic = tmp_path / "elastic"
    torchrun(moto_server, parquet_url, 3, elastic, "--workers", 1, "--resume", checkpoint)
    after = batch_lists(read_run(elastic, 3))
    assert len({len(a) for a in after}) == 1
    seen = counted(*before, *after)
    assert max(seen.values()) == 1 and len(all_keys() - set(seen)) < 3 * 4
