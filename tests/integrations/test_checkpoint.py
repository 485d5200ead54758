"""Per-rank loader states in a framework's checkpoint folder (wdstream.integrations.checkpoint);
rank 0's state of a Mix resumes every rank, and a stage whose positions are per rank refuses
another rank's ungathered state."""

from __future__ import annotations

import json

import pytest

import wdstream
from tests.support.shard_data import first_batches, write_dataset
from wdstream.errors import StateError
from wdstream.integrations.checkpoint import load_loader_state, save_loader_state, state_path
from wdstream.stream.load.ranks import ranks_of


@pytest.fixture
def data(tmp_path):
    write_dataset(tmp_path / "a", [20, 12])
    write_dataset(tmp_path / "b", [16])
    return tmp_path


def as_rank(monkeypatch, rank, world):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def mix_loader(data):
    mix = wdstream.Mix([wdstream.StreamingDataset(str(data / "a"), seed=1),
                        wdstream.StreamingDataset(str(data / "b"), seed=1)], [0.5, 0.5], seed=2)
    return wdstream.DataLoader(mix, batch_size=2)


def test_each_rank_saves_and_loads_its_own_state(data, monkeypatch, tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    expected = {}
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        loader = mix_loader(data)
        first_batches(loader, 3)
        save_loader_state(loader, folder)
        expected[rank] = loader.state_dict()
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        loader = mix_loader(data)
        load_loader_state(loader, folder)
        assert loader.state_dict() == expected[rank]
        assert json.loads(open(state_path(folder, rank)).read())["rank"] == rank


def test_another_world_size_loads_rank_0s_state(data, monkeypatch, tmp_path):
    as_rank(monkeypatch, 0, 2)
    loader = wdstream.DataLoader(wdstream.StreamingDataset(str(data / "a"), seed=1), batch_size=2)
    first_batches(loader, 2)
    save_loader_state(loader, tmp_path)
    as_rank(monkeypatch, 0, 1)  # elastic: sample counts re-planned over one rank
    again = wdstream.DataLoader(wdstream.StreamingDataset(str(data / "a"), seed=1), batch_size=2)
    load_loader_state(again, tmp_path)
    assert len(again) == len(list(again)) == (32 - 2 * 2 * 2) // 2  # the rest of the epoch
    assert len(again) == 32 // 2  # then whole epochs


def keys(batches):
    return [k for b in batches for k in b["__key__"]]


def test_a_mix_resumes_every_rank_from_rank_0s_state(data, monkeypatch):
    """A Mix's positions are the same on every rank (draws and source positions do not
    depend on it), so rank 0's state, as Lightning writes it, resumes rank 1 too."""
    states, rest = {}, {}
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        loader = mix_loader(data)
        first_batches(loader, 2)
        states[rank] = loader.state_dict()
        own = mix_loader(data)
        own.load_state_dict(states[rank])
        rest[rank] = keys(own)
    assert states[0]["positions"] == states[1]["positions"]
    as_rank(monkeypatch, 1, 2)
    loader = mix_loader(data)
    loader.load_state_dict(states[0])
    assert keys(loader) == rest[1] and rest[1]


def test_packing_refuses_another_ranks_ungathered_state(data, monkeypatch):
    def packed_loader():
        dataset = wdstream.StreamingDataset(str(data / "a"), seed=1)
        return wdstream.DataLoader(wdstream.PackedSequences(
            dataset, lambda text: [1, 2, 3], 4, eos=0, text_field="txt"), batch_size=2)

    as_rank(monkeypatch, 0, 2)
    loader = packed_loader()
    first_batches(loader, 2)
    state = loader.state_dict()
    state["positions"] = [ranks_of(p)[0] for p in state["positions"]]  # rank 0's alone
    as_rank(monkeypatch, 1, 2)
    with pytest.raises(StateError, match="this is rank 0's state.*load rank 1's own state"):
        packed_loader().load_state_dict(state)


def test_a_missing_state_names_the_file(tmp_path, data):
    with pytest.raises(StateError, match="wdstream_loader-rank0.json: no wdstream loader state"):
        load_loader_state(mix_loader(data), tmp_path)
