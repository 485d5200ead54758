"""SFT sample packing streamed by the axolotl plugin against axolotl's own preprocessing and
multipack on the same rows: packing efficiency and examples per second per worker, for
``alpaca`` and ``chat_template``.

- Data: one Parquet file of generated rows per format in a local folder (seeded; word counts
  log-normal: alpaca's ``output`` a median of 60 words, 40% of rows with an ``input``; chats
  of 1 to 4 exchanges, the assistant's turns a median of 60 words), tokenized by the tests'
  BPE tokenizer (``tests/axolotl/tiny_model.py``, trained on those words; chats rendered with
  axolotl's ChatML template).
- One axolotl config per format, the same for both sides but for ``plugins:``:
  ``sequence_len`` 2048, ``micro_batch_size`` 2, ``sample_packing: true`` (axolotl then sets
  ``pad_to_sequence_len``), ``attn_implementation: sdpa`` (so axolotl packs real batches of
  ``micro_batch_size`` rows), ``dataset_num_proc`` 1, ``dataloader_num_workers`` 1.
  The plugin's ``packing_buffer`` and axolotl's ``sample_packing_group_size`` are both
  ``BUFFER``: wdstream packs each run of that many records (first-fit decreasing), axolotl
  each group of that many shuffled examples (first fit, ``sample_packing_bin_size`` 200).
- wdstream: ``load_cfg`` (the plugin's check), the plugin's ``load_datasets`` and its
  ``DataLoader`` read once to its end (one worker). axolotl: ``load_cfg``, its
  ``load_datasets`` (what ``axolotl preprocess`` runs: its prompt strategies over the rows in
  one process, examples longer than ``sequence_len`` dropped), its ``MultipackBatchSampler``
  built as its trainer builds it and a ``DataLoader`` over it with its multipack collator
  read once (in the main process: its one worker is the preprocessing's).
- Measured on the batches produced: non-pad tokens ÷ all tokens (packing efficiency) and
  examples ÷ seconds from before ``load_cfg`` to the last batch (per worker), wdstream ÷
  axolotl (goal ≥ 1 each).

Runs where axolotl imports (tox's ``axolotl`` environment); elsewhere the interpreter
``WDSTREAM_BENCH_AXOLOTL_PYTHON`` names (default ``.tox/axolotl/bin/python`` if present).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from . import common

TITLE = "SFT sample packing: the axolotl plugin against axolotl's multipack"
PYTHON_ENV = "WDSTREAM_BENCH_AXOLOTL_PYTHON"
REPO = Path(__file__).resolve().parent.parent
PLUGIN = "wdstream.integrations.axolotl.WdstreamPlugin"
FORMATS = ("alpaca", "chat_template")
SIDES = ("wdstream", "axolotl")
FULL = {"rows": 4000}
QUICK = {"rows": 1000}
SEQ_LEN = 2048
MICRO_BATCH = 2
BUFFER = 1000  # wdstream's packing_buffer = axolotl's sample_packing_group_size
BIN_SIZE = 200  # axolotl's sample_packing_bin_size (its default); wdstream has no such cap
GOAL = 1.0
SEED = 42
T_RATIOS = "wdstream ÷ axolotl (medians)"
T_CASES = "each side (medians)"
ENV = {"AXOLOTL_DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# =========================================================================== the data


def lexicon(rng: random.Random, size: int = 3000) -> list[str]:
    """``size`` pronounceable words of 1 to 4 syllables."""
    onsets = ["", "b", "br", "c", "ch", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "pr",
              "qu", "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "z"]
    nuclei = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck"]
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas)
                          for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4)))))
    return sorted(words)


class Writer:
    """Sentences of words drawn Zipf-like from a seeded lexicon, their counts log-normal."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.words = lexicon(self.rng)
        self.weights = [1 / (rank + 1) for rank in range(len(self.words))]

    def count(self, median: float, sigma: float, low: int, high: int) -> int:
        return max(low, min(high, round(self.rng.lognormvariate(0, sigma) * median)))

    def text(self, median: float, sigma: float = 0.8, low: int = 1, high: int = 1500) -> str:
        chosen = self.rng.choices(self.words, self.weights, k=self.count(median, sigma, low,
                                                                          high))
        sentences, start = [], 0
        while start < len(chosen):
            end = start + self.rng.randint(6, 18)
            sentence = " ".join(chosen[start:end])
            sentences.append(sentence[:1].upper() + sentence[1:] + ".")
            start = end
        return " ".join(sentences)


