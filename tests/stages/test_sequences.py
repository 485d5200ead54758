"""wdstream.PackedSequences: tokenize, pack into fixed-length sequences, resume token-exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wdstream
from tests.support.llm_data import documents, train_tokenizer, write_text_dataset
from tests.support.shard_data import first_batches
from wdstream.errors import InputError, StateError
from wdstream.stages.base import cycle_epoch
from wdstream.stream.load.contract import IterationSpec

pytest.importorskip("tokenizers")

SEQ_LEN = 16
COUNTS = [40, 30, 50]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("packing")
    tokenizer = train_tokenizer(root / "tokenizer.json", documents(99, 400))
    texts = write_text_dataset(root / "text", COUNTS, seed=1, tokenizer=tokenizer)
    write_text_dataset(root / "code", [35, 35], seed=2, max_words=20)
    return {"root": root, "tokenizer": tokenizer, "texts": texts,
            "path": str(root / "tokenizer.json")}


pytestmark = pytest.mark.usefixtures("single_rank")


def packed(corpus, field="text", tokenizer="path", eos="<eos>", shuffle=True, **kwargs):
    ds = wdstream.StreamingDataset(str(corpus["root"] / "text"), seed=1, shuffle=shuffle,
                                   shuffle_window=6)
    tokenizer = corpus["path"] if tokenizer == "path" else tokenizer
    return wdstream.PackedSequences(ds, tokenizer, SEQ_LEN, eos=eos, text_field=field, **kwargs)


def rows(batches, key="input_ids"):
    return [row for batch in batches for row in batch[key].tolist()]


def take(loader, n):
    return rows(first_batches(loader, n))


def test_sequences_are_the_documents_token_stream_cut_in_seq_len(corpus):
    tokenizer = corpus["tokenizer"]
    eos = tokenizer.token_to_id("<eos>")
    stage = packed(corpus, shuffle=False)
    items = [item for item, _ in stage.positioned(IterationSpec(0, 0, 1, 1), 0, 0)]
    stream = [t for text in corpus["texts"]
              for t in tokenizer.encode(text, add_special_tokens=False).ids + [eos]]
    assert len(items) == len(stream) // SEQ_LEN  # long documents split, nothing dropped
    assert np.concatenate([i["input_ids"] for i in items]).tolist() == \
        stream[: len(items) * SEQ_LEN]
    for item in items:
        assert item["input_ids"].shape == (SEQ_LEN,) and item["input_ids"].dtype == np.int64
        assert np.array_equal(item["labels"], item["input_ids"])
        ids, positions = item["input_ids"], item["position_ids"]
        assert positions[0] == 0
        for t in range(1, SEQ_LEN):  # positions restart right after each EOS, else count up
            assert positions[t] == (0 if ids[t - 1] == eos else positions[t - 1] + 1)


def test_pre_tokenized_and_callable_tokenizers_give_the_same_sequences(corpus):
    spec = IterationSpec(0, 0, 1, 1)
    text = [i["input_ids"].tolist() for i, _ in packed(corpus).positioned(spec, 0, 0)]
    eos = corpus["tokenizer"].token_to_id("<eos>")
    pre = packed(corpus, field="tokens.npy", tokenizer=None, eos=eos)
    assert [i["input_ids"].tolist() for i, _ in pre.positioned(spec, 0, 0)] == text
    encode = corpus["tokenizer"].encode

    def tokenize(value: str) -> list[int]:
        return encode(value, add_special_tokens=False).ids

    by_callable = packed(corpus, tokenizer=tokenize, eos=eos, field="json.text")
    assert [i["input_ids"].tolist() for i, _ in by_callable.positioned(spec, 0, 0)] == text
    by_object = packed(corpus, tokenizer=corpus["tokenizer"])
    assert [i["input_ids"].tolist() for i, _ in by_object.positioned(spec, 0, 0)] == text
    assert by_object.fingerprint() == packed(corpus).fingerprint()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow
def test_pack_with_tokenizer_then_packed_sequences(corpus, tmp_path, workers):
    """`wdstream.pack(tokenize=..., tokenizer=...)` stores token ids without EOS; packing them
    gives the sequences that tokenizing the text on the fly gives."""
    texts = corpus["texts"]
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"d{i:04d}", "text": text}) + "\n")
    manifest = wdstream.pack(str(tmp_path / "docs.jsonl"), str(tmp_path / "packed"), key="id",
                             fields={"text": "txt"}, tokenize={"text": "tokens.npy"},
                             tokenizer=corpus["path"], max_size="6KiB", workers=workers)
    assert len(manifest.shards) > 3 and manifest.samples == len(texts)
    assert manifest.extra["tokenizer"]["dtype"] == "uint16"
    eos = corpus["tokenizer"].token_to_id("<eos>")

    def stage(tokenizer, field, shuffle=True):
        ds = wdstream.StreamingDataset(str(tmp_path / "packed"), seed=4, shuffle=shuffle,
                                       shuffle_window=6)
        return wdstream.PackedSequences(ds, tokenizer, SEQ_LEN, eos=eos, text_field=field)

    spec = IterationSpec(0, 0, 1, 1)
    for shuffle in (False, True):
        stored = [i["input_ids"].tolist()
                  for i, _ in stage(None, "tokens.npy", shuffle).positioned(spec, 0, 0)]
        on_the_fly = [i["input_ids"].tolist()
                      for i, _ in stage(corpus["path"], "txt", shuffle).positioned(spec, 0, 0)]
        assert stored == on_the_fly and len(stored) > 20
    encode = corpus["tokenizer"].encode
    stream = [t for text in texts for t in encode(text, add_special_tokens=False).ids + [eos]]
    unshuffled = [i["input_ids"] for i, _ in stage(None, "tokens.npy", False).positioned(spec, 0, 0)]
    assert np.concatenate(unshuffled).tolist() == stream[: len(unshuffled) * SEQ_LEN]
    if workers == 2:  # and through DataLoader workers
        def loader(tokenizer, field):
            return wdstream.DataLoader(stage(tokenizer, field), batch_size=4, num_workers=2)

        assert rows(loader(None, "tokens.npy")) == rows(loader(corpus["path"], "txt"))


def test_token_lists_packed_by_wdstream_pack(corpus, tmp_path):
    """Token ids tokenized elsewhere, packed as a JSON list column, pack as well."""
    tokenizer, texts = corpus["tokenizer"], corpus["texts"][:60]
    eos = tokenizer.token_to_id("<eos>")
    ids = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    with open(tmp_path / "tokens.jsonl", "w") as f:
        for tokens in ids:
            f.write(json.dumps({"tokens": tokens}) + "\n")
    wdstream.pack(str(tmp_path / "tokens.jsonl"), str(tmp_path / "packed"),
                  fields={"tokens": "tokens.json"}, max_count=20)
    stage = wdstream.PackedSequences(
        wdstream.StreamingDataset(str(tmp_path / "packed"), shuffle=False), None, SEQ_LEN,
        eos=eos, text_field="tokens.json")
    items = [i["input_ids"] for i, _ in stage.positioned(IterationSpec(0, 0, 1, 1), 0, 0)]
    stream = [t for tokens in ids for t in tokens + [eos]]
    assert np.concatenate(items).tolist() == stream[: len(items) * SEQ_LEN]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("per_epoch", [None, 400])  # 400: more than one pass of the data
@pytest.mark.slow
def test_token_exact_resume(corpus, workers, per_epoch):
    def loader():
        stage = packed(corpus, sequences_per_epoch=per_epoch)
        return wdstream.DataLoader(stage, batch_size=5, num_workers=workers)

    reference_loader = loader()
    reference = [b for b in reference_loader]
    full = rows(reference)
    if per_epoch is not None:
        assert len(full) == per_epoch and len(reference) == len(loader())
        passes = [position[1] for position in reference_loader.state_dict()["positions"]]
        assert min(passes) >= 1  # the inner stream was restarted (on a new order)
    stops = sorted({1, 2, len(reference) // 3, len(reference) // 2, len(reference) - 1})
    for stop in stops:
        first = loader()
        before = take(first, stop)
        state = json.loads(json.dumps(first.state_dict()))
        assert len(json.dumps(state)) < 4096
        resumed = loader()
        resumed.load_state_dict(state)
        after = [b for b in resumed]
        assert before + rows(after) == full, f"stop {stop}"
        assert rows(after, "position_ids") == rows(reference, "position_ids")[len(before):]


@pytest.mark.slow
def test_packing_a_mixture_resumes_exactly(corpus):
    def loader():
        sources = [wdstream.StreamingDataset(str(corpus["root"] / n), seed=3, shuffle_window=5)
                   for n in ("text", "code")]
        mixture = wdstream.Mix(sources, [0.6, 0.4], seed=9, names=["text", "code"],
                               stop="cycle")
        stage = wdstream.PackedSequences(mixture, corpus["path"], SEQ_LEN, eos="<eos>",
                                         text_field={"text": "txt", "code": "json.text"})
        return wdstream.DataLoader(stage, batch_size=4, num_workers=2)

    full = rows(loader())
    for stop in (3, 11):
        first = loader()
        before = take(first, stop)
        resumed = loader()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert before + rows(resumed) == full


def test_each_pass_reads_an_epoch_of_its_own():
    seen = {cycle_epoch(epoch, cycle) for epoch in range(50) for cycle in range(50)}
    assert len(seen) == 2500
    assert all(cycle_epoch(epoch, 0) == epoch for epoch in range(50))
    assert all(cycle_epoch(epoch, 1) >= 1 << 40 for epoch in range(50))


def test_long_documents(corpus):
    spec = IterationSpec(0, 0, 1, 1)
    split = list(packed(corpus, shuffle=False).positioned(spec, 0, 0))
    truncated = list(packed(corpus, shuffle=False, long_documents="truncate").positioned(spec, 0, 0))
    dropped = list(packed(corpus, shuffle=False, long_documents="drop").positioned(spec, 0, 0))
    assert len(split) > len(truncated) > len(dropped) > 0
    for items in (truncated, dropped):  # no document longer than a sequence remains
        positions = np.concatenate([item["position_ids"] for item, _ in items])
        assert positions.max() < SEQ_LEN


def test_unknown_length_without_sequences_per_epoch(corpus):
    loader = wdstream.DataLoader(packed(corpus), batch_size=4)
    with pytest.raises(TypeError):
        len(loader)
    fixed = wdstream.DataLoader(packed(corpus, sequences_per_epoch=40), batch_size=4)
    assert len(fixed) == 10 and len(fixed.dataset) == 40


def test_states_of_another_pipeline_or_layout_are_refused(corpus):
    first = wdstream.DataLoader(packed(corpus), batch_size=4, num_workers=2)
    take(first, 2)
    state = first.state_dict()
    with pytest.raises(StateError):
        wdstream.DataLoader(packed(corpus), batch_size=4, num_workers=1).load_state_dict(state)
    other = wdstream.PackedSequences(packed(corpus).dataset, corpus["path"], SEQ_LEN + 1,
                                     eos="<eos>")
    with pytest.raises(StateError):
        wdstream.DataLoader(other, batch_size=4, num_workers=2).load_state_dict(state)


@pytest.mark.parametrize("kwargs, message", [
    ({"field": "nope"}, "no field 'nope'"),
    ({"tokenizer": None, "eos": 1}, "no tokenizer"),
    ({"field": "json", "tokenizer": None, "eos": 1}, "neither text"),
])
def test_bad_fields(corpus, kwargs, message):
    stage = packed(corpus, **kwargs)
    with pytest.raises(InputError, match=message):
        next(stage.positioned(IterationSpec(0, 0, 1, 1), 0, 0))


@pytest.mark.parametrize("kwargs", [
    {"eos": "<not-a-token>"},
    {"eos": -1},
    {"long_documents": "wrap"},
    {"sequences_per_epoch": 0},
    {"tokenizer": 42},
    {"tokenizer": "/nonexistent/tokenizer.json"},
])
def test_bad_arguments(corpus, kwargs):
    with pytest.raises(InputError):
        packed(corpus, **kwargs)
