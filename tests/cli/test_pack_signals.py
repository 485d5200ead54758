"""SIGINT and SIGTERM during a real ``wdstream pack`` to the S3 server: the command exits
with 130 / 143, every process it started has ended, and the bucket holds nothing of the run
(no shard, no manifest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def session_processes(sid: int) -> list[str]:
    """Processes of session ``sid`` still alive (not zombies): what ``pack`` left running."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            alive.append(f"{entry} {command[:120]}")
    return alive


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("signals") / "records.jsonl"
    with open(path, "w") as file:
        for index in range(30_000):
            file.write(json.dumps({"index": index, "text": "x" * 1000}) + "\n")
    return str(path)


def keys(s3, bucket) -> list[str]:
    listing = s3.client().list_objects_v2(Bucket=bucket)
    return [item["Key"] for item in listing.get("Contents", [])]


@pytest.mark.parametrize(("workers", "signum", "whole_group"), [
    (2, signal.SIGTERM, False),  # `kill PID`
    (2, signal.SIGINT, True),  # Ctrl-C: the terminal signals the whole process group
    (1, signal.SIGINT, True),
    (1, signal.SIGTERM, False),
])
@pytest.mark.slow
def test_a_signal_stops_everything_and_leaves_nothing(records, s3, s3_bucket, cli_env,
                                                      workers, signum, whole_group):
    command = ["wdstream", "pack", records, "--output", f"s3://{s3_bucket}/ds/",
               "--max-size", "256kB", "--workers", str(workers), "-q"]
    process = subprocess.Popen(command, env=cli_env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(keys(s3, s3_bucket)) < 3:  # mid-run: shards are landing
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no shard written in 60 s"
            time.sleep(0.05)
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            os.kill(process.pid, signum)
        # the pipes reach EOF only when no process holds them: children included
        stdout, stderr = process.communicate(timeout=60)
        survivors = session_processes(process.pid)
        for _ in range(50):  # a child may still be in the kernel's exit path for a moment
            if not survivors:
                break
            time.sleep(0.1)
            survivors = session_processes(process.pid)
    finally:
        try:  # whatever the outcome, nothing of the test's run outlives it
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr.decode() and "Exception ignored" not in stderr.decode()
    assert stderr.decode().strip() == f"interrupted ({signal.Signals(signum).name})"
    assert survivors == []
    time.sleep(1)  # an upload that was still on its way would land by now
    assert keys(s3, s3_bucket) == []


def test_a_process_forked_under_the_command_handlers_ignores_them():
    """A pool worker forked by ``pack`` runs with the command's handlers until its initializer
    sets its own: a signal then (the command stopping the pool, or a whole process group's
    SIGTERM) must not raise in it, which would print a traceback, only in the command."""
    from wdstream.cli.pack import Interrupted, stop_on_signals

    with pytest.raises(Interrupted):
        with stop_on_signals():
            child = os.fork()
            if child == 0:
                code = 0
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                except BaseException:
                    code = 1
                os._exit(code)
            _, status = os.waitpid(child, 0)
            os.kill(os.getpid(), signal.SIGINT)  # in the command itself: raised
            time.sleep(1)
    assert os.waitstatus_to_exitcode(status) == 0
    signal.signal(signal.SIGINT, signal.default_int_handler)  # left ignored by Interrupted
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
