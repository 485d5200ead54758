"""Documents cut by a layout change (wdstream.stages.cut): a document many sequences long that
a stream was packing when the layout changed goes on, on the new layout, from the token where
it was cut -- no token trained on twice, none lost -- also when the new layout is cut again
while it still packs those documents."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import wdstream
from tests.support.llm_data import merged, run_ranks, write_token_sources
from wdstream.stream.load.ranks import ranks_of

SEQ = 8
COUNTS = {"x": [19, 17, 18], "y": [16, 20]}  # ~3,600 tokens: no source runs out
PER_EPOCH = 150

pytestmark = pytest.mark.usefixtures("single_rank")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuts")
    # 1 to 80 tokens: up to 10 sequences a document
    docs = write_token_sources(root, COUNTS, first_seed=4, max_tokens=80)
    return root, [d for name in COUNTS for d in docs[name]]


def packed(tokens, mixed):
    root, _ = tokens
    sources = [wdstream.StreamingDataset(str(root / n), seed=i + 3, shuffle_window=4)
               for i, n in enumerate(COUNTS)]
    inner = wdstream.Mix(sources, [0.5, 0.5], seed=2, names=list(COUNTS)) if mixed \
        else sources[0]
    return wdstream.PackedSequences(inner, None, SEQ, eos=0, text_field="tokens.npy",
                                    sequences_per_epoch=PER_EPOCH if mixed else 40)


def token_counts(batches):
    ids = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    return Counter(ids[ids != 0].tolist())


def cut_offsets(state):
    entries = [p for v in state["positions"]
               for p in (ranks_of(v) if isinstance(v, dict) else [v])]
    return [p[3] for p in entries if p != 0 and p[3]]


def check_continued(tokens, before, after):
    """Every document the first layout left part-way is finished by the next, from the token
    where it was cut, none of its tokens again."""
    _, docs = tokens
    cut = [d for d in docs if 0 < sum(int(t) in before for t in d) < len(d)]
    assert cut
    for d in cut:
        done = sum(int(t) in before for t in d)
        assert all(int(t) in before for t in d[:done])
        assert all(int(t) in after and int(t) not in before for t in d[done:])


def check_once(tokens, counts, streams):
    """No token twice; every document read whole or not at all, but for fewer than
    ``streams`` (the ends of streams and of sources' passes: cut by the epoch's end)."""
    _, docs = tokens
    assert max(counts.values()) == 1
    partial = [d for d in docs if 0 < sum(int(t) in counts for t in d) < len(d)]
    assert len(partial) <= streams


@pytest.mark.parametrize("mixed", [False, True])
def test_long_documents_go_on_from_the_cut(tokens, monkeypatch, mixed):
    def make():
        return packed(tokens, mixed)

    first, states = run_ranks(monkeypatch, make, 2, 2, 2, n=5)
    state = merged(states)
    assert len(cut_offsets(state)) >= 2  # streams cut inside documents
    rest, _ = run_ranks(monkeypatch, make, 1, 3, 3, state=state)
    check_continued(tokens, token_counts(b for part in first for b in part),
                    token_counts(b for part in rest for b in part))
    batches = [b for part in first + rest for b in part]
    if mixed:  # the epoch's sequences over both layouts
        assert sum(len(b["input_ids"]) for b in batches) == PER_EPOCH
    check_once(tokens, token_counts(batches), streams=4 + 3)


def test_a_second_cut_while_packing_the_first_ones(tokens, monkeypatch):
    """2 ranks x 2 workers, then 1 x 3 for one batch of 1 (each new stream still inside the
    documents the first cut handed on), then 2 x 1 to the end."""
    def make():
        return packed(tokens, True)

    first, states = run_ranks(monkeypatch, make, 2, 2, 2, n=5)
    middle, states = run_ranks(monkeypatch, make, 1, 3, 1, state=merged(states), n=3)
    assert any(isinstance(p[2], list) and len(p[2]) == 1  # inside a handed-on document
               for p in states[0]["positions"])
    rest, _ = run_ranks(monkeypatch, make, 2, 1, 2, state=states[0])
    batches = [b for part in first + middle + rest for b in part]
    left = PER_EPOCH - 2 * 2 * 5 * 2 // 2 - 3  # after the first two layouts
    assert sum(len(b["input_ids"]) for b in batches) == PER_EPOCH - left % 2
    check_once(tokens, token_counts(batches), streams=4 + 3 + 2)


def test_a_schedule_by_tokens_cut_inside_documents(tokens, monkeypatch):
    """By tokens, the document at the cut is drawn in the stage the old stream's clock was in
    when it drew it: the new layout goes on inside it too."""
    root, _ = tokens

    def make():
        sources = [wdstream.StreamingDataset(str(root / n), seed=i + 3, shuffle_window=4)
                   for i, n in enumerate(COUNTS)]
        mix = wdstream.Mix(sources, schedule=[{"start_tokens": 0, "weights": [3, 1]},
                                              {"start_tokens": 30 * SEQ, "weights": [1, 3]}],
                           seed=2, names=list(COUNTS))
        return wdstream.PackedSequences(mix, None, SEQ, eos=0, text_field="tokens.npy",
                                        sequences_per_epoch=PER_EPOCH)

    first, states = run_ranks(monkeypatch, make, 2, 2, 2, n=5)
    state = merged(states)
    assert len(cut_offsets(state)) >= 2
    rest, _ = run_ranks(monkeypatch, make, 1, 3, 3, state=state)
    check_continued(tokens, token_counts(b for part in first for b in part),
                    token_counts(b for part in rest for b in part))
    batches = [b for part in first + rest for b in part]
    assert sum(len(b["input_ids"]) for b in batches) == PER_EPOCH
    check_once(tokens, token_counts(batches), streams=4 + 3)
