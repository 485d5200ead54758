"""``axolotl train`` with ``wdstream.integrations.axolotl.WdstreamPlugin``: a packed pretraining
mixture and an alpaca SFT dataset streamed from the S3 server, killed with SIGKILL mid-run,
resumed by ``auto_resume_from_checkpoints``; the batches of the killed and resumed runs are
those of an uninterrupted run, token for token; the same on two processes (gloo on CPU).

Runs in tox's ``axolotl`` env (the real axolotl); every run is a subprocess, as a user runs
it. ``recorder.Recorder``, a second plugin, writes each batch the model trains on and kills
the run at a step; ``tiny_model.py`` builds the model and tokenizer."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from tests.support.raw_data import upload_tree
from tests.support.servers import environ, free_port

# each axolotl run takes 30-90 s to start; a test runs three
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = os.path.dirname(sys.executable)
WORDS = ("the a stream shard epoch token batch resume seed rank worker model data loss step "
         "train pack mix weight source window order plan sample text code").split()
STEPS, SAVE_STEPS, KILL_AT = 6, 2, 3  # the resumed run starts from checkpoint-2


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory, moto_server):
    """The model, and three datasets packed by ``wdstream pack`` into the S3 server: two
    of text documents (``web``, ``code``), one of alpaca records."""
    root = tmp_path_factory.mktemp("axolotl")
    rng = random.Random(3)
    web = write_jsonl(root / "web.jsonl", [{"text": sentence(rng, 5, 60)} for _ in range(80)])
    code = write_jsonl(root / "code.jsonl", [{"content": sentence(rng, 5, 30)}
                                            for _ in range(60)])
    alpaca = write_jsonl(root / "alpaca.jsonl", [
        {"instruction": sentence(rng, 3, 8), "input": sentence(rng, 0, 4),
         "output": sentence(rng, 2, 10)} for _ in range(60)])
    run([sys.executable, str(HERE / "tiny_model.py"), str(root / "model"), str(web)], root)
    raw = write_parquet_records(root / "alpaca-raw", [
        {"instruction": sentence(rng, 3, 8), "input": sentence(rng, 0, 4),
         "output": sentence(rng, 2, 10)} for _ in range(200)])
    chats = write_parquet_records(root / "chats-raw", [
        {"messages": [{"role": "user", "content": sentence(rng, 3, 8)},
                      {"role": "assistant", "content": sentence(rng, 2, 10)}]}
        for _ in range(100)])
    long_texts = write_parquet_records(root / "web-raw", [{"text": sentence(rng, 5, 60)}
                                                          for _ in range(80)])
    with environ(moto_server.env):
        bucket = moto_server.create_bucket("axolotl-data")
        for name, path in (("web", web), ("code", code), ("alpaca", alpaca)):
            run([os.path.join(BIN, "wdstream"), "pack", str(path), "-o",
                 f"s3://{bucket}/{name}/", "--max-count", "10"], root)
        upload_tree(moto_server.client(), bucket, raw, "alpaca-raw")
        upload_tree(moto_server.client(), bucket, chats, "chats-raw")
        upload_tree(moto_server.client(), bucket, chats, "chats-split/train")  # a split
        upload_tree(moto_server.client(), bucket, long_texts, "web-raw")
    return root, bucket, moto_server.env


def write_parquet_records(folder: Path, records: list[dict]) -> Path:
    """Records as two raw Parquet files (row groups of 8 rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    half = len(records) // 2
    for name, part in (("part-0.parquet", records[:half]), ("part-1.parquet", records[half:])):
        pq.write_table(pa.Table.from_pylist(part), folder / name, row_group_size=8)
    return folder


def run(cmd: list[str], cwd, env=None, expect=0, timeout=600) -> subprocess.CompletedProcess:
    """Run ``cmd``; its exit status must be ``expect`` (None: any failure). A run still going
    after ``timeout`` seconds is a failure that shows where each of its processes (the
    launcher, the ranks, their loader workers) was: they get SIGABRT, which Python's fault
    handler answers with every thread's stack, then SIGKILL, all of them, so that none
    holds the output pipes open."""
    env = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        # the ranks may have sessions of their own: every process under the launcher
        tree = [process.pid] + [child.pid for child in
                                psutil.Process(process.pid).children(recursive=True)]
        signal_all(tree, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=20)
        signal_all(tree, signal.SIGKILL)
        stdout, stderr = process.communicate()
        hung = True
    result = subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)
    ok = not hung and (result.returncode != 0 if expect is None
                       else result.returncode == expect)
    if not ok:  # the whole log beside the run, its end (or the stacks) in the failure
        Path(cwd, "failed-run.log").write_text(result.stdout + result.stderr)
        pytest.fail(f"still running after {timeout} s; the stacks:\n{stacks(result.stderr)}"
                    if hung else f"exit {result.returncode}:\n{result.stderr[-8000:]}")
    return result


