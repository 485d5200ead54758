"""Crafted loader states: a state is loaded from a checkpoint someone else may have written, so
each malformed or out-of-bounds value must be refused by ``load_state_dict`` with a
``StateError`` naming the key and its bound, before any plan loops over it: for a
``StreamingDataset``, a ``Mix`` and ``PackedSequences``. Each load runs in a forked child
with a time limit and a memory limit, so a loop over 10**12 ranks or a list of that many
fails the test instead of hanging or swapping."""

from __future__ import annotations

import copy
import random

import pytest

import wdstream
from tests.support.hostile import in_child
from tests.support.llm_data import sources, write_sources, write_token_sources
from tests.support.shard_data import write_dataset
from wdstream.errors import StateError, WdstreamError
from wdstream.stream.load.state import MAX_DEPTH, MAX_STREAMS

pytestmark = pytest.mark.usefixtures("single_rank")

COUNTS = [6, 5, 7, 4]  # 22 samples


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-state")
    write_dataset(root / "plain", COUNTS)
    write_sources(root / "mix", {"a": [8, 6], "b": [5, 7]})
    write_token_sources(root / "tokens", {"x": [12, 9]})
    return root


def make(kind: str, root):
    if kind == "dataset":
        return wdstream.StreamingDataset(str(root / "plain"), seed=3, shuffle_window=4)
    if kind == "mix":
        return wdstream.Mix(sources(root / "mix", ["a", "b"]), [0.6, 0.4], seed=5)
    inner = wdstream.StreamingDataset(str(root / "tokens" / "x"), seed=2, shuffle_window=5)
    return wdstream.PackedSequences(inner, None, 8, eos=0, text_field="tokens.npy",
                                    sequences_per_epoch=20)


def saved_state(kind: str, root) -> dict:
    """A real state, two batches into the epoch."""
    loader = wdstream.DataLoader(make(kind, root), batch_size=2)
    batches = iter(loader)
    next(batches)
    next(batches)
    return loader.state_dict()


def load_in_child(loader, state) -> tuple[str, str]:
    """``loader.load_state_dict(state)`` and ``len(loader)`` (what a resume plans first) in a
    forked child with a time and memory limit."""
    def load():
        loader.load_state_dict(state)
        len(loader)
        return ""
    return in_child(load)