def alpaca_rows(rows: int, seed: int) -> list[dict]:
    writer = Writer(seed)
    return [{"instruction": writer.text(14, 0.6, 3, 80),
             "input": writer.text(25, 0.9, 1, 400) if writer.rng.random() < 0.4 else "",
             "output": writer.text(60, 0.9, 1, 1500)} for _ in range(rows)]


def chat_rows(rows: int, seed: int) -> list[dict]:
    writer = Writer(seed)
    made = []
    for _ in range(rows):
        turns = []
        for _ in range(writer.rng.choice((1, 1, 1, 2, 2, 3, 4))):
            turns += [{"role": "user", "content": writer.text(18, 0.8, 2, 300)},
                      {"role": "assistant", "content": writer.text(60, 0.9, 1, 1200)}]
        made.append({"messages": turns})
    return made


def write_data(root: Path, rows: int) -> dict[str, Path]:
    """Each format's folder of one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folders = {}
    for kind, make in (("alpaca", alpaca_rows), ("chat_template", chat_rows)):
        folder = root / "data" / kind
        folder.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(make(rows, SEED)), folder / "part-00000.parquet")
        folders[kind] = folder
    return folders


def tokenizer_texts(root: Path) -> Path:
    """What the tests' BPE tokenizer is trained on: text of the rows' words, alpaca's
    preamble and ChatML's markers."""
    writer = Writer(SEED)
    preamble = ("Below is an instruction that describes a task, paired with an input that "
                "provides further context. Write a response that appropriately completes the "
                "request. ### Instruction: ### Input: ### Response: <|im_start|>user "
                "<|im_start|>assistant <|im_end|>")
    path = root / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in
                            [preamble] * 20 + [writer.text(200) for _ in range(300)]))
    return path


def tiny_model(root: Path) -> Path:
    """The tests' tiny Llama and tokenizer, with axolotl's ChatML template as its own."""
    from axolotl.utils.chat_templates import get_chat_template

    model = root / "model"
    subprocess.run([sys.executable, str(REPO / "tests" / "axolotl" / "tiny_model.py"),
                    str(model), str(tokenizer_texts(root))], check=True, capture_output=True)
    settings = model / "tokenizer_config.json"
    values = json.loads(settings.read_text())
    values["chat_template"] = get_chat_template("chatml")
    settings.write_text(json.dumps(values))
    return model


def entry(kind: str, folder: Path) -> dict:
    if kind == "alpaca":
        return {"path": str(folder), "type": "alpaca", "ds_type": "parquet"}
    return {"path": str(folder), "type": "chat_template", "ds_type": "parquet",
            "chat_template": "chatml", "field_messages": "messages",
            "roles_to_train": ["assistant"]}


def config(kind: str, side: str, folder: Path, model: Path, root: Path) -> dict:
    """The axolotl config of a case: the same for both sides but for ``plugins:``."""
    made = {"base_model": str(model), "datasets": [entry(kind, folder)],
            "sequence_len": SEQ_LEN, "micro_batch_size": MICRO_BATCH,
            "gradient_accumulation_steps": 1, "max_steps": 1_000_000, "num_epochs": 1,
            "sample_packing": True, "sample_packing_group_size": BUFFER,
            "sample_packing_bin_size": BIN_SIZE, "attn_implementation": "sdpa",
            "dataset_num_proc": 1, "dataloader_num_workers": 1, "seed": SEED,
            "val_set_size": 0, "optimizer": "adamw_torch", "learning_rate": 0.001,
            "bf16": False, "fp16": False, "tf32": False,
            "output_dir": str(root / "out" / f"{kind}-{side}"),
            "dataset_prepared_path": str(root / "prepared" / f"{kind}-{side}")}
    if side == "wdstream":
        made.update(plugins=[PLUGIN], wdstream={"packing_buffer": BUFFER})
    return made