def stacks(stderr: str, limit: int = 12000) -> str:
    """The fault handler's report of each process in ``stderr``: its threads' stacks, without
    the list of extension modules each process prints after them."""
    lines = [line for line in stderr.splitlines()
             if line.startswith(("Fatal Python", "Thread 0x", "Current thread", "  File"))]
    return "\n".join(lines)[-limit:]


def signal_all(pids: list[int], number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


def config(work, out: str, **changes) -> dict:
    root, bucket, _env = work
    made = {
        "base_model": str(root / "model"),
        "plugins": ["wdstream.integrations.axolotl.WdstreamPlugin", "recorder.Recorder"],
        "sequence_len": 32, "micro_batch_size": 2, "gradient_accumulation_steps": 2,
        "max_steps": STEPS, "save_steps": SAVE_STEPS, "seed": 7,
        "learning_rate": 0.001, "optimizer": "adamw_torch", "lr_scheduler": "constant",
        "attn_implementation": "sdpa", "bf16": False, "fp16": False, "tf32": False,
        "val_set_size": 0, "logging_steps": 1, "dataloader_num_workers": 1,
        "auto_resume_from_checkpoints": True, "output_dir": str(root / out),
        "max_memory": {"cpu": "8GiB"},
        "pretraining_dataset": [
            {"path": f"s3://{bucket}/web/", "type": "pretrain", "text_column": "text",
             "weight": 0.7},
            {"path": f"s3://{bucket}/code/", "type": "pretrain", "text_column": "content",
             "weight": 0.3}],
        "sample_packing": True,
    }
    made.update(changes)
    return {key: value for key, value in made.items() if value is not None}


def sft(work, out: str) -> dict:
    _root, bucket, _env = work
    return config(work, out, pretraining_dataset=None, sample_packing=False, sequence_len=512,
                  datasets=[{"path": f"s3://{bucket}/alpaca/", "type": "alpaca"}])


def completion_packed(work, out: str) -> dict:
    """Texts of 5 to 60 words from raw Parquet as ``completion`` examples: a text longer than
    sequence_len is split into several, packed into rows."""
    _root, bucket, _env = work
    return config(work, out, pretraining_dataset=None, sample_packing=True,
                  datasets=[{"path": f"s3://{bucket}/web-raw/", "type": "completion"}],
                  wdstream={"packing_buffer": 16})


def sft_packed(work, out: str) -> dict:
    """alpaca and chats (chat_template) from raw Parquet, mixed, their examples (some 100 to
    120 tokens: the tiny tokenizer spells most of alpaca's preamble and chatml's markers
    letter by letter) packed into sequence_len rows."""
    _root, bucket, _env = work
    return config(work, out, pretraining_dataset=None, sample_packing=True, sequence_len=512,
                  datasets=[{"path": f"s3://{bucket}/alpaca-raw/", "type": "alpaca"},
                            {"path": f"s3://{bucket}/chats-raw/", "type": "chat_template",
                             "chat_template": "chatml", "field_messages": "messages",
                             "weight": 0.5}],
                  wdstream={"packing_buffer": 16})


def written(work, cfg: dict, name: str, kill_at: int = 0) -> tuple[Path, dict]:
    """``cfg`` written as ``name``.yml, and the environment an axolotl command runs it in."""
    root, _bucket, s3_env = work
    path = root / f"{name}.yml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(s3_env)
    env.update({"PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
                "AXOLOTL_DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "WDSTREAM_TEST_RUN": name, "WDSTREAM_TEST_KILL_AT": str(kill_at)})
    return path, env


def train(work, cfg: dict, name: str, nproc: int = 1, kill_at: int = 0, expect: int = 0):
    """``axolotl train`` (under ``accelerate launch`` on ``nproc`` CPU processes) as run
    ``name``; returns its batches per rank."""
    root = work[0]
    path, env = written(work, cfg, name, kill_at)
    if nproc == 1:
        cmd = [sys.executable, "-m", "axolotl.cli.train", str(path)]
    else:
        env["ACCELERATE_USE_CPU"] = "true"
        cmd = [os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes",
               str(nproc), "--main_process_port", str(free_port()), "-m",
               "axolotl.cli.train", str(path)]
    run(cmd, root, env, expect=expect)
    return recorded(cfg, name, nproc)


def recorded(cfg: dict, name: str, nproc: int) -> list[list[dict]]:
    """The batches each of the ``nproc`` ranks of run ``name`` trained on (the Recorder's)."""
    out = Path(cfg["output_dir"])
    return [[json.loads(line) for line in
             (out / f"batches-{name}-rank{r}.jsonl").read_text().splitlines()]
            for r in range(nproc)]


def test_preprocess_checks_the_plan_and_renders_examples(work):
    """``axolotl preprocess`` with the plugin: exit 0, the first rows of the packed SFT
    mixture rendered token by token (with their labels, the prompt's masked), nothing
    written; ``axolotl train --debug`` renders them too, then trains as without it."""
    cfg = sft_packed(work, "preprocess")
    path, env = written(work, cfg, "preprocess")
    done = run([sys.executable, "-m", "axolotl.cli.preprocess", str(path)], work[0], env)
    log = done.stdout + done.stderr
    assert "the plan holds" in log and "3 row(s) rendered above" in log, log[-3000:]
    assert "nothing is written" in log
    assert "(-100, " in log  # a prompt token, masked
    assert not Path(cfg["dataset_prepared_path"] if "dataset_prepared_path" in cfg
                    else work[0] / "last_run_prepared").exists()

    debug = dict(sft_packed(work, "debug"), max_steps=2)
    path, env = written(work, debug, "debug")
    done = run([sys.executable, "-m", "axolotl.cli.train", str(path), "--debug"], work[0], env)
    log = done.stdout + done.stderr
    assert "3 row(s) rendered above" in log, log[-3000:]
    reference = [json.loads(line) for line in (Path(debug["output_dir"]) /
                 "batches-debug-rank0.jsonl").read_text().splitlines()]
    [plain] = train(work, dict(sft_packed(work, "no-debug"), max_steps=2), "no-debug")
    assert reference == plain  # the preview took nothing from the training stream


def check_resumed(reference, killed, resumed, accumulation: int = 2):
    """The killed run trained the reference's first KILL_AT steps; the resumed one, from
    checkpoint-SAVE_STEPS, the reference's rest: the same batches, token for token."""
    saved = (KILL_AT // SAVE_STEPS) * SAVE_STEPS * accumulation
    assert len(reference) == STEPS * accumulation
    assert killed == reference[:KILL_AT * accumulation]
    assert resumed == reference[saved:]


# sft-packed: alpaca and chats; completion: records split into several examples
@pytest.mark.parametrize("kind", ["pretrain", "sft", "sft-packed", "completion"])
def test_a_run_killed_and_resumed_trains_on_the_batches_of_an_uninterrupted_one(work, kind):
    make = {"pretrain": config, "sft": sft, "sft-packed": sft_packed,
            "completion": completion_packed}[kind]
    [reference] = train(work, make(work, f"{kind}-reference"), f"{kind}-reference")
    interrupted = make(work, f"{kind}-interrupted")
    [killed] = train(work, interrupted, f"{kind}-killed", kill_at=KILL_AT,
                     expect=-signal.SIGKILL)
    checkpoint = Path(interrupted["output_dir"]) / f"checkpoint-{SAVE_STEPS}"
    assert (checkpoint / "wdstream_loader-rank0.json").is_file()
    assert not (checkpoint.parent / f"checkpoint-{KILL_AT}").exists()
    [resumed] = train(work, interrupted, f"{kind}-resumed")
    check_resumed(reference, killed, resumed)
    ids = [row for batch in reference for row in batch["input_ids"]]
    assert len(set(map(tuple, ids))) == len(ids)  # no example twice
    if kind == "pretrain":  # packed: every row is sequence_len tokens, no padding
        assert {len(row) for row in ids} == {32} and 3 not in {t for r in ids for t in r}
    elif kind == "sft-packed":  # rows of whole examples, each's positions from 0
        check_packed(reference)
        # both formats' examples (alpaca's preamble, chatml's marker start them)
        assert len({example[:3] for example in examples_of(reference)}) == 2
    elif kind == "completion":  # rows of whole examples, the long texts' parts filling 32
        lengths = [len(example) for example in examples_of(reference)]
        assert max(lengths) == 32 and lengths.count(32) >= 2 and min(lengths) < 32
    else:  # alpaca: the prompt's tokens are masked (padding is on the right), the
        # response's trained on
        labels = [row for batch in reference for row in batch["labels"]]
        assert all(row[0] == -100 and any(t >= 0 for t in row) for row in labels)
        assert all(row[0] != 3 for row in ids)


def check_packed(batches: list[dict]) -> None:
    """Rows of at most sequence_len tokens, most holding several examples (position ids
    restarting at 0), each example's prompt masked and its response trained on."""
    rows = [(ids, labels, positions) for batch in batches for ids, labels, positions in
            zip(batch["input_ids"], batch["labels"], batch["position_ids"], strict=True)]
    assert all(len(ids) <= 512 for ids, _, _ in rows)
    starts = [[i for i, p in enumerate(positions) if p == 0 and ids[i] != 3]  # 3: <pad>
              for ids, _, positions in rows]
    assert sum(len(s) > 1 for s in starts) > len(rows) // 2
    for (_ids, labels, _positions), first in zip(rows, starts, strict=True):
        assert all(labels[i] == -100 for i in first)  # each example starts in its prompt
        assert any(t >= 0 for t in labels)


def examples_of(batches: list[dict]) -> list[tuple]:
    """The examples of packed rows: their tokens, cut where the position ids restart."""
    found = []
    for batch in batches:
        for ids, positions in zip(batch["input_ids"], batch["position_ids"], strict=True):
            starts = [i for i, p in enumerate(positions) if p == 0 and ids[i] != 3]
            ends = starts[1:] + [len(ids)]
            found += [tuple(t for t in ids[a:b] if t != 3) for a, b in zip(starts, ends,
                                                                            strict=True)]
    return found


def test_sft_without_max_steps_trains_each_record_once_an_epoch(work):
    """No max_steps: the steps come from the records (one example each, 60 alpaca records in
    batches of 2, 2 accumulated: 15 steps for num_epochs 1), each record trained once."""
    cfg = dict(sft(work, "epochs"), max_steps=None, num_epochs=1, save_steps=None)
    [trained] = train(work, {k: v for k, v in cfg.items() if v is not None}, "epochs")
    rows = [tuple(t for t in row if t != 3) for batch in trained for row in batch["input_ids"]]
    assert len(trained) == 30 and len(set(rows)) == len(rows) == 60


def test_an_eval_split_is_evaluated_and_never_trained_on(work):
    """val_set_size: 0.25 holds out a quarter of the rows (by a hash of their keys); the run
    evaluates them at eval_steps, packed, and trains on none of them."""
    cfg = sft_packed(work, "held-out")
    cfg.update(val_set_size=0.25, eval_steps=3, max_steps=3, save_steps=3)
    [trained] = train(work, cfg, "held-out")
    evaluated = [json.loads(line) for line in
                 (Path(cfg["output_dir"]) / "evals-held-out-rank0.jsonl").read_text().splitlines()]
    train_examples, eval_examples = examples_of(trained), examples_of(evaluated)
    assert len(eval_examples) > 20 and len(train_examples) > 20
    assert not set(train_examples) & set(eval_examples)
    # every held-out example is evaluated: about a quarter of the 300 records
    assert 50 <= len(set(eval_examples)) <= 100


def test_test_datasets_are_streamed_and_evaluated(work):
    """A test_datasets: entry (chats, from a slice of a split: its first file's 50 rows) is
    streamed and evaluated at eval_steps, every example of the slice and no other; the
    training data (alpaca) is not evaluated, the test data not trained on."""
    _root, bucket, _env = work
    cfg = sft_packed(work, "tests-eval")
    cfg.update(datasets=[{"path": f"s3://{bucket}/alpaca-raw/", "type": "alpaca"}],
               test_datasets=[{"path": f"s3://{bucket}/chats-split/", "split": "train[:50%]",
                               "type": "chat_template", "chat_template": "chatml",
                               "field_messages": "messages"}],
               eval_steps=3, max_steps=3, save_steps=3,
               # axolotl's packed eval (its multipack sampler, micro_batch_size rows a
               # batch) drops an incomplete last batch: one row a batch loses none
               micro_batch_size=1)
    [trained] = train(work, cfg, "tests-eval")
    evaluated = [json.loads(line) for line in
                 (Path(cfg["output_dir"]) / "evals-tests-eval-rank0.jsonl").read_text().splitlines()]
    train_examples, eval_examples = examples_of(trained), examples_of(evaluated)
    # evaluated at step 3 and as the run ends: every example of the slice each time
    assert len(set(eval_examples)) == 50 and len(eval_examples) in (50, 100)
    assert not set(train_examples) & set(eval_examples)
    # chats (chatml's marker) evaluated, alpaca (its preamble) trained: two beginnings
    assert len({e[:3] for e in eval_examples}) == 1
    assert {e[:3] for e in eval_examples}.isdisjoint({e[:3] for e in train_examples})


@pytest.mark.parametrize("kind", ["pretrain", "sft-packed"])
def test_two_processes_share_the_data_and_resume_exactly(work, kind):
    # save_only_model: on CPU under several processes, transformers 5.16's Trainer loads the
    # optimizer's checkpoint with map_location=args.device, "cpu:0", which torch.load
    # refuses ("don't know how to restore data location ... tagged with cpu:0"); without an
    # optimizer file it resumes the model, the steps and the loader
    make = config if kind == "pretrain" else sft_packed
    reference = train(work, dict(make(work, f"ddp-{kind}-reference"), save_only_model=True),
                      f"ddp-{kind}-reference", nproc=2)
    interrupted = dict(make(work, f"ddp-{kind}-interrupted"), save_only_model=True)
    killed = train(work, interrupted, f"ddp-{kind}-killed", nproc=2, kill_at=KILL_AT,
                   expect=None)
    checkpoint = Path(interrupted["output_dir"]) / f"checkpoint-{SAVE_STEPS}"
    assert {p.name for p in checkpoint.glob("wdstream_loader-*")} == {
        "wdstream_loader-rank0.json", "wdstream_loader-rank1.json"}
    resumed = train(work, interrupted, f"ddp-{kind}-resumed", nproc=2)
    for rank in range(2):
        check_resumed(reference[rank], killed[rank], resumed[rank])
    rows = [tuple(row) for batches in reference for batch in batches
            for row in batch["input_ids"]]
    assert len(set(rows)) == len(rows)  # no sequence on both ranks, or twice


def test_packed_sft_on_two_processes_resumes_on_one(work):
    """Packed SFT killed on two processes, resumed on one (elastic): the one process first
    delivers the rows rank 0's buffer had left at the checkpoint, token for token those
    rank 0 trained on after it in an uninterrupted two-process run (a buffer of 300 records
    outlasts the run), and no example is trained on twice. tests/integrations/
    test_packed_examples.py checks, over whole epochs, that none is lost either."""
    def make(out: str) -> dict:
        made = dict(sft_packed(work, out), save_only_model=True)
        made["wdstream"] = {"packing_buffer": 300}
        return made

    reference = train(work, make("elastic-reference"), "elastic-reference", nproc=2)
    interrupted = make("elastic-interrupted")
    killed = train(work, interrupted, "elastic-killed", nproc=2, kill_at=KILL_AT, expect=None)
    [resumed] = train(work, interrupted, "elastic-resumed")
    saved = SAVE_STEPS * 2  # batches (micro-batches of 2 rows) per rank before the checkpoint
    assert killed[0][:saved] == reference[0][:saved]
    assert resumed == reference[0][saved:]
    trained = examples_of(killed[0][:saved] + killed[1][:saved] + resumed)
    assert len(trained) == len(set(trained))


def test_packed_sft_on_two_processes_crosses_an_epoch_end(work):
    """Packed SFT (200 alpaca records, about 34 rows a process a pass) on two processes for
    more steps than a pass holds (48 rows each): each process goes on into the next pass when
    its own ends, at a step of its own, without a hang; every example of the first pass is
    trained (but the fewer than two records the epoch plan leaves over), none more than once
    a pass."""
    _root, bucket, _env = work
    cfg = dict(sft_packed(work, "epoch-end"), save_only_model=True, max_steps=12,
               save_steps=12,
               datasets=[{"path": f"s3://{bucket}/alpaca-raw/", "type": "alpaca"}])
    ranks = train(work, cfg, "epoch-end", nproc=2)
    assert [len(batches) for batches in ranks] == [24, 24]
    trained = examples_of([batch for batches in ranks for batch in batches])
    counts = {example: trained.count(example) for example in set(trained)}
    assert len(trained) > 200 and max(counts.values()) == 2
    assert len(counts) >= 199


def test_a_mistake_in_a_wdstream_entry_fails_at_start_naming_the_key(work):
    root, bucket, s3_env = work
    cfg = config(work, "mistake", pretraining_dataset=[
        {"path": f"s3://{bucket}/web/", "type": "pretrain", "weight": "heavy"}])
    path = root / "mistake.yml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, **s3_env, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]),
               AXOLOTL_DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    result = subprocess.run([sys.executable, "-m", "axolotl.cli.train", str(path)], cwd=root,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "pretraining_dataset[0] (s3://" in result.stderr
    assert "'weight' must be a number, not str 'heavy'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (root / "mistake").exists() or not any((root / "mistake").glob("checkpoint-*"))


def test_a_record_its_format_cannot_read_fails_before_the_model_loads(work):
    """A format whose columns the start-up check does not know (``metharme`` reads
    ``prompt`` and ``generation``) formats each entry's first record before the model loads:
    alpaca records fail there, naming the file, the row and the record's columns."""
    _root, bucket, _env = work
    cfg = config(work, "unreadable", pretraining_dataset=None, sample_packing=False,
                 sequence_len=512,
                 datasets=[{"path": f"s3://{bucket}/alpaca-raw/", "type": "metharme"}])
    path, env = written(work, cfg, "unreadable")
    result = run([sys.executable, "-m", "axolotl.cli.train", str(path)], work[0], env,
                 expect=None)
    assert f"InputError: s3://{bucket}/alpaca-raw/: type 'metharme' cannot read the record " \
        "part-" in result.stderr
    assert "(KeyError: 'prompt'; its columns: instruction, input, output)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(Path(cfg["output_dir"]).glob("checkpoint-*"))


CHECKS = """
import json, sys
from axolotl.utils.dict import DictDefault
from wdstream.integrations.axolotl import WdstreamPlugin

out = []
for cfg in json.loads(sys.argv[1]):
    plugin = WdstreamPlugin()
    try:
        plugin.register(DictDefault(cfg))
        out.append(None if plugin.written is None else sorted(plugin.written))
    except SystemExit as error:  # a mistake: the message, without a traceback
        out.append(str(error.code))
print(json.dumps(out))
"""


def test_configs_the_plugin_refuses_or_leaves_to_axolotl(work):
    """The plugin's checks of a config as written (its ``register``), each naming the entry
    and key, the file and column (one interpreter)."""
    root, bucket, s3_env = work
    web = {"path": f"s3://{bucket}/web/", "type": "pretrain"}
    alpaca = {"path": f"s3://{bucket}/alpaca/", "type": "alpaca"}
    raw = {"path": f"s3://{bucket}/alpaca-raw/", "type": "alpaca"}
    arrays = root / "json-arrays"  # a folder of .json files, each a JSON array of records
    arrays.mkdir(exist_ok=True)
    records = [json.loads(line) for line in (root / "alpaca.jsonl").read_text().splitlines()]
    (arrays / "train.json").write_text(json.dumps(records, indent=1))
    cases = [
        ({"datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}, None),
        ({"datasets": [alpaca, {"path": "tatsu-lab/alpaca", "type": "alpaca"}]},
         "datasets[1]: not a wdstream dataset"),
        ({"datasets": [alpaca], "sample_packing": True}, "max_steps: packed examples"),
        ({"pretraining_dataset": [web], "sequence_len": 32, "val_set_size": 0.1},
         "val_set_size: held out of datasets: entries"),
        ({"datasets": [alpaca], "val_set_size": 20, "max_steps": 3},
         "val_set_size: a streamed dataset holds out a share of its rows"),
        ({"pretraining_dataset": [web], "sequence_len": 32, "wdstream": {"sequence_len": 8}},
         "wdstream.sequence_len: axolotl's own settings"),
        ({"pretraining_dataset": [web], "datasets": [alpaca], "sequence_len": 32},
         "datasets and pretraining_dataset"),
        ({"datasets": [dict(alpaca, weight=2, field_messages="q")], "seed": 3,
          "wdstream": {"shuffle_window": 50}},
         ["datasets", "seed", "shuffle_window"]),
        # misspelled keys: an error at start, naming the entry, the key and the known one
        ({"datasets": [alpaca, dict(raw, wieght=2)], "wdstream": {"shuffle_windw": 50}},
         f"the axolotl config: 2 errors:\n  - datasets[1] (s3://{bucket}/alpaca-raw/): unknown "
         "key 'wieght' (did you mean 'weight'?)\n  - wdstream: unknown key 'shuffle_windw' "
         "(did you mean 'shuffle_window'?)"),
        # axolotl's settings a stream does not honour, named
        ({"datasets": [alpaca], "dataset_exact_deduplication": True,
          "excess_length_strategy": "raise", "test_datasets": [raw]},
         "the axolotl config: 2 errors:\n  - dataset_exact_deduplication: a stream is not "
         "deduplicated"),
        # test datasets streamed beside others, or beside pretraining; joined splits
        ({"datasets": [raw], "test_datasets": [{"path": "tatsu-lab/alpaca"}]},
         "test_datasets[0]: not a wdstream dataset"),
        ({"pretraining_dataset": [web], "sequence_len": 32, "test_datasets": [raw]},
         "test_datasets: evaluated with datasets: entries"),
        ({"datasets": [dict(raw, split="train+test")]},
         "datasets[0] (s3://" + bucket + "/alpaca-raw/): split 'train+test': a stream reads "
         "one split"),
        # a slice of a split: rows of raw files, in any entry; shards stream whole
        ({"datasets": [dict(alpaca, split="train[:50%]")]},
         f"datasets[0] (s3://{bucket}/alpaca/): s3://{bucket}/alpaca/: rows apply to raw "
         "files only (Parquet, JSON Lines, Arrow), and these are shards, streamed whole"),
        ({"pretraining_dataset": [{"path": f"s3://{bucket}/web-raw/", "type": "pretrain",
                                   "split": "train[:50%]"}], "sequence_len": 32},
         ["pretraining_dataset"]),
        # the columns the prompt format reads, from the Parquet schema
        ({"datasets": [raw, dict(raw, type="chat_template", label="chats")]},
         f"datasets[1] (s3://{bucket}/alpaca-raw/): s3://{bucket}/alpaca-raw/part-0.parquet "
         "has no column 'messages', which type 'chat_template' reads"),
        # trainers the plugin does not feed: named alone, not as unknown keys of theirs
        ({"datasets": [dict(raw, type="chatml.intel", field_chosen="c")], "rl": "dpo"},
         "InputError: rl: 'dpo': the wdstream plugin streams the examples of SFT and "
         "pretraining; this trainer reads preference pairs or prompts through TRL's own "
         "dataset preparation"),
        ({"datasets": [dict(raw, type="bradley_terry.chat_template")], "reward_model": True},
         "reward_model: True: the wdstream plugin streams"),
        # no type: rows already tokenized, their columns checked
        ({"datasets": [{"path": f"s3://{bucket}/alpaca-raw/"}]},
         f"datasets[0] (s3://{bucket}/alpaca-raw/): s3://{bucket}/alpaca-raw/part-0.parquet "
         "has no column 'input_ids'"),
        # a local folder of raw Parquet streams as a bucket does
        ({"datasets": [{"path": str(root / "alpaca-raw"), "type": "alpaca"}]}, ["datasets"]),
        ({"datasets": [{"path": str(root / "alpaca-raw" / "part-1.parquet"),
                        "type": "completion"}], "max_steps": 3},
         "part-1.parquet has no column 'text', which type 'completion' reads"),
        # without max_steps, each record one example: formats that split or drop refused
        ({"datasets": [{"path": f"s3://{bucket}/web-raw/", "type": "completion"}]},
         f"max_steps: datasets[0] (s3://{bucket}/web-raw/): type 'completion' can make "
         "several examples of a record"),
        ({"datasets": [alpaca], "excess_length_strategy": "drop"},
         "max_steps: excess_length_strategy: drop leaves out examples"),
        # a local folder of .json arrays streams; its columns are its first record's
        ({"datasets": [{"path": str(arrays), "type": "alpaca"}]}, ["datasets"]),
        ({"datasets": [{"path": str(arrays), "type": "chat_template"}]},
         "train.json has no column 'messages', which type 'chat_template' reads"),
        # a JSON Lines file's columns: its first row's
        ({"datasets": [{"path": str(root / "alpaca.jsonl"), "type": "chat_template"}]},
         "alpaca.jsonl has no column 'messages', which type 'chat_template' reads (its "
         "columns: instruction, input, output)"),
    ]
    env = dict(os.environ, **s3_env, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]),
               AXOLOTL_DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
    result = run([sys.executable, "-c", CHECKS, json.dumps([c for c, _ in cases])], root, env)
    for (_cfg, expected), got in zip(cases, json.loads(result.stdout.splitlines()[-1]),
                                     strict=True):
        if isinstance(expected, str):
            assert isinstance(got, str) and expected in got, (expected, got)
        else:
            assert got == expected
