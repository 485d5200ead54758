"""LLM input pipeline: tokens/s of tokenize + pack, and the cost of mixing sources.

- ``PackedSequences`` over local text shards, ``seq_len`` 512, batch 16, 2 DataLoader workers
  (tokenizing runs in the workers): a BPE ``tokenizer.json`` (vocabulary 4096, trained here on
  the generated text) on the documents' text, and the same documents stored pre-tokenized
  (``tokens.npy``, uint16) packed without a tokenizer. Tokens/s counts the tokens delivered
  in whole sequences, from building the dataset to the last batch.
- ``Mix`` overhead: the same number of ~1 KiB JSON samples read through a ``Mix`` (of one
  source, and of two sources 50/50) and straight from one ``StreamingDataset``, 2 workers,
  batch 64; the ratio of times is the mixture's overhead (goal ≤ 1.1).

Run alone: ``python -m benchmarks.llm [--quick]``.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import resource
import sys
import time
from pathlib import Path

from . import common
from .common import quiet_logs, ratio
from .read import goal

TITLE = "LLM pipeline: tokenize, pack, mix"
WORKERS = 2
SEQ_LEN = 512
PACK_BATCH = 16
MIX_BATCH = 64

FULL = {"documents": 40_000, "per_shard": 2_000, "samples": 200_000, "sample_shard": 2_000}
QUICK = {"documents": 4_000, "per_shard": 500, "samples": 40_000, "sample_shard": 1_000}

T_PACK = f"tokenize + pack into {SEQ_LEN}-token sequences, {WORKERS} workers, batch {PACK_BATCH}"
T_MIX = f"mixing overhead, ~1 KiB JSON samples, {WORKERS} workers, batch {MIX_BATCH}"
T_GOALS = "goals (issue 5)"


# =========================================================================== data


def _words(count: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(count)]


def text_dataset(folder: Path, documents: int, per_shard: int) -> dict:
    """Shards of ``{key}.json`` ({"text": ...}, 50 to 400 words drawn from a Zipf-like
    vocabulary) and, after a tokenizer is trained on a part of them, ``{key}.tokens.npy``."""
    import numpy as np

    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar import TarWriter

    rng = random.Random(5)
    vocabulary = _words(5000)
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    texts = [" ".join(rng.choices(vocabulary, weights, k=rng.randint(50, 400)))
             for _ in range(documents)]
    (folder / "shards").mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(texts[:2000], folder / "tokenizer.json")
    infos = []
    for shard in range(-(-documents // per_shard)):
        buffer = io.BytesIO()
        writer = TarWriter(buffer)
        for index in range(shard * per_shard, min(documents, (shard + 1) * per_shard)):
            writer.add(f"{index:010d}.json", json.dumps({"text": texts[index]}).encode())
            ids = tokenizer.encode(texts[index], add_special_tokens=False).ids
            npy = io.BytesIO()
            np.save(npy, np.asarray(ids, dtype=np.uint16))
            writer.add(f"{index:010d}.tokens.npy", npy.getvalue())
        writer.close()
        data = buffer.getvalue()
        name = f"shard-{shard:06d}.tar"
        (folder / "shards" / name).write_bytes(data)
        count = min(documents, (shard + 1) * per_shard) - shard * per_shard
        infos.append(ShardInfo(name, count, len(data), hashlib.sha256(data).hexdigest()))
    (folder / "shards" / "index.json").write_text(
        Manifest(infos, extensions=["json", "tokens.npy"]).to_json())
    return {"dir": str(folder / "shards"), "tokenizer": str(folder / "tokenizer.json"),
            "eos": tokenizer.token_to_id("<eos>"), "documents": documents}


def _train_tokenizer(texts: list[str], path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<unk>", "<eos>"],
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return tokenizer


# =========================================================================== cases (child side)


def _cpu_seconds() -> float:
    """User + system time of this process and of its waited-for children (the DataLoader
    workers, once an epoch is over): robust to other load on the machine, unlike wall time."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def case_pack(source: str, tokenizer: str | None, eos: int, field: str) -> dict:
    """Tokenize (unless ``tokenizer`` is None: pre-tokenized) and pack one epoch."""
    quiet_logs()
    import wdstream
    import wdstream.loader  # noqa: F401 - torch imported before the clock
    import wdstream.packing  # noqa: F401

    started, cpu = time.perf_counter(), _cpu_seconds()
    dataset = wdstream.StreamingDataset(source, seed=1)
    packed = wdstream.PackedSequences(dataset, tokenizer, SEQ_LEN, eos=eos, text_field=field)
    loader = wdstream.DataLoader(packed, batch_size=PACK_BATCH, num_workers=WORKERS)
    sequences = 0
    for batch in loader:
        sequences += len(batch["input_ids"])
    seconds = time.perf_counter() - started
    return {"sequences": sequences, "tokens": sequences * SEQ_LEN, "seconds": seconds,
            "cpu_s": _cpu_seconds() - cpu}


def case_mix(sources: list[str] | None, single: str | None) -> dict:
    """One epoch straight from ``single``, or through a Mix of ``sources`` (equal weights,
    stop at the first exhausted: with equal sizes every sample is read once)."""
    quiet_logs()
    import wdstream
    import wdstream.loader  # noqa: F401
    import wdstream.mix  # noqa: F401

    started, cpu = time.perf_counter(), _cpu_seconds()
    if single is not None:
        dataset = wdstream.StreamingDataset(single, seed=1)
    else:
        parts = [wdstream.StreamingDataset(url, seed=1 + i) for i, url in enumerate(sources)]
        dataset = wdstream.Mix(parts, [1] * len(parts), seed=2)
    loader = wdstream.DataLoader(dataset, batch_size=MIX_BATCH, num_workers=WORKERS)
    result = common.consume(loader, started)
    return {**result, "cpu_s": _cpu_seconds() - cpu}