# =========================================================================== cases (child side)


def counted(loader, started: float) -> dict:
    """Examples (a row's ``attention_mask`` numbers its examples 1, 2...), non-pad and all
    tokens of the batches ``loader`` gives, and the seconds from ``started`` to the last."""
    examples = real = slots = rows = 0
    for batch in loader:
        mask = batch["attention_mask"]
        rows += int(mask.shape[0])
        examples += int(mask.max(dim=1).values.sum())
        real += int((mask > 0).sum())
        slots += int(mask.numel())
    seconds = time.perf_counter() - started
    return {"examples": examples, "rows": rows, "tokens": real, "slots": slots,
            "efficiency": real / slots if slots else None, "seconds": seconds,
            "examples_per_s": examples / seconds}


def fresh(path: str) -> None:
    """A case's prepared data, outputs and ``datasets`` cache start empty (nothing from an
    earlier run)."""
    import shutil

    import yaml

    values = yaml.safe_load(Path(path).read_text())
    for folder in (values["dataset_prepared_path"], values["output_dir"],
                   os.environ.get("HF_DATASETS_CACHE")):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def case_wdstream(path: str) -> dict:
    from axolotl.cli.config import load_cfg
    from axolotl.integrations.base import PluginManager

    import wdstream.integrations.axolotl  # noqa: F401 - imported before the clock

    common.quiet_logs()
    fresh(path)
    started = common.start_clock()
    cfg = load_cfg(path)
    PluginManager.get_instance().load_datasets(cfg, preprocess=False)
    plugin = next(p for p in PluginManager.get_instance().plugins.values()
                  if type(p).__name__ == "WdstreamPlugin")
    return {**counted(plugin.loader, started), "workers": cfg.dataloader_num_workers}


def case_axolotl(path: str) -> dict:
    import torch
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets
    from axolotl.loaders import load_tokenizer
    from axolotl.monkeypatch.data.batch_dataset_fetcher import apply_multipack_dataloader_patch
    from axolotl.utils.collators import V2BatchSamplerDataCollatorForSeq2Seq
    from axolotl.utils.samplers import MultipackBatchSampler, get_dataset_lengths

    from wdstream.integrations.axolotl_packing import padding_of

    common.quiet_logs()
    fresh(path)
    started = common.start_clock()
    cfg = load_cfg(path)
    dataset = load_datasets(cfg=cfg).train_dataset
    real = cfg.multipack_real_batches if cfg.multipack_real_batches is not None \
        else not cfg.attn_supports_packing  # as axolotl's trainer builder decides
    generator = torch.Generator().manual_seed(cfg.seed)
    sampler = MultipackBatchSampler(
        torch.utils.data.RandomSampler(dataset, generator=generator),
        lengths=get_dataset_lengths(dataset),
        batch_max_len=cfg.sequence_len if real else cfg.micro_batch_size * cfg.sequence_len,
        batch_size=cfg.micro_batch_size if real else 1,
        group_size=cfg.sample_packing_group_size, bin_size=cfg.sample_packing_bin_size,
        sequential=cfg.sample_packing_sequentially, drop_last=True,
        num_processes=cfg.dataset_num_proc)
    len(sampler)  # as its trainer does, before the loader reads
    collate = V2BatchSamplerDataCollatorForSeq2Seq(load_tokenizer(cfg), padding=True,
                                                   return_tensors="pt", **padding_of(cfg))
    apply_multipack_dataloader_patch()  # as its model loader does with sample packing
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    return {**counted(loader, started), "workers": cfg.dataset_num_proc,
            "real_batches": bool(real)}


# =========================================================================== the figure