def at(path, value):
    """A change of the state: ``path`` (keys and indexes) set to ``value``."""
    def change(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def segment(world, workers, consumed=None):
    """A history segment of ``world`` ranks (the consumed entries: zeros)."""
    return at(["history"], [[world, workers, 2, consumed if consumed is not None
                             else [0] * workers]])


def deep(levels: int):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


# (name, change, a part of the message)
ATTACKS = [
    ("world 10**12", at(["world"], 10**12), "'world' is 1000000000000, more than the"),
    ("workers 10**12", at(["workers"], 10**12), "'positions' needs one entry per worker"),
    ("a segment of 10**12 ranks", segment(10**12, 1), "history[0] 'world' is 1000000000000"),
    ("a segment of 10**12 workers", segment(1, 10**12, [0]),
     "history[0] needs one position per worker (1000000000000)"),
    ("a segment of as many workers as samples, 10**12 ranks", segment(10**12, 22),
     "history[0] 'world' is 1000000000000"),
    ("a segment of 2**70 ranks", segment(2**70, 1), "'history[0] world' must be an integer"),
    ("segments over the stream limit", at(["history"], [[20, 20, 2, [0] * 20]] * 400),
     f"more than {MAX_STREAMS}"),
    ("world 0", at(["world"], 0), "'world' must be an integer from 1"),
    ("world as a string", at(["world"], "2"), "'world' must be int, not str"),
    ("world as a float", at(["world"], 2.0), "'world' must be int, not float"),
    ("world as a bool", at(["world"], True), "'world' must be int, not bool"),
    ("epoch NaN", at(["epoch"], float("nan")), "'epoch' must be int, not float"),
    ("epoch -1", at(["epoch"], -1), "'epoch' must be an integer from 0"),
    ("epoch 10**30", at(["epoch"], 10**30), "'epoch' must be an integer from 0 to"),
    ("seed 10**30", at(["seed"], 10**30), "'seed' must be an integer"),
    ("batch size -1", at(["batch_size"], -1), "'batch_size' must be an integer from 0"),
    ("a negative batch count", at(["batches", 0], -1), "'batches' must be an integer"),
    ("rank past the world", at(["rank"], 5), "'rank' is 5, not below 'world'"),
    ("drop_last 1", at(["drop_last"], 1), "'drop_last' must be bool, not int"),
    ("a position of 2**64", at(["positions", 0], 2**64), "'positions' holds 1844674407"),
    ("a negative position", at(["positions", 0], -5), "'positions' holds -5"),
    ("a NaN position", at(["positions", 0], float("nan")), "'positions' holds nan"),
    ("a bool position", at(["positions", 0], True), "'positions' holds True"),
    ("a dict position", at(["positions", 0], {"x": 1}), "'positions' holds {'x': 1}"),
    ("nested junk", at(["positions", 0], deep(100)), f"nested more than {MAX_DEPTH} deep"),
    ("positions not a list", at(["positions"], "x"), "'positions' must be list, not str"),
    ("one position too many", lambda s: s["positions"].append(0), "one entry per worker"),
    ("a segment that is not a list", at(["history"], ["x"]), "history[0] must be [world"),
    ("a segment of 3 values", at(["history"], [[1, 1, 2]]), "history[0] must be [world"),
    ("a segment's missing position", at(["history"], [[1, 2, 2, [0]]]),
     "history[0] needs one position per worker (2), not 1"),
    ("not a dict", lambda s: s.clear() or s.update(x=1), "missing key 'format'"),
]


@pytest.fixture(scope="module")
def states(folders):
    return {kind: saved_state(kind, folders) for kind in ("dataset", "mix", "packed")}


@pytest.mark.parametrize("kind", ["dataset", "mix", "packed"])
def test_the_saved_state_loads(folders, states, kind):
    """The harness itself: the real state loads in the child (so what fails below is the
    change, not the child)."""
    loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
    assert load_in_child(loader, copy.deepcopy(states[kind])) == ("ok", "")


@pytest.mark.parametrize("kind", ["dataset", "mix", "packed"])
@pytest.mark.parametrize(("name", "change", "message"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_crafted_states_are_refused_before_any_loop(folders, states, kind, name, change,
                                                    message):
    state = copy.deepcopy(states[kind])
    change(state)
    loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
    kind_name, text = load_in_child(loader, state)
    assert kind_name == "StateError", f"{name}: {kind_name}: {text}"
    assert message in text, text


def positions_past_the_samples(kind: str):
    """A change of the state's first position to an offset past the dataset's samples: the
    sample count itself, a mixture's position in its first source, a packing stage's inner
    position (the document its next sequence starts in)."""
    def change(state):
        position = state["positions"][0]
        if kind == "dataset":
            state["positions"][0] = 10**6
        elif kind == "mix":
            position[2] = 10**6
        else:
            position[2] = 10**6
    return change


@pytest.mark.parametrize("kind", ["dataset", "mix", "packed"])
def test_offsets_past_the_epoch_are_refused(folders, states, kind):
    state = copy.deepcopy(states[kind])
    positions_past_the_samples(kind)(state)
    loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
    kind_name, text = load_in_child(loader, state)
    assert kind_name == "StateError", text
    assert "position 1000000 is not a sample count from 0 to" in text


@pytest.mark.parametrize("kind", ["mix", "packed"])
@pytest.mark.parametrize("value", [{"ranks": "!!"}, {"ranks": 5}, [1, 2], "end",
                                   {"ranks": [None, [0, "x"]]}])
def test_malformed_stage_positions_are_refused(folders, states, kind, value):
    state = copy.deepcopy(states[kind])
    state["positions"][0] = value
    loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
    kind_name, text = load_in_child(loader, state)
    assert kind_name == "StateError", text


@pytest.mark.parametrize("kind", ["dataset", "mix", "packed"])
def test_a_segment_of_huge_offsets_is_refused(folders, states, kind):
    """A history segment (another layout) whose position is past the samples."""
    state = copy.deepcopy(states[kind])
    position = copy.deepcopy(state["positions"][0])
    if kind == "dataset":
        position = 10**18
    else:
        position[2] = 10**18
    state["history"] = [[1, 1, 2, [position]]]
    loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
    kind_name, text = load_in_child(loader, state)
    assert kind_name == "StateError", text
    assert "not a sample count from 0 to" in text


def test_the_torchdata_state_of_a_dataset_is_checked(folders):
    """The per-stream state of torchdata's protocol: its epoch and position too."""
    ds = make("dataset", folders)
    good = ds.state_dict()
    for key, value in [("epoch", "1"), ("epoch", 10**30), ("position", -1),
                       ("position", 10**6), ("position", [0])]:
        with pytest.raises(StateError, match=key if key == "epoch" else "position"):
            ds.load_state_dict({**good, key: value})
    ds.load_state_dict(good)


@pytest.mark.parametrize("kind", ["mix", "packed"])
@pytest.mark.parametrize("entry", [None, {"ranks": []}, {"ranks": [None]}, {"ranks": 5},
                                   {"ranks": [None, None]}, [None]])
def test_malformed_segment_entries_are_refused(folders, states, kind, entry):
    """A segment of 2 ranks whose entry is no position, or not those of 2 ranks; the segment
    after it is real. Both ranks' entries missing is a well-formed state that cannot be
    resumed: refused when the resume is planned (``len()`` reports it as unsized)."""
    state = copy.deepcopy(states[kind])
    position = state["positions"][0]
    state["history"] = [[2, 1, 2, [entry]], [3, 1, 2, [copy.deepcopy(position)]]]
    loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
    kind_name, text = load_in_child(loader, state)
    if entry == {"ranks": [None, None]}:
        assert kind_name == "UnsizedError" and "lacks some ranks' positions" in text, text
    else:
        assert kind_name == "StateError", text


JUNK = [None, True, -1, 0, 1, 7, 23, 2**63 - 1, 2**63, 1.5, float("nan"), "end", "x", "AAAA",
        [], [0], [[0]], {}, {"ranks": []}, {"ranks": [None]}, {"ranks": "AAAA"},
        {"ranks": [[0, 0, 0, 0]]}]


def places(value, path=()):
    """The paths (keys and indexes) of every value in ``value``, itself first."""
    yield path
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from places(item, (*path, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from places(item, (*path, key))


def mutated(state: dict, rng: random.Random) -> dict:
    """``state`` with one to three of its values (or parts of them) replaced by junk."""
    state = copy.deepcopy(state)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([p for p in places(state) if p])
        at(list(path), copy.deepcopy(rng.choice(JUNK)))(state)
    return state


@pytest.mark.parametrize("kind", ["dataset", "mix", "packed"])
def test_random_junk_gives_a_state_error_or_a_resume(folders, states, kind):
    """Random values replaced by junk, in a state with and without history segments (of
    every rank's positions, gathered): each loads and reads its first batches, or is refused
    with wdstream's own error, never another one."""
    rng = random.Random(f"junk-{kind}")
    position = states[kind]["positions"][0]
    with_history = copy.deepcopy(states[kind])
    with_history["history"] = [[2, 1, 2, [{"ranks": [position, position]}]],
                               [3, 1, 2, [position]]]
    cases = [mutated(rng.choice([states[kind], with_history]), rng) for _ in range(60)]

    def run() -> str:
        for state in cases:
            loader = wdstream.DataLoader(make(kind, folders), batch_size=2)
            try:
                loader.load_state_dict(state)
                len(loader)
                batches = iter(loader)
                next(batches, None)
                next(batches, None)
            except WdstreamError:
                pass
        return ""

    assert in_child(run) == ("ok", "")