def halves(dataset: dict, folder: Path) -> list[str]:
    """Two datasets made of the first and the second half of ``dataset``'s shards (hard
    links, own manifests)."""
    from wdstream.shards.manifest import Manifest, load_manifest

    manifest = load_manifest(dataset["dir"])
    middle = len(manifest.shards) // 2
    out = []
    for name, infos, paths in (("first", manifest.shards[:middle], dataset["shards"][:middle]),
                               ("second", manifest.shards[middle:], dataset["shards"][middle:])):
        target = folder / name
        target.mkdir(parents=True, exist_ok=True)
        for info, path in zip(infos, paths, strict=True):
            (target / info.url).hardlink_to(path)
        (target / "index.json").write_text(
            Manifest(infos, extensions=manifest.extensions).to_json())
        out.append(str(target))
    return out


# =========================================================================== parent side


def run(quick: bool) -> list[dict]:
    sizes = QUICK if quick else FULL
    rows: list[dict] = []
    here = f"{__spec__.name}:"  # "benchmarks.llm", also when run as python -m benchmarks.llm
    with common.scratch() as root:
        common.log(f"llm: writing {sizes['documents']:,} documents and training a tokenizer")
        text = text_dataset(root / "text", sizes["documents"], sizes["per_shard"])
        common.log(f"llm: writing {sizes['samples']:,} ~1 KiB JSON samples")
        data = common.json_dataset(root / "json", sizes["samples"], sizes["sample_shard"],
                                   jsonl=False)
        pack_cases = {
            "text through tokenizer.json (BPE 4096)": (
                here + "case_pack", {"source": text["dir"], "tokenizer": text["tokenizer"],
                                     "eos": text["eos"], "field": "text"}),
            "pre-tokenized tokens.npy": (
                here + "case_pack", {"source": text["dir"], "tokenizer": None,
                                     "eos": text["eos"], "field": "tokens.npy"}),
        }
        packs = common.repeat(pack_cases, progress=common.log)
        parts = halves(data, root / "halves")
        mix_cases = {
            "StreamingDataset": (here + "case_mix", {"sources": None, "single": data["dir"]}),
            "Mix of 1 source": (here + "case_mix", {"sources": [data["dir"]], "single": None}),
            "Mix of 2 sources (the halves), 50/50": (
                here + "case_mix", {"sources": parts, "single": None}),
        }
        mixes = common.repeat(mix_cases, progress=common.log)

    for name, result in packs.items():
        rows.append({"table": T_PACK, "input": name, "tokens/s": ratio(result.get("tokens"),
                                                                       result.get("seconds")),
                     "sequences": result.get("sequences"), "seconds": result.get("seconds"),
                     "CPU s": result.get("cpu_s"), "peak RSS MB": result.get("peak_rss_mb"),
                     "runs": result.get("runs"), "error": result.get("error")})
    rows.append({"table": T_PACK, "note":
                 f"{text['documents']:,} documents of 50-400 words; times run from building "
                 "the dataset (after imports) to the last batch, worker start-up included; "
                 "CPU s adds the main process and both workers."})
    single = mixes["StreamingDataset"]

    def per_sample(result, key):
        return ratio(result.get(key), result.get("samples"))

    for name, result in mixes.items():
        rows.append({"table": T_MIX, "reader": name, "samples": result.get("samples"),
                     "samples/s": ratio(result.get("samples"), result.get("seconds")),
                     "seconds": result.get("seconds"),
                     "÷ StreamingDataset": ratio(per_sample(result, "seconds"),
                                                 per_sample(single, "seconds")),
                     "CPU s": result.get("cpu_s"),
                     "CPU ÷ StreamingDataset": ratio(per_sample(result, "cpu_s"),
                                                     per_sample(single, "cpu_s")),
                     "peak RSS MB": result.get("peak_rss_mb"), "runs": result.get("runs"),
                     "error": result.get("error")})
    rows.append({"table": T_MIX, "note":
                 f"One epoch of {sizes['samples']:,} samples in each case (the 2-source Mix "
                 "reads the two halves of the shards, and stops at the first exhausted, a few "
                 "samples short); ratios are per sample delivered. CPU time (main process + "
                 "workers) is the fairer figure on a loaded machine."})
    mixed = ("Mix of 1 source", "Mix of 2 sources (the halves), 50/50")

    def worst(key):
        values = [ratio(per_sample(mixes[n], key), per_sample(single, key)) for n in mixed]
        return max(values) if None not in values else None

    goals = [
        goal("Mix CPU time ÷ one StreamingDataset (worse of 1 and 2 sources)", worst("cpu_s"),
             1.1, higher_is_better=False, table=T_GOALS),
        goal("Mix wall time ÷ one StreamingDataset (worse of 1 and 2 sources)",
             worst("seconds"), 1.1, higher_is_better=False, table=T_GOALS),
    ]
    return goals + rows


def main(argv: list[str] | None = None) -> int:
    from .__main__ import print_tables

    argv = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    print_tables("llm", TITLE, run("--quick" in argv), time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
