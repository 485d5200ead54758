"""Elastic resume of Mix, PackedSequences and a packed mixture: a state saved on one layout
(world size, workers, batch size) loads on another, the rest of the epoch reads every document
not yet read exactly once, with equal batches on every rank.

Ranks run one after the other in this process (RANK / WORLD_SIZE set per loader); a packing
state of several ranks is put together as ``loader.state_dict()`` gathers it under
torch.distributed (tests/integrations/test_ddp_llm.py runs that for real under torchrun)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import wdstream
from tests.support.llm_data import (
    as_rank,
    merged,
    run_ranks,
    sources,
    write_sources,
    write_token_dataset,
    write_token_sources,
)
from tests.support.shard_data import first_batches
from wdstream.errors import StateError
from wdstream.stream.load.ranks import ranks_of

COUNTS = {"a": [50, 30, 40], "b": [20, 25, 17]}
TOKEN_COUNTS = {"x": [30, 25, 41], "y": [22, 35]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("elastic"), COUNTS)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic-tokens")
    return root, write_token_sources(root, TOKEN_COUNTS)


pytestmark = pytest.mark.usefixtures("single_rank")


def mix(data, weights=(0.7, 0.3), **kwargs):
    parts = sources(data, COUNTS)
    return wdstream.Mix(parts, list(weights), seed=5, names=list(COUNTS), **kwargs)


def keys(batches):
    return [(s, k) for b in batches for s, k in zip(b["__source__"], b["__key__"], strict=True)]


@pytest.mark.parametrize("stop", ["first_exhausted", "cycle"])
@pytest.mark.parametrize(("before", "after"), [((2, 2, 4), (1, 3, 3)), ((1, 2, 4), (3, 1, 2))])
def test_mix_resumes_on_another_layout(data, monkeypatch, stop, before, after):
    def make():
        return mix(data, stop=stop)

    first, states = run_ranks(monkeypatch, make, *before, n=4)
    state = states[0]
    assert all(isinstance(p, list) for p in state["positions"])
    rest, _ = run_ranks(monkeypatch, make, *after, state=state)
    lengths = {len(batches) for batches in rest}
    assert len(lengths) == 1 and lengths != {0}  # equal batches on every rank
    read = Counter(keys(b for batches in first + rest for b in batches))
    if stop == "first_exhausted":
        assert max(read.values()) == 1  # no document twice
    else:  # every document at least once; a source restarts only once read to its end
        everything = {(n, k) for n in COUNTS for k in _all_keys(data / n)}
        remainder = before[0] + after[0]  # each segment leaves out fewer than world per source
        assert len(everything - set(read)) < 2 * remainder


def _all_keys(folder):
    ds = wdstream.StreamingDataset(str(folder), shuffle=False)
    return [s["__key__"] for s in ds]


def test_single_active_source_is_read_exactly_once_across_layouts(data, monkeypatch):
    def make():
        return mix(data, weights=(1, 0))

    first, states = run_ranks(monkeypatch, make, 2, 2, 4, n=5)
    middle, states = run_ranks(monkeypatch, make, 3, 1, 2, state=states[0], n=3)
    rest, _ = run_ranks(monkeypatch, make, 1, 3, 5, state=states[0])
    read = Counter(keys(b for batches in first + middle + rest for b in batches))
    assert max(read.values()) == 1
    total = sum(COUNTS["a"])
    # left out: fewer than `world` per segment, and a partial last batch of nothing
    assert total - (2 + 3 + 1) < len(read) <= total


def test_mix_same_layout_resume_stays_exact(data, monkeypatch):
    def make():
        return mix(data)

    reference, _ = run_ranks(monkeypatch, make, 1, 2, 4)
    head, states = run_ranks(monkeypatch, make, 1, 2, 4, n=3)
    rest, _ = run_ranks(monkeypatch, make, 1, 2, 4, state=states[0])
    assert keys(reference[0]) == keys(head[0] + rest[0])


# ---- packing ------------------------------------------------------------------------------
SEQ = 16


def packed(tokens, mixed=False, per_epoch=40):
    root, _docs = tokens
    sources = [wdstream.StreamingDataset(str(root / n), seed=i + 3, shuffle_window=5)
               for i, n in enumerate(TOKEN_COUNTS)]
    inner = wdstream.Mix(sources, [0.6, 0.4], seed=2, names=list(TOKEN_COUNTS)) if mixed \
        else sources[0]
    return wdstream.PackedSequences(inner, None, SEQ, eos=0, text_field="tokens.npy",
                                    sequences_per_epoch=per_epoch)


def token_counts(batches):
    ids = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    return Counter(ids[ids != 0].tolist())


@pytest.mark.parametrize("mixed", [False, True])
def test_packing_resumes_on_another_layout(tokens, monkeypatch, mixed):
    def make():
        return packed(tokens, mixed)

    first, states = run_ranks(monkeypatch, make, 2, 2, 2, n=3)
    state = merged(states)
    assert all(len(ranks_of(p)) == 2 for p in state["positions"])
    rest, _ = run_ranks(monkeypatch, make, 1, 3, 3, state=state)
    sequences = sum(len(b["input_ids"]) for batches in first + rest for b in batches)
    assert sequences == 40 - 40 % 1  # the epoch's sequences, over both layouts
    counts = token_counts(b for batches in first + rest for b in batches)
    check_tokens(tokens, counts, state, streams_after=3)


def check_tokens(tokens, counts, state, streams_after):
    """No token trained on twice: the documents in progress at the cut go on from their
    offset on the new layout; every document read whole but for the last one of each stream
    (its end cut by the epoch's)."""
    assert max(counts.values()) == 1
    _root, docs = tokens
    all_docs = [d for name in TOKEN_COUNTS for d in docs[name]]
    cut = [p[3] for ranks in state["positions"] for p in ranks_of(ranks) if p != 0 and p[3]]
    doubled = [d for d in all_docs if any(counts.get(int(t)) == 2 for t in d)]
    assert len(doubled) <= len(cut)
    for d in doubled:  # a prefix of the document, the rest once
        n = sum(counts.get(int(t)) == 2 for t in d)
        assert all(counts.get(int(t)) == 2 for t in d[:n]) and n < len(d)
    partial = [d for d in all_docs if 0 < sum(int(t) in counts for t in d) < len(d)]
    assert len(partial) <= streams_after + len(cut)


def test_packing_on_three_ranks_gets_equal_batches(tokens, monkeypatch):
    def make():
        return packed(tokens, True, per_epoch=60)

    first, states = run_ranks(monkeypatch, make, 2, 2, 2, n=4)
    rest, _ = run_ranks(monkeypatch, make, 3, 1, 2, state=merged(states))
    assert len({len(batches) for batches in rest}) == 1
    assert sum(len(b["input_ids"]) for batches in first + rest for b in batches) \
        == 2 * 4 * 2 + 3 * len(rest[0]) * 2
    counts = token_counts(b for batches in first + rest for b in batches)
    check_tokens(tokens, counts, merged(states), streams_after=3)


def test_packing_same_layout_resume_from_rank_0_state(tokens, monkeypatch):
    """Every rank resumes from rank 0's (gathered) state on the same layout, token-exact."""
    def make():
        return packed(tokens, True)

    reference, _ = run_ranks(monkeypatch, make, 2, 2, 2)
    head, states = run_ranks(monkeypatch, make, 2, 2, 2, n=3)
    rest, _ = run_ranks(monkeypatch, make, 2, 2, 2, state=merged(states))
    for rank in range(2):
        expected = [b["input_ids"] for b in reference[rank]]
        got = [b["input_ids"] for b in head[rank] + rest[rank]]
        assert all(a.equal(b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("mixed", [False, True])
def test_packing_without_a_size_names_the_setting_another_layout_needs(tokens, monkeypatch,
                                                                       mixed):
    def make():
        made = packed(tokens, mixed)
        made.sequences_per_epoch = None  # every source has a manifest; the packing no size
        return made

    _first, states = run_ranks(monkeypatch, make, 1, 2, 2, n=2)
    as_rank(monkeypatch, 0, 1)
    loader = wdstream.DataLoader(make(), batch_size=2, num_workers=1)
    with pytest.raises(StateError, match="another layout needs sequences_per_epoch or "
                                         "tokens_per_epoch"):
        loader.load_state_dict(states[0])


def test_a_state_without_other_ranks_positions_is_refused(tokens, monkeypatch):
    def make():
        return packed(tokens)

    _first, states = run_ranks(monkeypatch, make, 2, 2, 2, n=2)
    as_rank(monkeypatch, 1, 2)
    loader = wdstream.DataLoader(make(), batch_size=2, num_workers=0)
    loader.load_state_dict(states[0])  # rank 1's entries missing: not gathered
    with pytest.raises(StateError, match="every rank"):
        next(iter(loader))


# ---- accounting -------------------------------------------------------------------------
def test_per_source_tokens_and_documents_in_stats_and_state(tokens, monkeypatch):
    root, docs = tokens
    x_ids = {int(t) for d in docs["x"] for t in d}

    def make():
        return wdstream.DataLoader(packed(tokens, True, per_epoch=60), batch_size=4,
                                   num_workers=2)

    whole = make()
    batches = list(whole)
    stats = whole.stats["sources"]
    ids = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    assert stats["x"]["tokens"] + stats["y"]["tokens"] == 60 * SEQ == len(ids)
    assert stats["x"]["tokens"] >= int(np.isin(ids, list(x_ids)).sum())
    assert stats["y"]["tokens"] >= int(((ids != 0) & ~np.isin(ids, list(x_ids))).sum())
    # a document counts once its last token (EOS) is delivered
    assert stats["x"]["documents"] + stats["y"]["documents"] == int((ids == 0).sum())

    head = make()
    first_batches(head, 5)
    state = json.loads(json.dumps(head.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    list(resumed)
    assert resumed.stats["sources"] == stats  # counts travel in the state


def test_a_repeating_source_shows_its_pass(data):
    small = mix(data, weights=(0.2, 0.8), stop="fixed", samples_per_epoch=400)
    loader = wdstream.DataLoader(small, batch_size=10, num_workers=1)
    drawn = Counter(s for b in loader for s in b["__source__"])
    stats = loader.stats["sources"]
    assert {name: stats[name]["documents"] for name in COUNTS} == drawn
    assert stats["b"]["pass"] >= 4 and stats["a"]["pass"] == 0  # b (62 samples) restarted


def test_long_documents_across_shard_boundaries(tmp_path, monkeypatch):
    """Documents up to 6 sequences long, shards of 3 to 7 documents: the sequences are the
    documents' tokens (each + EOS) in stream order, cut every SEQ tokens, whatever shard a
    document ends or starts in; resuming inside a long document, on another layout, goes on
    from the token where the cut was: no token twice."""
    docs = write_token_dataset(tmp_path / "long", [3, 7, 4, 5], seed=9, max_tokens=100)

    def make():
        dataset = wdstream.StreamingDataset(str(tmp_path / "long"), shuffle=False)
        return wdstream.PackedSequences(dataset, None, SEQ, eos=0, text_field="tokens.npy",
                                        sequences_per_epoch=40)

    stream = np.concatenate([np.append(d, 0) for d in docs]).astype(np.int64)
    whole = list(wdstream.DataLoader(make(), batch_size=4))
    got = np.concatenate([b["input_ids"].numpy().ravel() for b in whole])
    assert np.array_equal(got, stream[:len(got)]) and len(got) == 40 * SEQ

    head = wdstream.DataLoader(make(), batch_size=4)
    first = first_batches(head, 3)
    state = head.state_dict()
    offset = state["positions"][0][3]
    assert offset > 0  # the cut falls inside a document
    resumed = wdstream.DataLoader(make(), batch_size=2, num_workers=2)  # another layout
    resumed.load_state_dict(state)
    rest = list(resumed)
    counts = token_counts(first + rest)
    assert max(counts.values()) == 1
    cut = docs[state["positions"][0][2]]  # in storage order (no shuffle)
    before, after = token_counts(first), token_counts(rest)
    assert all(before.get(int(t)) == 1 for t in cut[:offset])
    assert all(after.get(int(t)) == 1 for t in cut[offset:])  # from the cut on, once