def measure(quick: bool) -> list[dict]:
    import yaml

    sizes = QUICK if quick else FULL
    rows = []
    with common.scratch("wdstream-axolotl-packing-") as scratch:
        root = Path(scratch)
        folders = write_data(root, sizes["rows"])
        model = tiny_model(root)
        cases = {}
        for kind in FORMATS:
            for side in SIDES:
                path = root / f"{kind}-{side}.yml"
                path.write_text(yaml.safe_dump(config(kind, side, folders[kind], model, root)))
                # its own datasets cache, emptied before each run: axolotl's maps are
                # cached by the rows' fingerprint and would be read back, not run again
                cache = {"HF_DATASETS_CACHE": str(root / "hf-cache" / f"{kind}-{side}")}
                cases[f"{kind} {side}"] = (f"benchmarks.axolotl_packing:case_{side}",
                                           {"path": str(path)}, {**ENV, **cache})
        found = common.repeat(cases, progress=lambda text: common.log(f"axolotl_packing: "
                                                                      f"{text}"))
    for kind in FORMATS:
        ours, theirs = found[f"{kind} wdstream"], found[f"{kind} axolotl"]
        for side, result in (("wdstream", ours), ("axolotl", theirs)):
            rows.append(case_row(kind, side, result))
        rows.append(ratio_row(kind, ours, theirs))
    rows.append({"table": T_RATIOS, "note": (
        f"{sizes['rows']:,} rows a format (one Parquet file, a local folder); sequence_len "
        f"{SEQ_LEN}, micro_batch_size {MICRO_BATCH}, pad_to_sequence_len (axolotl's default "
        f"with sample_packing), sdpa (real batches); packing_buffer = "
        f"sample_packing_group_size = {BUFFER}, sample_packing_bin_size {BIN_SIZE}; one "
        f"worker a side (dataloader_num_workers 1 / dataset_num_proc 1)")})
    return rows


def case_row(kind: str, side: str, result: dict) -> dict:
    return {"table": T_CASES, "format": kind, "side": side, "runs": result.get("runs"),
            "examples": result.get("examples"), "rows": result.get("rows"),
            "efficiency": three(result.get("efficiency")), "seconds": result.get("seconds"),
            "examples/s per worker": per_worker(result),
            "peak RSS MB": result.get("peak_rss_mb"), "error": result.get("error")}


def three(value: float | None) -> str | None:
    return None if value is None else f"{value:.3f}"


def per_worker(result: dict) -> float | None:
    if result.get("examples_per_s") is None:
        return None
    return result["examples_per_s"] / max(result.get("workers") or 1, 1)


def ratio_row(kind: str, ours: dict, theirs: dict) -> dict:
    efficiency = common.ratio(ours.get("efficiency"), theirs.get("efficiency"))
    speed = common.ratio(per_worker(ours), per_worker(theirs))
    met = efficiency is not None and speed is not None and min(efficiency, speed) >= GOAL
    return {"table": T_RATIOS, "format": kind, "packing efficiency": three(efficiency),
            "examples/s per worker": speed, "goal": GOAL, "met": "yes" if met else "no"}


def run(quick: bool) -> list[dict]:
    if importlib.util.find_spec("axolotl") is not None:
        return measure(quick)
    default = REPO / ".tox" / "axolotl" / "bin" / "python"
    python = os.environ.get(PYTHON_ENV) or (str(default) if default.exists() else "")
    if not python:
        return [{"table": T_RATIOS, "note": f"skipped: axolotl does not import here; name an "
                 f"interpreter where it does ({PYTHON_ENV}, e.g. .tox/axolotl/bin/python)"}]
    return common.rows_from(python, "axolotl_packing", quick)


def main(argv: list[str]) -> int:
    """``python -m benchmarks.axolotl_packing [OUT.json] [--quick]``: the rows as JSON into
    OUT.json (run by ``run`` in axolotl's interpreter), else printed as tables."""
    return common.module_main("axolotl_packing", TITLE, run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
