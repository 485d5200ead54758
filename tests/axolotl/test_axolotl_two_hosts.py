"""``axolotl train`` with the plugin on two hosts of two processes each: network namespaces
joined by a veth pair (tests/support/hosts.py), ``accelerate launch --num_machines 2`` on
each, its rendezvous and gloo over the pair; alpaca and chats as raw Parquet on an S3 server
on the first host's address; each host cuts the files into units in a folder of its own, its
node-local cache (``WDSTREAM_SHARE_MANIFEST``). Packed SFT killed with SIGKILL on both hosts
after a checkpoint, resumed on the same two hosts, trains the batches of an uninterrupted
run, token for token; resumed on one host of two processes, each process first trains the
rows the same-numbered rank's buffer had left (token for token those it trained in the
uninterrupted run), and no example is trained twice.

The runs, the configs and the checks are those of test_axolotl_plugin.py."""

from __future__ import annotations

import os
import random
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_axolotl_plugin import (
    BIN,
    HERE,
    KILL_AT,
    SAVE_STEPS,
    check_packed,
    check_resumed,
    examples_of,
    recorded,
    run,
    sentence,
    sft_packed,
    write_jsonl,
    write_parquet_records,
    written,
)

from tests.support.hosts import TwoHosts, s3_on_host
from tests.support.servers import free_port

# four axolotl processes start at once on the machine's cores: 2-4 minutes a run, four runs
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

RUN_TIMEOUT = 900
# records: each of the 4 streams packs its whole share (~180 records, 35-40 rows of 512
# tokens) in one buffer, which outlasts the run (12 batches of 2 rows per rank)
ALPACA, CHATS, BUFFER = 480, 240, 400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The two hosts, the model, and the datasets on an S3 server on host 0:
    (hosts, (root, bucket, environment)), the second as test_axolotl_plugin's ``work``."""
    why = TwoHosts.unavailable()
    if why is not None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("axolotl-two-hosts")
    rng = random.Random(11)
    texts = write_jsonl(root / "texts.jsonl", [{"text": sentence(rng, 5, 60)}
                                              for _ in range(80)])
    run([sys.executable, str(HERE / "tiny_model.py"), str(root / "model"), str(texts)], root)
    alpaca = write_parquet_records(root / "alpaca-raw", [
        {"instruction": sentence(rng, 3, 8), "input": sentence(rng, 0, 4),
         "output": sentence(rng, 2, 10)} for _ in range(ALPACA)])
    chats = write_parquet_records(root / "chats-raw", [
        {"messages": [{"role": "user", "content": sentence(rng, 3, 8)},
                      {"role": "assistant", "content": sentence(rng, 2, 10)}]}
        for _ in range(CHATS)])
    folders = {"alpaca-raw": alpaca, "chats-raw": chats}
    with TwoHosts() as hosts, s3_on_host(hosts, "axolotl-hosts", folders) as (_urls, env):
        s3_env = {key: value for key, value in env.items() if key.startswith("AWS_")}
        yield hosts, (root, "axolotl-hosts", s3_env)


def make(work, out: str) -> dict:
    """test_axolotl_plugin's packed SFT mixture (alpaca and chats), with a buffer that holds
    a stream's whole share; the optimizer not saved (CPU: see its two-process test)."""
    cfg = dict(sft_packed(work, out), save_only_model=True)
    cfg["wdstream"] = {"packing_buffer": BUFFER}
    return cfg


def train_on_hosts(cluster, cfg: dict, name: str, nodes: int = 2, kill_at: int = 0,
                   expect: int | None = 0) -> list[list[dict]]:
    """``axolotl train`` as run ``name`` on ``nodes`` hosts (0, then 1) of 2 processes
    each, every host with its own node-local cache; the batches of each rank."""
    hosts, work = cluster
    root = work[0]
    path, env = written(work, cfg, name, kill_at)
    port = free_port()

    def node_run(node: int):
        where = (["--num_machines", "2", "--machine_rank", str(node), "--main_process_ip",
                  hosts.address(0)] if nodes == 2 else [])
        cmd = [os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", *where,
               "--num_processes", str(2 * nodes), "--main_process_port", str(port),
               "-m", "axolotl.cli.train", str(path)]
        node_env = dict(env, ACCELERATE_USE_CPU="true",
                        WDSTREAM_SHARE_MANIFEST=str(root / f"node-{node}"))
        if nodes == 2:
            node_env["GLOO_SOCKET_IFNAME"] = hosts.interface(node)
        return run(hosts.command(node, cmd), root, node_env, expect=expect,
                   timeout=RUN_TIMEOUT)

    with ThreadPoolExecutor(nodes) as pool:
        for done in [pool.submit(node_run, node) for node in range(nodes)]:
            done.result()
    return recorded(cfg, name, 2 * nodes)


def test_two_hosts_killed_and_resumed_on_the_same_hosts_and_on_one(cluster):
    hosts, work = cluster
    root = work[0]
    reference = train_on_hosts(cluster, make(work, "hosts-reference"), "hosts-reference")
    check_packed([batch for rank in reference for batch in rank])
    rows = [tuple(row) for rank in reference for batch in rank for row in batch["input_ids"]]
    assert len(set(rows)) == len(rows)  # no row on two ranks, or twice
    # each host cut the files into units in its own folder: one entry for each source
    for node in range(2):
        assert len(list((root / f"node-{node}").glob("*.units"))) == 2

    interrupted = make(work, "hosts-interrupted")
    killed = train_on_hosts(cluster, interrupted, "hosts-killed", kill_at=KILL_AT,
                            expect=None)
    checkpoint = Path(interrupted["output_dir"]) / f"checkpoint-{SAVE_STEPS}"
    assert {p.name for p in checkpoint.glob("wdstream_loader-*")} == {
        f"wdstream_loader-rank{r}.json" for r in range(4)}
    assert not (checkpoint.parent / f"checkpoint-{KILL_AT}").exists()

    resumed = train_on_hosts(cluster, interrupted, "hosts-resumed")
    for rank in range(4):
        check_resumed(reference[rank], killed[rank], resumed[rank])

    # on one host: each process first trains the rest of the same-numbered rank's buffer
    # (then those of ranks 2 and 3, past this run's steps)
    one_host = dict(interrupted, output_dir=str(root / "hosts-one"))
    copy_checkpoint(checkpoint, Path(one_host["output_dir"]))
    alone = train_on_hosts(cluster, one_host, "hosts-one", nodes=1)
    saved = SAVE_STEPS * 2  # micro-batches per rank before the checkpoint
    for rank in range(2):
        assert alone[rank] == reference[rank][saved:]
    trained = examples_of([b for rank in killed for b in rank[:saved]] +
                          [b for rank in alone for b in rank])
    assert len(trained) == len(set(trained))  # none twice


def copy_checkpoint(checkpoint: Path, output_dir: Path) -> None:
    """The killed run's checkpoint as the only one in ``output_dir`` (the resume on the same
    hosts wrote later ones into the run's own)."""
    output_dir.mkdir()
    shutil.copytree(checkpoint, output_dir / checkpoint.name)
