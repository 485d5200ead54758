"""Small generated text datasets and an in-process trained tokenizer, for the mixing and
packing tests. Everything is a pure function of its arguments."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random

import numpy as np

import wdstream
from tests.support.shard_data import first_batches
from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.shards.tar_writer import TarWriter
from wdstream.stream.load.ranks import pack_positions, ranks_of

WORDS = ("the a stream shard epoch token batch resume seed rank worker model data loss step "
         "train pack mix weight source window order plan sample text code def return if for "
         "in range print value list dict key").split()


def document(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def documents(seed: int, count: int, max_words: int = 60) -> list[str]:
    """``count`` documents of 0 to ``max_words`` words (some empty, some long)."""
    rng = random.Random(seed)
    return [document(rng, rng.randint(0, max_words)) for _ in range(count)]


def write_text_dataset(folder, counts, *, seed: int = 0, max_words: int = 60,
                       tokenizer=None) -> list[str]:
    """Shards of ``{key}.json`` ({"text": ...}) and ``{key}.txt`` members with the given
    sample counts, and index.json; with ``tokenizer`` also ``{key}.tokens.npy`` (uint16 ids).
    Returns the documents in storage order."""
    os.makedirs(folder, exist_ok=True)
    texts = documents(seed, sum(counts), max_words)
    infos, index = [], 0
    for shard, count in enumerate(counts):
        buffer = io.BytesIO()
        writer = TarWriter(buffer)
        for _ in range(count):
            key = f"d{seed:02d}_{index:06d}"
            text = texts[index]
            writer.add(f"{key}.json", json.dumps({"text": text, "id": key}).encode())
            writer.add(f"{key}.txt", text.encode())
            if tokenizer is not None:
                ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids,
                                 dtype=np.uint16)
                npy = io.BytesIO()
                np.save(npy, ids)
                writer.add(f"{key}.tokens.npy", npy.getvalue())
            index += 1
        writer.close()
        infos.append(_write_shard(folder, shard, count, buffer.getvalue()))
    extensions = ["json", "txt"] + (["tokens.npy"] if tokenizer is not None else [])
    with open(os.path.join(folder, "index.json"), "w") as f:
        f.write(Manifest(infos, extensions=extensions).to_json())
    return texts


def train_tokenizer(path, texts, vocab_size: int = 120):
    """A small BPE tokenizer trained in-process (no download), saved to ``path``; special
    tokens ``<unk>`` (0) and ``<eos>`` (1)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<eos>"],
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return tokenizer


def write_token_dataset(folder, counts, *, seed: int = 0, first_id: int = 1,
                        max_tokens: int = 40) -> list[np.ndarray]:
    """Shards of pre-tokenized documents, ``{key}.tokens.npy`` (uint32) and ``{key}.json``
    ({"id": key}), with index.json. Every token id occurs once in the whole dataset (document
    after document, from ``first_id``), so the sequences packed from it tell exactly which
    tokens were trained on. Returns the documents' tokens in storage order."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    docs, infos, next_id = [], [], first_id
    for shard, count in enumerate(counts):
        buffer = io.BytesIO()
        writer = TarWriter(buffer)
        for _ in range(count):
            key = f"t{seed:02d}_{len(docs):06d}"
            length = rng.randint(1, max_tokens)
            ids = np.arange(next_id, next_id + length, dtype=np.uint32)
            next_id += length
            docs.append(ids)
            npy = io.BytesIO()
            np.save(npy, ids)
            writer.add(f"{key}.json", json.dumps({"id": key}).encode())
            writer.add(f"{key}.tokens.npy", npy.getvalue())
        writer.close()
        infos.append(_write_shard(folder, shard, count, buffer.getvalue()))
    with open(os.path.join(folder, "index.json"), "w") as f:
        f.write(Manifest(infos, extensions=["json", "tokens.npy"]).to_json())
    return docs


def write_token_sources(root, counts_by_name: dict, *, first_seed: int = 0,
                        max_tokens: int = 40) -> dict[str, list[np.ndarray]]:
    """One token dataset per name under ``root`` (``root / name``), the ``i``-th written
    with seed ``first_seed + i``; token ids go on from one source to the next, so every id
    occurs once over all of them. Returns each source's documents in storage order."""
    docs, first = {}, 1
    for seed, (name, counts) in enumerate(counts_by_name.items(), start=first_seed):
        docs[name] = write_token_dataset(root / name, counts, seed=seed, first_id=first,
                                         max_tokens=max_tokens)
        first = int(docs[name][-1][-1]) + 1
    return docs


def _write_shard(folder, shard: int, count: int, data: bytes) -> ShardInfo:
    """Write shard number ``shard`` (``count`` samples) into ``folder``; its manifest entry."""
    name = f"shard-{shard:06d}.tar"
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    return ShardInfo(name, count, len(data), hashlib.sha256(data).hexdigest())


def write_sources(root, counts: dict) -> object:
    """One sample dataset (tests/support/shard_data.py's) per name of ``counts`` ({name: shard
    counts}), in ``root/name``; returns ``root``."""
    from tests.support.shard_data import write_dataset

    for name, shard_counts in counts.items():
        write_dataset(root / name, shard_counts)
    return root


def sources(root, names, **options) -> list:
    """The datasets ``root/name``, seeded 1, 2, ... in order, each with a shuffle window of 7
    (small enough for the tests' few samples to be well shuffled)."""
    return [wdstream.StreamingDataset(str(root / name), seed=i + 1, shuffle_window=7, **options)
            for i, name in enumerate(names)]


# ---- ranks one after the other in this process (RANK / WORLD_SIZE set per loader) ---------
def as_rank(monkeypatch, rank, world):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def run_ranks(monkeypatch, make, world, workers, batch, state=None, n=None, **options):
    """Every rank's batches (the first ``n``, or the whole rest of the epoch) and rank 0's
    state after them; ``options`` go to each rank's ``wdstream.DataLoader``."""
    out, states = [], []
    for rank in range(world):
        as_rank(monkeypatch, rank, world)
        loader = wdstream.DataLoader(make(), batch_size=batch, num_workers=workers, **options)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        expected = len(loader) if loader.dataset.has_counts else None
        if state is not None and expected is not None and \
                (state["world"], state["workers"], state["batch_size"]) == (world, workers, batch):
            expected -= sum(state["batches"])  # same layout: len() is the whole epoch's
        out.append(first_batches(loader, n) if n is not None else list(loader))
        if n is None and expected is not None:  # the rest of the epoch, on every rank
            assert len(out[-1]) == expected
        states.append(loader.state_dict())
    return out, states


def merged(states):
    """Rank 0's state with every rank's positions, as state_dict() gathers them."""
    state = json.loads(json.dumps(states[0]))
    for k, position in enumerate(state["positions"]):
        if isinstance(position, dict):
            position["ranks"] = pack_positions(
                [ranks_of(s["positions"][k])[r] for r, s in enumerate(states)])
    return state
