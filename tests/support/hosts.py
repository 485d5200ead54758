"""Two hosts on one machine: network namespaces joined by a veth pair, each with its own
address, as two nodes of a job see each other. Commands run on a host through
``ip netns exec``; everything else (files, processes) is the machine's. Needs root and
``ip``; ``TwoHosts.unavailable()`` says why not where they are missing."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.jobs import ROOT
from tests.support.servers import free_port

SUBNET = "10.213.7"  # addresses inside the two namespaces only: .1 and .2
# the job's own variables, which a node's launcher sets for its ranks
JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
UPLOAD = """
import json, sys, time, boto3
from pathlib import Path
from tests.support.raw_data import upload_tree
client = boto3.client("s3")
bucket, folders = sys.argv[1], json.loads(sys.argv[2])
for _ in range(100):
    try:
        client.create_bucket(Bucket=bucket)
        break
    except Exception:
        time.sleep(0.2)
print(json.dumps({prefix: upload_tree(client, bucket, Path(folder), prefix)
                  for prefix, folder in folders.items()}))
"""


class TwoHosts:
    """Hosts 0 and 1 (``namespace(h)``, ``address(h)``, ``interface(h)``); as a context
    manager they are made and, at the end, removed with everything they hold."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.namespaces = (f"wdstream-{tag}-a", f"wdstream-{tag}-b")
        self.interfaces = (f"wdv{tag}a", f"wdv{tag}b")  # at most 15 characters

    @staticmethod
    def unavailable() -> str | None:
        """Why two hosts cannot be made here, or None."""
        if shutil.which("ip") is None:
            return "no `ip` command"
        if os.geteuid() != 0:
            return "network namespaces need root"
        probe = f"wdstream-probe-{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"cannot make a network namespace: {made.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], check=True)
        return None

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def namespace(self, host: int) -> str:
        return self.namespaces[host]

    def interface(self, host: int) -> str:
        return self.interfaces[host]

    def command(self, host: int, command: list[str]) -> list[str]:
        """``command`` as run on ``host``."""
        return ["ip", "netns", "exec", self.namespaces[host], *command]

    def __enter__(self) -> TwoHosts:
        a, b = self.namespaces
        steps = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
                 ["ip", "link", "add", self.interfaces[0], "type", "veth", "peer", "name",
                  self.interfaces[1]]]
        for host in (0, 1):
            ns, interface = self.namespaces[host], self.interfaces[host]
            steps += [["ip", "link", "set", interface, "netns", ns],
                      self.command(host, ["ip", "addr", "add", f"{self.address(host)}/24",
                                          "dev", interface]),
                      self.command(host, ["ip", "link", "set", interface, "up"]),
                      self.command(host, ["ip", "link", "set", "lo", "up"])]
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True, text=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in self.namespaces:  # the veth pair goes with them
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def wait_for_port(self, host: int, address: str, port: int, timeout: float = 30) -> None:
        """Until ``address:port`` accepts connections from ``host``."""
        probe = ("import socket, sys\n"
                 f"socket.create_connection(({address!r}, {port}), timeout=1).close()")
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run(self.command(host, [sys.executable, "-c", probe]),
                                  capture_output=True)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address}:{port} not listening after {timeout} s")
            time.sleep(0.2)


@contextlib.contextmanager
def s3_on_host(hosts: TwoHosts, bucket: str, folders: dict[str, Path]
               ) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """A moto S3 server on host 0's address, reached from host 1 over the veth pair, holding
    each local folder of ``folders`` under ``s3://bucket/<prefix>/`` (``prefix`` its key).
    Yields the prefixes' URLs, and the environment a client on either host needs (the
    S3 variables, this repository on ``PYTHONPATH``, without a job's own variables)."""
    port = free_port()
    moto = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    server = subprocess.Popen(hosts.command(0, [moto, "-H", hosts.address(0), "-p", str(port)]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        hosts.wait_for_port(1, hosts.address(0), port)  # reached from the other host
        env = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
        env.update({"AWS_ENDPOINT_URL": f"http://{hosts.address(0)}:{port}",
                    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "2",
                    "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
        upload = subprocess.run(
            hosts.command(0, [sys.executable, "-c", UPLOAD, bucket,
                              json.dumps({k: str(v) for k, v in folders.items()})]),
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if upload.returncode != 0:
            raise RuntimeError(f"upload to the S3 server failed:\n{upload.stderr[-4000:]}")
        yield json.loads(upload.stdout.strip().splitlines()[-1]), env
    finally:
        server.kill()
        server.wait()
