"""Two nodes of two ranks each, in network namespaces joined by a veth pair (tests/support/hosts.py),
read Parquet files from an S3 server on the first node's address: torchrun's rendezvous and
gloo go over the pair, and each node plans the files once in a folder of its own (its
node-local cache). A rank of the second node killed with SIGKILL and the job resumed on the
same two nodes gives exactly the batches of the uninterrupted run; resumed on the first node
alone, every row exactly once, equal batches on both ranks.

The job is tests/support/ddp_job.py, as in tests/integrations/test_ddp.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integrations.test_ddp import batch_lists, read_run
from tests.support.hosts import TwoHosts, s3_on_host
from tests.support.jobs import ROOT, script
from tests.support.raw_data import all_keys, counted, write_parquet
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

JOB = script("ddp_job.py")
SEED, WINDOW, BATCH, EVERY = 5, 8, 4, 4
RUN_TIMEOUT = 240


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The two hosts, an S3 server on host 0 holding the Parquet files, and what a client
    on either host needs to reach it: (hosts, url, environment)."""
    why = TwoHosts.unavailable()
    if why is not None:
        pytest.skip(why)
    folder = write_parquet(tmp_path_factory.mktemp("two-hosts-data"))
    with TwoHosts() as hosts, s3_on_host(hosts, "two-hosts", {"hub": folder}) as (urls, env):
        yield hosts, urls["hub"], env


def run_nodes(cluster, out, nodes: int, *args, expect_ok: bool = True):
    """The job on ``nodes`` hosts (0, then 1) of 2 ranks x 2 workers each, every node with
    its own planning folder under ``out``; the torchrun outputs, one per node."""
    hosts, url, env = cluster
    port = free_port()
    runs = []
    for node in range(nodes):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                   f"--node_rank={node}", "--nproc_per_node=2",
                   f"--master_addr={hosts.address(0)}", f"--master_port={port}",
                   "--monitor_interval=0.1", JOB, "--url", url, "--out", str(out),
                   "--seed", str(SEED), "--window", str(WINDOW), "--batch-size", str(BATCH),
                   "--workers", "2", "--share", str(out / f"node-{node}"), *map(str, args)]
        runs.append(subprocess.Popen(
            hosts.command(node, command), cwd=ROOT, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env={**env, "GLOO_SOCKET_IFNAME": hosts.interface(node)}))
    outputs = []
    for node, run in enumerate(runs):
        try:
            output, _ = run.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            for other in runs:
                other.kill()
            raise
        outputs.append((run.returncode, f"node {node}: exit {run.returncode}\n"
                                        f"{output[-6000:]}"))
    if expect_ok:
        assert all(code == 0 for code, _ in outputs), "\n".join(o for _, o in outputs)
    return outputs


def test_two_hosts_killed_and_resumed_on_the_same_hosts_and_on_one(cluster, tmp_path):
    full = tmp_path / "full"
    run_nodes(cluster, full, 2)
    run = read_run(full, 4)
    assert [r["meta"]["world"] for r in run] == [4] * 4
    # each node cut the 3 files into units once: one of its ranks read the footers, the other
    # its node's units
    assert sorted(r["meta"]["footers_read"] for r in run) == [0, 0, 3, 3]
    whole = batch_lists(run)
    assert len({len(b) for b in whole}) == 1 and len(whole[0]) > 2 * EVERY + 1
    seen = counted(*whole)
    assert max(seen.values()) == 1 and len(all_keys() - set(seen)) < 4 * 2 * BATCH

    killed, checkpoint = tmp_path / "killed", tmp_path / "ckpt.json"
    outputs = run_nodes(cluster, killed, 2, "--checkpoint", checkpoint, "--every", EVERY,
                        "--die-at", 2 * EVERY + 2, "--die-rank", 3, expect_ok=False)
    assert all(code != 0 for code, _ in outputs), outputs
    assert "(SIGKILL)" in outputs[1][1], outputs[1][1]
    saved = json.loads(checkpoint.read_text())
    assert saved["batch"] == 2 * EVERY
    before = batch_lists(read_run(killed, 4), upto=2 * EVERY)

    resumed = tmp_path / "resumed"
    run_nodes(cluster, resumed, 2, "--resume", checkpoint)
    after = batch_lists(read_run(resumed, 4))
    assert [b + a for b, a in zip(before, after, strict=True)] == whole

    one_node = tmp_path / "one-node"
    run_nodes(cluster, one_node, 1, "--resume", checkpoint)
    after = batch_lists(read_run(one_node, 2))
    assert len({len(a) for a in after}) == 1, "unequal batch counts across ranks"
    seen = counted(*before, *after)
    assert max(seen.values()) == 1, "a row delivered twice"
    assert len(all_keys() - set(seen)) < 2 * 2 * BATCH
