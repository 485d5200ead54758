"""TRL's ``SFTTrainer`` (the real package) on ``PackedSequences`` through ``use_loader``: trains
from the wdstream loader and resumes from a checkpoint with exactly the sequences the
uninterrupted run saw after it. The job, tests/support/trl_job.py, runs in a process of its own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.support.jobs import script

if importlib.util.find_spec("trl") is None:  # found, not imported: it imports transformers
    pytest.skip("trl is not installed", allow_module_level=True)
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.slow

JOB = script("trl_job.py")


def test_sft_trainer_resumes_exactly(tmp_path):
    from tests.support.llm_data import documents, train_tokenizer, write_text_dataset

    train_tokenizer(tmp_path / "tokenizer.json", documents(5, 200))
    write_text_dataset(tmp_path / "web", [40, 40], seed=3)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run([sys.executable, JOB, str(tmp_path)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-6000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(seen["reference"]) == 2 * 12 * 2  # 2 epochs of 12 batches of 2 sequences
    assert seen["resumed"] == seen["reference"][3 * 2:]  # from checkpoint-3, no replay
