"""Mixture schedules (wdstream.stages.schedule): stages of weights by samples drawn over the whole
job, the same on every rank, resumed exactly and elastically across a stage boundary; the
config's ``schedule`` and ``tokens_per_epoch``."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import wdstream
from tests.support.llm_data import sources, write_sources
from tests.support.shard_data import first_batches
from wdstream.errors import InputError
from wdstream.stages.mix import BLOCK

COUNTS = {"a": [50, 30, 40], "b": [20, 25, 17]}
TOTAL = 4 * BLOCK
SWITCH = 2 * BLOCK  # all "a" before, all "b" after


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("schedule"), COUNTS)


pytestmark = pytest.mark.usefixtures("single_rank")


def scheduled(data, schedule=((0, [1, 0]), (SWITCH, [0, 1])), **kwargs):
    parts = sources(data, COUNTS)
    schedule = schedule if callable(schedule) else list(schedule)
    return wdstream.Mix(parts, schedule=schedule, seed=5, names=list(COUNTS),
                        stop="fixed", samples_per_epoch=TOTAL, **kwargs)


def sources_of(batches):
    return [s for b in batches for s in b["__source__"]]


@pytest.mark.parametrize("workers", [1, 2])
def test_weights_switch_at_the_stage_start(data, workers):
    loader = wdstream.DataLoader(scheduled(data), batch_size=64, num_workers=workers)
    drawn = sources_of(loader)
    assert len(drawn) == TOTAL
    # each stream switches at its block that starts at or after SWITCH samples of the job
    assert Counter(drawn[:SWITCH]) == {"a": SWITCH}
    assert Counter(drawn[SWITCH:]) == {"b": TOTAL - SWITCH}


def test_the_same_on_every_rank(data, monkeypatch):
    drawn = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        three = scheduled(data, schedule=[(0, [3, 1]), (BLOCK, [1, 3])])
        drawn.append(sources_of(wdstream.DataLoader(three, batch_size=32, num_workers=2)))
    assert drawn[0] == drawn[1] and len(drawn[0]) == TOTAL // 2


@pytest.mark.slow
def test_resume_across_the_boundary_same_and_other_layout(data, monkeypatch):
    def make(workers, batch):
        return wdstream.DataLoader(scheduled(data, schedule=[(0, [3, 1]), (SWITCH, [1, 3])]),
                                   batch_size=batch, num_workers=workers)

    reference = sources_of(make(2, 64))
    head = make(2, 64)
    before = sources_of(first_batches(head, 10))  # 640 samples: still in the first stage
    state = json.loads(json.dumps(head.state_dict()))
    same = make(2, 64)
    same.load_state_dict(state)
    assert before + sources_of(same) == reference  # exact

    other = make(1, 48)
    other.load_state_dict(state)
    after = sources_of(other)
    assert len(before) + len(after) == TOTAL
    drawn = before + after
    # the switch, counted over the whole job, stays where it was within a block per stream
    first, second = Counter(drawn[:SWITCH]), Counter(drawn[SWITCH + BLOCK:])
    assert first["a"] > 2.5 * first["b"] and second["b"] > 2.5 * second["a"]


def test_fingerprint_covers_the_schedule(data):
    one = scheduled(data)
    assert one.fingerprint() == scheduled(data).fingerprint()
    assert one.fingerprint() != scheduled(data, schedule=[(0, [1, 0]), (BLOCK, [0, 1])]
                                          ).fingerprint()


@pytest.mark.parametrize(("schedule", "message"), [
    ([], "at least one stage"),
    ([(5, [1, 1])], "begin at 0"),
    ([(0, [1, 1]), (0, [1, 2])], "increase"),
    ([(0, [1])], "1 weights for 2"),
    ([(0, [1, -1])], "finite number"),
    ([{"start": 0, "wieghts": [1, 1]}], "unknown key"),
    ([(-1, [1, 1])], "integer >= 0"),
])
def test_bad_schedules(data, schedule, message):
    with pytest.raises(InputError, match=message):
        scheduled(data, schedule=schedule)


def test_schedule_needs_fixed_or_first_exhausted_and_no_weights(data):
    sources = [wdstream.StreamingDataset(str(data / n)) for n in COUNTS]
    with pytest.raises(InputError, match="not both"):
        wdstream.Mix(sources, [1, 1], schedule=[(0, [1, 1])])
    with pytest.raises(InputError, match="cycle"):
        wdstream.Mix(sources, schedule=[(0, [1, 1])], stop="cycle")


def test_config_schedule_and_token_budget(data):
    config = {
        "seed": 5, "stop": "fixed", "samples_per_epoch": TOTAL,
        "schedule": [{"start": 0, "weights": {"a": 1}}, {"start": SWITCH, "weights": {"b": 1}}],
        "datasets": [{"path": str(data / "a"), "label": "a"}, {"path": str(data / "b"),
                                                             "label": "b"}],
    }
    mix = wdstream.from_config(config)
    assert mix.schedule.starts == [0, SWITCH]
    drawn = sources_of(wdstream.DataLoader(mix, batch_size=64))
    assert set(drawn[:SWITCH]) == {"a"} and set(drawn[SWITCH:]) == {"b"}
    with pytest.raises(InputError, match="no dataset named 'c'"):
        wdstream.from_config({**config, "schedule": [{"start": 0, "weights": {"c": 1}}]})
    packed = wdstream.from_config({**config, "seq_len": 8, "eos": 0, "text_field": "json.i",
                                   "tokens_per_epoch": 100})
    assert packed.sequences_per_epoch == 12
    with pytest.raises(InputError, match="not both"):
        wdstream.PackedSequences(mix, None, 8, eos=0, sequences_per_epoch=3,
                                 tokens_per_epoch=80)


def annealing(drawn):
    return [3, 1] if drawn < SWITCH else [1, 3]


def test_a_function_of_progress_draws_as_the_same_stages(data):
    stages = sources_of(wdstream.DataLoader(
        scheduled(data, schedule=[(0, [3, 1]), (SWITCH, [1, 3])]), batch_size=64, num_workers=2))
    function = scheduled(data, schedule=annealing)
    assert sources_of(wdstream.DataLoader(function, batch_size=64, num_workers=2)) == stages
    assert "annealing" in json.dumps(function.schedule.identity())
    with pytest.raises(InputError, match="schedule"):
        scheduled(data, schedule=lambda drawn: [0, 0])
