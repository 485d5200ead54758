"""The README's first command, `tox -e demo` (examples/quickstart.py): raw Parquet and JSON
Lines folders and packed shards on a local S3 endpoint, each trained on in a process killed
with SIGKILL mid-epoch and resumed in a fresh one on another number of workers (2, then 1); its check
of every row once, and the whole demo run as a user runs it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"


def demo_module():
    spec = importlib.util.spec_from_file_location("quickstart", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_finds_a_row_twice_a_row_missing_and_a_stranger():
    tally = demo_module().tally
    keys = {"a", "b", "c", "d"}
    assert tally(keys, [["a", "b"]], [["c", "d"]])["once"]
    twice = tally(keys, [["a", "b"]], [["b", "c"], ["d"]])
    assert not twice["once"] and twice["repeated"] == 1 and twice["missing"] == 0
    gap = tally(keys, [["a", "b"]], [["d"]])
    assert not gap["once"] and gap["missing"] == 1 and gap["repeated"] == 0
    stranger = tally(keys, [["a", "b"]], [["c", "d", "e"]])
    assert not stranger["once"] and stranger["unknown"] == 1


@pytest.mark.slow
def test_the_demo_kills_resumes_and_delivers_every_row_once():
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
           "COLUMNS": "200"}
    done = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True,
                          env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert len(re.findall(r"\(2 workers\) killed with SIGKILL after batch \d+ of \d+", out)) == 3
    assert len(re.findall(r"\(1 worker\) resumed from batch \d+", out)) == 3
    for name, rows in (("parquet", 2400), ("jsonl", 1500), ("shards", 1500)):
        row = re.search(rf"│ {name} +│ +{rows} │ +(\d+)/(\d+) │ +(\d+) │ +(\d+) │ +(\d+) │ +0 │ "
                        rf"+0 │ +yes │", out)
        assert row, out
        killed, epoch, saved, before, after = map(int, row.groups())
        assert saved < killed < epoch and saved % 10 == 0
        assert before == saved * 32 and before + after == rows
    assert "every row of the epoch exactly once: True" in out
