"""axolotl's own example configs under the axolotl plugin: the share its start-up check
accepts, each refusal grouped by its reason, and the share of the accepted ones (a sample, or
all) that train for real.

- The configs: every YAML file below the folder ``WDSTREAM_BENCH_AXOLOTL_EXAMPLES`` names
  (axolotl's repository's ``examples/``), those of text SFT and pretraining only: a config
  with an ``rl:`` key (DPO, KTO, GRPO...), ``reward_model`` or ``process_reward_model`` is not
  SFT; one with ``processor_type`` or a key naming images is vision; one without
  ``datasets:`` or ``pretraining_dataset:`` has no data to stream.
- Made tiny and CPU-only by a mechanical rewrite that keeps every data key (each
  ``datasets:``/``pretraining_dataset:``/``test_datasets:`` entry with all its keys,
  ``sample_packing``, ``val_set_size``, ``sequence_len``, ``chat_template``...): the tests'
  tiny Llama (``tests/axolotl/tiny_model.py``), ``micro_batch_size`` 1, ``max_steps`` 2, no
  adapter, quantization, DeepSpeed, FSDP, flash attention or other plugin.
- Each entry's ``path`` is a folder on a local moto S3 server holding generated rows as
  Parquet with the columns its prompt format reads, where its ``name``/``split`` put them
  (``data_files`` are written under their own names, as JSON Lines): 400 rows, or more where
  ``val_set_size`` would hold out fewer than 8 of the rows its ``split:`` slice reads
  (``train[:5%]`` at 0.02: 8,000 rows, of which the slice reads 400 and holds out about 8).
- Measured: ``WdstreamPlugin.register`` in-process, the check axolotl runs before the model
  loads (keys, settings, the datasets' files and columns); then ``WDSTREAM_BENCH_AXOLOTL_TRAIN``
  (default 6, 0 with ``--quick``; a number over the accepted configs trains them all)
  accepted configs, one of each prompt format first, trained with ``axolotl train``, two at
  a time: the share that ran (goal the same), by format, and each that did not.

Runs where axolotl imports (tox's ``axolotl`` environment); elsewhere the interpreter
``WDSTREAM_BENCH_AXOLOTL_PYTHON`` names runs it (``python -m benchmarks.axolotl_configs``).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import common

TITLE = "axolotl's example configs under the plugin"
EXAMPLES_ENV = "WDSTREAM_BENCH_AXOLOTL_EXAMPLES"
PYTHON_ENV = "WDSTREAM_BENCH_AXOLOTL_PYTHON"
TRAIN_ENV = "WDSTREAM_BENCH_AXOLOTL_TRAIN"
REPO = Path(__file__).resolve().parent.parent
PLUGIN = "wdstream.integrations.axolotl.WdstreamPlugin"
ROWS = 400  # rows of an entry's dataset, at the least
HELD_OUT = 8  # rows val_set_size holds out of an entry's split (or its slice), about
GOAL = 0.9
BUCKET = "axolotl-configs"
ENTRY_KEYS = ("datasets", "pretraining_dataset", "test_datasets")
T_SHARE = "the plugin's start-up check on the example configs"
T_REFUSED = "refusals, grouped by reason (a config may have several)"
T_TRAINED = "accepted configs trained (axolotl train, max_steps 2)"
T_BY_FORMAT = "the configs trained, by the prompt format of their first entry"
T_FAILED = "the configs that did not train"
TRAIN_SECONDS = 900  # a config's training at most
TRAINED_AT_ONCE = 2  # trainings at once (the machine's 2 cores)
# the line of a traceback that names what was raised (pydantic's own: "  Value error, ...")
RAISED = re.compile(r"^([\w.]*(Error|Exception|Warning): |\s+Value error, )")

# keys of the model, the hardware, adapters, plugins and logging: dropped (the data keys all
# stay)
DROPPED = re.compile(
    r"^(adapter|lora_|peft_|load_in_|gptq|deepspeed|fsdp|flash_attn|flash_attention|"
    r"sdp_attention|xformers|flex_attention|s2_attention|attn_implementation|bf16|fp16|tf32|"
    r"fp8|gradient_checkpointing|liger_|unsloth_|torch_compile|plugins|cut_cross_entropy|"
    r"wandb_|mlflow_|comet_|hub_|use_tensorboard|tensor_parallel|context_parallel|"
    r"sequence_parallel|ring_attn|base_model|tokenizer_|model_type|model_config|"
    r"trust_remote_code|quantiz|qat|relora|llmcompressor|kd_|torch_dtype|low_cpu_mem|"
    r"device_map|max_memory|ddp|resume_from_checkpoint|auto_resume|save_|saves_per_epoch|"
    r"early_stopping|profiler|optimizer|optim_|special_tokens|tokens$|eot_tokens|"
    r"lisa_|moe_|kernels|use_kernels|dynamic_offload|activation_offloading|output_dir|tiled_mlp|"
    r"dataset_prepared_path|gpu_|num_gpus|local_rank|overrides_of_model|"
    r"micro_batch_size|gradient_accumulation_steps|eval_batch_size|batch_size$|max_steps|"
    r"num_epochs|float16|bfloat16|float32|unfrozen_parameters|gemma4_hybrid_attn_impl|"
    r"model_quantization_config|dp_shard_size|dp_replicate_size|expert_parallel_size|"
    r"experts_implementation|use_ray|ray_|use_onebitllms|diffusion|"
    r"experimental_skip_move_to_device|ple_cpu_offload)")
TINY = {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "eval_batch_size": 1,
        "max_steps": 2, "num_epochs": 1, "optimizer": "adamw_torch", "bf16": False,
        "fp16": False, "tf32": False, "attn_implementation": "sdpa", "save_steps": 2,
        "logging_steps": 1, "plugins": [PLUGIN], "dataloader_num_workers": 0}


# =========================================================================== the configs


def excluded(config) -> str | None:
    """Why a config is not one of text SFT or pretraining (None: it is)."""
    if not isinstance(config, dict):
        return "not a mapping"
    if "rl" in config:
        return "rl"
    if config.get("reward_model") or config.get("process_reward_model"):
        return "reward model"
    if config.get("processor_type") or any("image" in str(key) for key in config):
        return "vision"
    if not (config.get("datasets") or config.get("pretraining_dataset")):
        return "no datasets"
    return None


def configs(folder: Path) -> tuple[list[tuple[str, dict]], collections.Counter]:
    """(name, config) of the folder's text SFT and pretraining configs, and the others
    counted by why they are not."""
    import yaml

    kept, others = [], collections.Counter()
    for path in sorted(folder.rglob("*.y*ml")):
        try:
            config = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            others["not YAML"] += 1
            continue
        why = excluded(config)
        if why is None:
            kept.append((str(path.relative_to(folder)), config))
        else:
            others[why] += 1
    return kept, others


def entries(config: dict, key: str) -> list:
    value = config.get(key)
    return [value] if isinstance(value, dict | str) else list(value or [])


def tiny(config: dict, model: str, output: str, where: dict) -> dict:
    """The config made tiny and CPU-only, every data key kept, each entry's path the S3
    folder ``where[(key, index)]``."""
    made = {key: value for key, value in config.items() if not DROPPED.match(str(key))}
    made.update(TINY, base_model=model, output_dir=output)
    for key in ENTRY_KEYS:
        if key in config:
            moved = [dict(entry, path=where[(key, i)]) if isinstance(entry, dict) else entry
                     for i, entry in enumerate(entries(config, key))]
            made[key] = moved[0] if isinstance(config[key], dict) else moved
    return made


# =========================================================================== their data


def words(rng: random.Random, low: int, high: int) -> str:
    vocabulary = ("the a stream shard epoch token batch resume seed rank worker model data "
                  "loss step train pack mix weight source window order plan sample").split()
    return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(low, high)))


def record(entry: dict, rng: random.Random) -> dict:
    """A row with the columns the entry's prompt format reads (those of alpaca and text
    always, besides), its values short generated words."""
    row = {"instruction": words(rng, 3, 8), "input": words(rng, 0, 4),
           "output": words(rng, 2, 10), "text": words(rng, 5, 40)}
    kind = entry.get("type")
    if isinstance(kind, dict):  # a format written in the config: its fields
        for key, value in kind.items():
            if key.startswith("field_") and isinstance(value, str):
                row[value] = words(rng, 2, 8)
    for key in ("field", "text_column"):
        if isinstance(entry.get(key), str):
            row[entry[key]] = words(rng, 5, 40)
    row["conversations"] = [{"from": "human", "value": words(rng, 3, 8)},
                            {"from": "gpt", "value": words(rng, 2, 10)}]
    row[entry.get("field_messages") or "messages"] = messages(entry, rng)
    base = kind.partition(":")[0] if isinstance(kind, str) else ""
    if kind is None:  # no type: rows already tokenized (ids within the tiny vocabulary,
        # about 100 tokens: a BPE of at most 160 trained on these words)
        ids = [rng.randrange(4, 64) for _ in range(rng.randint(5, 40))]
        row.update(input_ids=ids, attention_mask=[1] * len(ids), labels=ids)
    if base == "jeopardy":
        row.update(question=words(rng, 3, 8), category=words(rng, 1, 2),
                   answer=words(rng, 1, 4))
    if base == "stepwise_supervised":
        row.update(prompt=words(rng, 3, 8), completions=[words(rng, 2, 6) for _ in range(2)],
                   labels=[True, False])
    return row


def messages(entry: dict, rng: random.Random) -> list[dict]:
    """A user and an assistant turn under the entry's property names (with its thinking
    field, if it names one)."""
    names = {"role": "role", "content": "content"}
    names.update({key: value for key, value in (entry.get("message_property_mappings")
                                                 or {}).items() if isinstance(value, str)})
    for legacy, key in (("message_field_role", "role"), ("message_field_content", "content")):
        if isinstance(entry.get(legacy), str):
            names[key] = entry[legacy]
    turns = [{names["role"]: "user", names["content"]: words(rng, 3, 8)},
             {names["role"]: "assistant", names["content"]: words(rng, 2, 10)}]
    if isinstance(entry.get("field_thinking"), str):
        turns[1][entry["field_thinking"]] = words(rng, 2, 6)
    return turns


def row_count(entry, held_out: float) -> int:
    """How many rows the entry's dataset gets: ``ROWS``, or enough that ``val_set_size``
    (``held_out``) holds out about ``HELD_OUT`` rows of its ``split:`` slice, as it does of
    the datasets the configs name (``train[:10%]`` of FineTome-100k is 10,000 rows)."""
    wanted = math.ceil(HELD_OUT / held_out) if held_out else 0
    split = entry.get("split") if isinstance(entry, dict) else None
    stop = str(split).partition("[")[2].rstrip("]").partition(":")[2].strip()
    if stop.endswith("%") and stop[:-1].isdigit() and int(stop[:-1]) > 0:
        wanted = math.ceil(wanted * 100 / int(stop[:-1]))
    return max(ROWS, wanted)


def write_entry(entry, folder: Path, seed: int, count: int) -> None:
    """The entry's ``count`` rows below ``folder`` (its S3 path's copy), where its keys read
    them: ``<name>/<split>-00000.parquet`` as the Hub names a split's files (in row groups of
    ``ROWS``), its ``data_files`` under their names (JSON Lines), else
    ``part-00000.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    entry = entry if isinstance(entry, dict) else {}
    rng = random.Random(seed)
    rows = [record(entry, rng) for _ in range(count)]
    files = entry.get("data_files")
    if files:
        for name in [files] if isinstance(files, str) else files:
            path = folder / str(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            text = "".join(json.dumps(row) + "\n" for row in rows)
            if path.suffix == ".zst":
                import zstandard

                path.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
            else:
                path.write_text(text)
        return
    below = folder / str(entry["name"]) if isinstance(entry.get("name"), str) else folder
    below.mkdir(parents=True, exist_ok=True)
    split = entry.get("split")
    # a split's slice (train[:20%]) reads the split's files
    name = f"{split.partition('[')[0]}-00000.parquet" if isinstance(split, str) \
        else "part-00000.parquet"
    pq.write_table(pa.Table.from_pylist(rows), below / name, row_group_size=ROWS)


# =========================================================================== the check


def reasons(message: str) -> list[str]:
    """A refusal's mistakes, each with the entry's index and path, the config's values and
    files left out, so that the same reason groups whatever config it was found in."""
    text = re.sub(r"^\w+Error: ", "", message)
    found = text.split("\n  - ")[1:] if re.match(r"the axolotl config: \d+ errors:", text) \
        else [text]
    general = []
    for item in found:
        item = re.sub(r"\b(datasets|pretraining_dataset|test_datasets)\[\d+\]( \([^)]*\))?",
                      r"\1[i]", item.strip())
        item = re.sub(r"s3://\S+", "s3://…", item)
        item = re.sub(r"\((its columns: )[^)]*\)", r"(\1…)", item)
        item = re.sub(r"'[^']*'", "'…'", item) if "unknown key" not in item else item
        general.append(item.splitlines()[0][:220])
    return general


def check(config: dict) -> list[str]:
    """The reasons ``WdstreamPlugin.register`` refuses the config for ([]: accepted)."""
    from axolotl.utils.dict import DictDefault

    from wdstream.integrations.axolotl import WdstreamPlugin

    try:
        WdstreamPlugin().register(DictDefault(config))
    except SystemExit as refusal:
        return reasons(str(refusal))
    except Exception as error:  # noqa: BLE001 - a crash of the check is a finding too
        return [f"crash: {type(error).__name__}: {str(error).splitlines()[0][:160]}"]
    return []


def prepared(found: list, root: Path, server) -> list[tuple[str, dict]]:
    """Each config made tiny, its datasets written and uploaded to the S3 server."""
    data = root / "data"
    made = []
    for number, (name, config) in enumerate(found):
        where = {}
        for key in ENTRY_KEYS:
            for index, entry in enumerate(entries(config, key)):
                prefix = f"c{number:03d}/{key}-{index}"
                held_out = float(config.get("val_set_size") or 0) if key == "datasets" else 0
                write_entry(entry, data / prefix, number * 100 + index,
                            row_count(entry, held_out))
                where[(key, index)] = f"s3://{BUCKET}/{prefix}/"
        made.append((name, tiny(config, str(root / "model"), str(root / "out" / name),
                                where)))
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, str(path.relative_to(data)))
    return made


