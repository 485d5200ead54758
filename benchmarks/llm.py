"""LLM input pipeline: tokens/s of tokenize + pack, and the cost of mixing sources.

- ``PackedSequences`` over local text shards, ``seq_len`` 512, batch 16, 2 DataLoader workers
  (tokenizing runs in the workers): a BPE ``tokenizer.json`` (vocabulary 4096, trained here on
  the generated text) on the documents' text, and the same documents stored pre-tokenized
  (``tokens.npy``, uint16) packed without a tokenizer. Tokens/s counts the tokens delivered
  in whole sequences, from building the dataset to the last batch.
- ``Mix`` overhead: the same number of ~1 KiB JSON samples read through a ``Mix`` (of one
  source, and of two sources 50/50) and straight from one ``StreamingDataset``, 2 workers,
  batch 64; the ratio of times is the mixture's overhead (goal ≤ 1.1).
- The same through the DataLoader for a packed 5-source mixture with a 5-stage schedule.
- The packing stage alone, one worker's work in one process (CPU time): pre-tokenized
  documents (goal ≥ 10 M tokens/s per worker), the same as 5 sources through a ``Mix`` with
  fixed weights, with a 5-stage schedule by samples and by tokens (with the per-source
  accounting; goal ≤ 1.05 × plain), and tokenize + pack.
- The loader state of a packed 5-source scheduled mixture on 1 rank x 2 workers, and
  gathered from 8 ranks x 8 workers (goals < 4 KiB).

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
T_STAGE = f"packing stage alone, {SEQ_LEN}-token sequences, batch {PACK_BATCH}, one worker's work"
T_STATE = "loader state size (JSON)"
T_GOALS = "goals"


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
    from wdstream.shards.tar_writer import TarWriter

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


def case_pack(source: str, tokenizer: str | None, eos: int, field: str,
              documents: int | None = None) -> dict:
    """Tokenize (unless ``tokenizer`` is None: pre-tokenized) and pack one epoch; with
    ``documents``, of the 5-source Mix with a 5-stage schedule."""
    quiet_logs()
    import wdstream
    import wdstream.stages.sequences  # noqa: F401
    import wdstream.stream.load.loader  # noqa: F401 - torch imported before the clock

    started, cpu = time.perf_counter(), _cpu_seconds()
    dataset = wdstream.StreamingDataset(source, seed=1) if documents is None \
        else _five_stage_mix(source, documents)
    packed = wdstream.PackedSequences(dataset, tokenizer, SEQ_LEN, eos=eos, text_field=field)
    loader = wdstream.DataLoader(packed, batch_size=PACK_BATCH, num_workers=WORKERS)
    sequences = 0
    for batch in loader:
        sequences += len(batch["input_ids"])
    seconds = time.perf_counter() - started
    return {"sequences": sequences, "tokens": sequences * SEQ_LEN, "seconds": seconds,
            "cpu_s": _cpu_seconds() - cpu}


SCHEDULE_SOURCES = 5


TOKENS_PER_DOCUMENT = 200  # about the generated documents' mean, for stages by tokens


def _five_stage_mix(source: str, documents: int, scheduled: bool = True,
                    by_tokens: bool = False):
    """The documents as 5 sources (the same shards, 5 seeds) mixed by a 5-stage schedule
    (by samples drawn, or by tokens delivered; or by the first stage's weights throughout)
    over one epoch of as many samples."""
    import wdstream

    parts = [wdstream.StreamingDataset(source, seed=1 + i) for i in range(SCHEDULE_SOURCES)]
    step = documents // SCHEDULE_SOURCES
    key, unit = ("start_tokens", TOKENS_PER_DOCUMENT) if by_tokens else ("start", 1)
    schedule = [{key: k * step * unit, "weights": [1 + (i + k) % SCHEDULE_SOURCES
                                                   for i in range(SCHEDULE_SOURCES)]}
                for k in range(SCHEDULE_SOURCES)]
    weights = {"schedule": schedule} if scheduled else {"weights": schedule[0]["weights"]}
    return wdstream.Mix(parts, seed=2, stop="fixed", samples_per_epoch=documents,
                        names=[f"s{i}" for i in range(5)], **weights)


def case_stage(source: str, tokenizer: str | None, eos: int, field: str, mixture: str,
               documents: int) -> dict:
    """One worker's work, in this process: one stream of the whole epoch packed and cut into
    batches by the default collate (no transfer to a main process), CPU time."""
    quiet_logs()
    import itertools

    import wdstream
    from wdstream.stream.load.contract import IterationSpec
    from wdstream.stream.transfer.batching import collate

    inner = wdstream.StreamingDataset(source, seed=1) if mixture == "none" \
        else _five_stage_mix(source, documents, mixture != "weights", mixture == "tokens")
    packed = wdstream.PackedSequences(inner, tokenizer, SEQ_LEN, eos=eos, text_field=field)
    started = time.process_time()
    items = (item for item, _ in packed.positioned(IterationSpec(0, 0, 1, 1), 0, 0))
    sequences = 0
    while batch := list(itertools.islice(items, PACK_BATCH)):
        collate(batch)
        sequences += len(batch)
    cpu = time.process_time() - started
    return {"sequences": sequences, "tokens": sequences * SEQ_LEN, "cpu_s": cpu}


def case_state(source: str, eos: int, documents: int) -> dict:
    """The loader state of a packed 5-source scheduled mixture, 2 workers, after 20 batches;
    and the state of 8 ranks x 8 workers after 20 batches of 16 per rank, each stream's
    positions taken from that (rank, stream)'s own sequences and gathered as
    ``loader.state_dict()`` gathers them under torch.distributed."""
    quiet_logs()
    import itertools

    import wdstream
    from wdstream.stream.load.contract import IterationSpec
    from wdstream.stream.load.ranks import pack_positions
    from wdstream.stream.plan.epoch import RANKS

    def packed():
        return wdstream.PackedSequences(_five_stage_mix(source, documents), None, SEQ_LEN,
                                        eos=eos, text_field="tokens.npy",
                                        tokens_per_epoch=documents * 100)

    loader = wdstream.DataLoader(packed(), batch_size=PACK_BATCH, num_workers=WORKERS)
    list(itertools.islice(loader, 20))
    state = loader.state_dict()
    one = len(json.dumps(state))
    world = workers = 8
    per_stream = 20 * PACK_BATCH // workers
    stage, positions = packed(), []
    for stream in range(workers):
        ranks = []
        for rank in range(world):
            items = stage.positioned(IterationSpec(0, rank, world, workers), stream, 0)
            *_, (_, position) = itertools.islice(items, per_stream)
            items.close()
            ranks.append(position)
        positions.append({RANKS: pack_positions(ranks)})
    state.update(world=world, workers=workers, positions=positions, batches=[20] * workers)
    return {"bytes": one, "bytes_8x8": len(json.dumps(state))}


def case_mix(sources: list[str] | None, single: str | None) -> dict:
    """One epoch straight from ``single``, or through a Mix of ``sources`` (equal weights,
    stop at the first exhausted: with equal sizes every sample is read once)."""
    quiet_logs()
    import wdstream
    import wdstream.stages.mix  # noqa: F401
    import wdstream.stream.load.loader  # noqa: F401

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
            "pre-tokenized, 5-source Mix, 5-stage schedule": (
                here + "case_pack", {"source": text["dir"], "tokenizer": None,
                                     "eos": text["eos"], "field": "tokens.npy",
                                     "documents": text["documents"]}),
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
        stage = {"source": text["dir"], "eos": text["eos"], "documents": text["documents"]}
        stage_cases = {
            "pre-tokenized tokens.npy": (here + "case_stage", {
                **stage, "tokenizer": None, "field": "tokens.npy", "mixture": "none"}),
            "pre-tokenized, 5-source Mix, fixed weights": (here + "case_stage", {
                **stage, "tokenizer": None, "field": "tokens.npy", "mixture": "weights"}),
            "pre-tokenized, 5-source Mix, 5-stage schedule": (here + "case_stage", {
                **stage, "tokenizer": None, "field": "tokens.npy", "mixture": "schedule"}),
            "pre-tokenized, 5-source Mix, 5-stage schedule by tokens": (here + "case_stage", {
                **stage, "tokenizer": None, "field": "tokens.npy", "mixture": "tokens"}),
            "text through tokenizer.json (BPE 4096)": (here + "case_stage", {
                **stage, "tokenizer": text["tokenizer"], "field": "text", "mixture": "none"}),
        }
        stages = common.repeat(stage_cases, progress=common.log)
        state = common.repeat({"state": (here + "case_state", {
            "source": text["dir"], "eos": text["eos"], "documents": text["documents"]})},
            runs=1)["state"]

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

    def per_sequence(result):
        return ratio(result.get("cpu_s"), result.get("sequences"))

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

    for name, result in stages.items():
        rows.append({"table": T_STAGE, "input": name, "sequences": result.get("sequences"),
                     "tokens/s per worker (CPU)": ratio(result.get("tokens"),
                                                        result.get("cpu_s")),
                     "CPU s": result.get("cpu_s"), "runs": result.get("runs"),
                     "error": result.get("error")})
    rows.append({"table": T_STAGE, "note":
                 "One worker's work measured in one process: the stage reads the whole epoch "
                 "as one stream and the default collate makes batches of 16 (what a "
                 "DataLoader worker does before the transfer to the main process); CPU time "
                 "of that process. The schedule case reads the documents as 5 sources (the "
                 "same shards, 5 seeds) through a Mix with a 5-stage schedule: the schedule, "
                 "the mixture and the per-source accounting together."})
    plain = stages["pre-tokenized tokens.npy"]
    scheduled = stages["pre-tokenized, 5-source Mix, 5-stage schedule"]
    weighted = stages["pre-tokenized, 5-source Mix, fixed weights"]
    schedule_ratio = ratio(per_sequence(scheduled), per_sequence(plain))
    schedule_only = ratio(per_sequence(scheduled), per_sequence(weighted))
    by_tokens = stages["pre-tokenized, 5-source Mix, 5-stage schedule by tokens"]
    tokens_ratio = ratio(per_sequence(by_tokens), per_sequence(plain))
    rows.append({"table": T_STATE, "state": "packed 5-source schedule, 1 rank x 2 workers",
                 "bytes": state.get("bytes"), "error": state.get("error")})
    rows.append({"table": T_STATE, "state": "the same, gathered from 8 ranks x 8 workers",
                 "bytes": state.get("bytes_8x8"), "error": state.get("error")})
    goals = [
        goal("pre-tokenized packing, tokens/s per worker (CPU, millions)",
             None if ratio(plain.get("tokens"), plain.get("cpu_s")) is None
             else ratio(plain.get("tokens"), plain.get("cpu_s")) / 1e6, 10, table=T_GOALS),
        goal("schedule + accounting + 5-source Mix ÷ plain PackedSequences, CPU per sequence",
             schedule_ratio, 1.05, higher_is_better=False, table=T_GOALS),
        goal("5-stage schedule ÷ fixed weights (5-source Mix, packed), CPU per sequence",
             schedule_only, 1.05, higher_is_better=False, table=T_GOALS),
        goal("schedule by tokens + accounting + 5-source Mix ÷ plain PackedSequences, CPU "
             "per sequence", tokens_ratio, 1.05, higher_is_better=False, table=T_GOALS),
        goal("state size, 5-source schedule, 1 rank x 2 workers (bytes)", state.get("bytes"),
             4096, higher_is_better=False, table=T_GOALS),
        goal("state size, 5-source schedule, gathered from 8 ranks x 8 workers (bytes)",
             state.get("bytes_8x8"), 4096, higher_is_better=False, table=T_GOALS),
        goal("Mix CPU time ÷ one StreamingDataset (worse of 1 and 2 sources)", worst("cpu_s"),
             1.1, higher_is_better=False, table=T_GOALS),
        goal("Mix wall time ÷ one StreamingDataset (worse of 1 and 2 sources)",
             worst("seconds"), 1.1, higher_is_better=False, table=T_GOALS),
    ]
    return goals + rows


def main(argv: list[str] | None = None) -> int:
    from .__main__ import run_alone

    return run_alone("llm", TITLE, run, argv)


if __name__ == "__main__":
    sys.exit(main())
