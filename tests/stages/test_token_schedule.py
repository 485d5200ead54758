"""Mixture schedules by tokens (``start_tokens``): a packed mixture switches stage when the
tokens delivered over the job reach a stage's start, counted from each stream's sequences
(the same on every rank), resumed exactly on the same layout and elastically across the
boundary; in the config."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wdstream
from tests.support.llm_data import merged, run_ranks, write_token_sources
from wdstream.errors import InputError

SEQ = 16
COUNTS = {"x": [60, 50, 70], "y": [55, 65]}
PER_EPOCH = 60  # sequences
SWITCH = 24 * SEQ  # tokens: the stage of y starts after 24 sequences over the job

pytestmark = pytest.mark.usefixtures("single_rank")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("token-schedule")
    docs = write_token_sources(root, COUNTS, max_tokens=12)
    return root, {name: {int(t) for d in ds for t in d} for name, ds in docs.items()}


def packed(tokens, schedule=None):
    root, _ = tokens
    sources = [wdstream.StreamingDataset(str(root / n), seed=i + 3, shuffle_window=5)
               for i, n in enumerate(COUNTS)]
    schedule = schedule or [{"start_tokens": 0, "weights": [1, 0]},
                            {"start_tokens": SWITCH, "weights": [0, 1]}]
    mix = wdstream.Mix(sources, schedule=schedule, seed=2, names=list(COUNTS), stop="fixed",
                       samples_per_epoch=10_000)
    return wdstream.PackedSequences(mix, None, SEQ, eos=0, text_field="tokens.npy",
                                    sequences_per_epoch=PER_EPOCH)


def sources_of(tokens, batch):
    """Per row of a batch: the set of sources ("x", "y") its tokens came from."""
    _, ids = tokens
    return [{n for n in COUNTS if set(row.tolist()) & ids[n]} for row in batch["input_ids"]]


def stream_rows(tokens, batches, workers):
    """Per stream, the sources of each of its sequences in order (batch size 1: the streams
    take turns)."""
    rows = [[] for _ in range(workers)]
    for index, batch in enumerate(batches):
        rows[index % workers] += sources_of(tokens, batch)
    return rows


def check_switch(rows, at):
    """A stream's sequences before ``at`` hold x only; y only from a few sequences after."""
    for sequences in rows:
        assert all(s == {"x"} for s in sequences[:at]), sequences[:at + 2]
        assert all(s == {"y"} for s in sequences[at + 2:]), sequences[at:]


def test_the_stage_changes_at_the_tokens_delivered_over_the_job(tokens, monkeypatch):
    (batches,), _ = run_ranks(monkeypatch, lambda: packed(tokens), 1, 2, 1)
    assert len(batches) == PER_EPOCH
    check_switch(stream_rows(tokens, batches, 2), SWITCH // (SEQ * 2))


def test_the_same_step_on_every_rank(tokens, monkeypatch):
    both, _ = run_ranks(monkeypatch, lambda: packed(tokens), 2, 1, 1)
    for batches in both:  # 2 ranks x 1 stream: the switch after 12 sequences of each rank
        check_switch(stream_rows(tokens, batches, 1), SWITCH // (SEQ * 2))


@pytest.mark.parametrize("cut", [5, 22, 23, 24, 25, 26, 27, 40])
@pytest.mark.slow
def test_same_layout_resume_is_token_exact_across_the_boundary(tokens, monkeypatch, cut):
    (reference,), _ = run_ranks(monkeypatch, lambda: packed(tokens), 1, 2, 1)
    _head, states = run_ranks(monkeypatch, lambda: packed(tokens), 1, 2, 1, n=cut)
    (rest,), _ = run_ranks(monkeypatch, lambda: packed(tokens), 1, 2, 1, state=states[0])
    expected = [b["input_ids"] for b in reference[cut:]]
    assert all(a.equal(b["input_ids"]) for a, b in zip(expected, rest, strict=True))


@pytest.mark.slow
def test_elastic_resume_continues_the_schedule(tokens, monkeypatch):
    """2 ranks x 2 workers for 4 sequences a stream (16 over the job), then 1 rank x 3 workers:
    the remaining 8 sequences' worth of x tokens (SWITCH is 24 sequences) come first, the
    new streams switch after ceil(8 / 3) = 3 sequences each."""
    first, states = run_ranks(monkeypatch, lambda: packed(tokens), 2, 2, 1, n=8)
    for batches in first:
        assert all(s == {"x"} for b in batches for s in sources_of(tokens, b))
    (rest,), _ = run_ranks(monkeypatch, lambda: packed(tokens), 1, 3, 1, state=merged(states))
    assert len(rest) == PER_EPOCH - 16
    check_switch(stream_rows(tokens, rest, 3), 3)
    ids = np.concatenate([b["input_ids"].numpy().ravel() for bs in first for b in bs]
                         + [b["input_ids"].numpy().ravel() for b in rest])
    ids = ids[ids != 0]
    assert len(ids) - len(set(ids.tolist())) < 4 * SEQ  # at most the documents at the cut


def test_a_schedule_by_tokens_needs_packing_and_one_unit(tokens):
    root, _ = tokens
    sources = [wdstream.StreamingDataset(str(root / n)) for n in COUNTS]
    mix = wdstream.Mix(sources, schedule=[{"start_tokens": 0, "weights": [1, 1]}],
                       stop="fixed", samples_per_epoch=100)
    with pytest.raises(InputError, match="needs PackedSequences"):
        next(iter(wdstream.DataLoader(mix, batch_size=2)))
    with pytest.raises(InputError, match="not both"):
        wdstream.Mix(sources, schedule=[{"start": 0, "weights": [1, 1]},
                                        {"start_tokens": 9, "weights": [1, 0]}])
    with pytest.raises(InputError, match="not both"):
        wdstream.Mix(sources, schedule=[{"start": 0, "start_tokens": 0, "weights": [1, 1]}])
    by_samples = wdstream.Mix(sources, schedule=[{"start": 0, "weights": [1, 1]}],
                              stop="fixed", samples_per_epoch=100)
    assert mix.fingerprint() != by_samples.fingerprint()


def test_config_schedule_by_tokens(tokens):
    root, _ = tokens
    config = {
        "seq_len": SEQ, "eos": 0, "text_field": "tokens.npy", "stop": "fixed",
        "samples_per_epoch": 10_000, "sequences_per_epoch": PER_EPOCH, "seed": 2,
        "schedule": [{"start_tokens": 0, "weights": {"x": 1}},
                     {"start_tokens": 2e9, "weights": {"y": 1}}],
        "datasets": [{"path": str(root / n), "label": n} for n in COUNTS],
    }
    dataset = wdstream.from_config(json.loads(json.dumps(config)))
    assert dataset.dataset.schedule.unit == "tokens"
    assert dataset.dataset.schedule.starts == [0, 2_000_000_000]
    with pytest.raises(InputError, match="unknown key 'begin'"):
        wdstream.from_config({**config, "schedule": [{"begin": 0, "weights": {"x": 1}}]})