def kind_of(config: dict) -> str:
    first = (entries(config, "datasets") or entries(config, "pretraining_dataset") or [{}])[0]
    kind = first.get("type") if isinstance(first, dict) else None
    return "custom" if isinstance(kind, dict) else str(kind).partition(":")[0]


# =========================================================================== training


def sample(accepted: list[tuple[str, dict]], count: int) -> list[tuple[str, dict]]:
    """``count`` accepted configs: the first of each prompt format, then of each format with
    and without packing, then the others, in the folder's order."""
    chosen: list[tuple[str, dict]] = []
    for mark in (lambda c: kind_of(c), lambda c: (kind_of(c), bool(c.get("sample_packing"))),
                 lambda c: None):
        seen = {mark(config) for _name, config in chosen}
        for name, config in accepted:
            if (mark(config) not in seen or mark(config) is None) and \
                    (name, config) not in chosen:
                seen.add(mark(config))
                chosen.append((name, config))
    return chosen[:count]


def train(name: str, config: dict, root: Path, env: dict) -> dict:
    """``axolotl train`` of one config: whether it ran, the last error line if not."""
    import yaml

    path = root / "configs" / (name.replace("/", "__"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "axolotl.cli.train", str(path)],
                              cwd=root, env=env, capture_output=True, text=True,
                              timeout=TRAIN_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        error = f"still training after {TRAIN_SECONDS} s"
    else:
        error = "" if done.returncode == 0 else raised(done.stderr) or f"exit {done.returncode}"
    return {"config": name, "format": kind_of(config),
            "sample_packing": bool(config.get("sample_packing")),
            "val_set_size": config.get("val_set_size") or 0, "trained": not error,
            "seconds": time.monotonic() - started, "error": error}


def raised(stderr: str) -> str:
    """The last line of ``stderr`` naming what was raised (its class without its module;
    with a pydantic error's field and message, the two lines after it), at most 200
    characters."""
    lines = stderr.splitlines()
    found = [index for index, line in enumerate(lines) if RAISED.match(line)]
    if not found:
        return ""
    at = found[-1]
    said = lines[at:at + 3] if "validation error" in lines[at] else lines[at:at + 1]
    return re.sub(r"^[\w.]*\.(?=\w+: )", "", " ".join(line.strip() for line in said))[:200]


def train_all(chosen: list[tuple[str, dict]], root: Path, env: dict) -> list[dict]:
    """``train`` of each config, ``TRAINED_AT_ONCE`` at a time (a training spends much of its
    time starting, on one core), each logged as it ends."""
    def one(index: int) -> dict:
        name, config = chosen[index]
        result = train(name, config, root, env)
        common.log(f"trained {index + 1}/{len(chosen)}: {name}: {result['error'] or 'ran'} "
                   f"({result['seconds']:.0f} s)")
        return result

    with ThreadPoolExecutor(TRAINED_AT_ONCE) as pool:
        return list(pool.map(one, range(len(chosen))))


def trained_rows(results: list[dict], accepted: int) -> list[dict]:
    """The share of the configs trained that ran, by format, and each that did not."""
    ran = sum(r["trained"] for r in results)
    share = ran / len(results)
    rows = [{"table": T_TRAINED, "accepted": accepted, "trained": len(results), "ran": ran,
             "share": share, "goal": GOAL, "met": "yes" if share >= GOAL else "no",
             "median s": common.median([r["seconds"] for r in results])}]
    by_format = collections.defaultdict(list)
    for result in results:
        by_format[result["format"]].append(result["trained"])
    rows += [{"table": T_BY_FORMAT, "format": kind, "configs": len(ran_each),
              "ran": sum(ran_each)} for kind, ran_each in sorted(by_format.items())]
    rows += [{"table": T_FAILED, **{k: v for k, v in r.items() if k != "trained"}}
             for r in results if not r["trained"]]
    return rows


def tiny_model(root: Path) -> None:
    """The tests' tiny Llama, its tokenizer given axolotl's ChatML template as its own (the
    configs' ``chat_template: tokenizer_default`` is their model's)."""
    from axolotl.utils.chat_templates import get_chat_template

    texts = root / "texts.jsonl"
    rng = random.Random(1)
    texts.write_text("".join(json.dumps({"text": words(rng, 5, 40)}) + "\n"
                             for _ in range(200)))
    subprocess.run([sys.executable, str(REPO / "tests" / "axolotl" / "tiny_model.py"),
                    str(root / "model"), str(texts)], check=True, capture_output=True)
    settings = root / "model" / "tokenizer_config.json"
    values = json.loads(settings.read_text())
    values["chat_template"] = get_chat_template("chatml")
    settings.write_text(json.dumps(values))


# =========================================================================== the figure


def measure(folder: Path, quick: bool) -> list[dict]:
    from .local_servers import LocalS3, environ

    found, others = configs(folder)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wdstream-axolotl-configs-") as scratch, \
            LocalS3() as server, environ(server.env):
        root = Path(scratch)
        made = prepared(found, root, server)
        refusals = collections.defaultdict(list)
        accepted = []
        for name, config in made:
            found_reasons = check(config)
            for reason in dict.fromkeys(found_reasons):
                refusals[reason].append(name)
            if not found_reasons:
                accepted.append((name, config))
        share = len(accepted) / len(made) if made else 0.0
        rows.append({"table": T_SHARE, "configs": len(made), "accepted": len(accepted),
                     "share": share, "goal": GOAL, "met": "yes" if share >= GOAL else "no"})
        rows.append({"table": T_SHARE, "note": "left out: " + ", ".join(
            f"{count} {why}" for why, count in sorted(others.items())) + f" (of {folder})"})
        for reason, names in sorted(refusals.items(), key=lambda item: -len(item[1])):
            rows.append({"table": T_REFUSED, "configs": len(names), "reason": reason,
                         "for example": ", ".join(names[:2])})
        count = int(os.environ.get(TRAIN_ENV, "0" if quick else "6"))
        if count and accepted:
            tiny_model(root)
            env = dict(os.environ, AXOLOTL_DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
                       WANDB_MODE="disabled", OMP_NUM_THREADS="1",
                       TOKENIZERS_PARALLELISM="false")
            rows += trained_rows(train_all(sample(accepted, count), root, env), len(accepted))
    return rows


def skipped(why: str) -> list[dict]:
    return [{"table": T_SHARE, "note": f"skipped: {why}"}]


def run(quick: bool) -> list[dict]:
    folder = os.environ.get(EXAMPLES_ENV)
    if not folder:
        return skipped(f"no axolotl examples directory given ({EXAMPLES_ENV})")
    if not Path(folder).is_dir():
        return skipped(f"{folder} is not a directory")
    if importlib.util.find_spec("axolotl") is not None:
        return measure(Path(folder), quick)
    python = os.environ.get(PYTHON_ENV)
    if not python:
        return skipped(f"axolotl does not import here; name an interpreter where it does "
                       f"({PYTHON_ENV}, e.g. .tox/axolotl/bin/python)")
    return common.rows_from(python, "axolotl_configs", quick)


def main(argv: list[str]) -> int:
    """``python -m benchmarks.axolotl_configs [OUT.json] [--quick]``: the rows as JSON into
    OUT.json (run by ``run`` in axolotl's interpreter), else printed as tables."""
    return common.module_main("axolotl_configs", TITLE, run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
