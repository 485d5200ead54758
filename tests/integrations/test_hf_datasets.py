"""wdstream datasets as Hugging Face ``datasets.IterableDataset`` (the real package): one shard
per wdstream stream, the rank and worker split kept, ``set_epoch``, ``.map``, exact resume
through ``state_dict``; and no silent loss inside another ``IterableDataset``'s workers.

The checks are in tests/hf_datasets_checks.py, run in a process of their own (this folder's
``datasets.py`` shadows the Hugging Face package here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = Path(__file__).with_name("hf_datasets_checks.py")
NAMES = [line.split("(")[0][4:] for line in CHECKS.read_text().splitlines()
         if line.startswith("def test_")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if importlib_missing("datasets.iterable_dataset"):
        pytest.skip("Hugging Face datasets is not installed")
    workdir = tmp_path_factory.mktemp("hf")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(CHECKS), str(workdir)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-5000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def importlib_missing(module: str) -> bool:
    code = f"import sys; sys.path.remove({str(CHECKS.parent)!r}) if {str(CHECKS.parent)!r} " \
           f"in sys.path else None; import {module}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0


@pytest.mark.parametrize("name", NAMES)
def test_hugging_face_datasets(results, name):
    assert results[name] == "ok", results[name]
