"""``PackedExamples`` (the axolotl plugin's SFT sample packing) over raw Parquet: rows of at
most seq_len tokens holding every example once, by first-fit decreasing per buffer, and a
resume from a state saved mid-buffer goes on with the rows an uninterrupted run has."""

from __future__ import annotations

import pytest

import wdstream
from tests.support.llm_data import merged, run_ranks
from tests.support.raw_data import all_keys, roundtrip, take, write_parquet
from wdstream.errors import StateError
from wdstream.integrations.axolotl_packing import PackedExamples, first_fit_decreasing
from wdstream.stream.load.ranks import ranks_of

SEQ_LEN = 24


def example_of(record: dict) -> dict | None:
    """An example of 1 to 30 tokens (the row's id + 1 tokens, cycled), None for every 7th."""
    if record["id"] % 7 == 0:
        return None
    n = record["id"] % 30 + 1
    ids = [record["id"]] * n
    return {"input_ids": ids, "attention_mask": [1] * n, "labels": ids,
            "key": [record["__key__"]] * n}


def loader(folder, excess="drop", buffer=10):
    dataset = PackedExamples(wdstream.StreamingDataset(str(folder), seed=3, shuffle_window=16),
                             example_of, SEQ_LEN, buffer=buffer, excess=excess)
    return wdstream.DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=list)


def test_first_fit_decreasing_fills_the_first_bin_with_room():
    assert first_fit_decreasing([5, 9, 3, 7, 2], 10) == [[1], [3, 2], [0, 4]]


@pytest.mark.slow  # DataLoader worker processes
def test_rows_hold_every_example_that_fits_once(tmp_path):
    folder = write_parquet(tmp_path / "data")
    rows = [row for batch in loader(folder) for row in batch]
    keys = [example["key"][0] for row in rows for example in row]
    assert len(keys) == len(set(keys))
    ids = {key: len(key.split(":")[0]) * 1000 + int(key.split(":")[1]) for key in all_keys()}
    assert set(keys) == {key for key, i in ids.items() if i % 7 and i % 30 + 1 <= SEQ_LEN}
    assert all(sum(len(e["input_ids"]) for e in row) <= SEQ_LEN for row in rows)
    assert all(e["position_ids"] == list(range(len(e["input_ids"]))) for r in rows for e in r)
    # too long (over SEQ_LEN) dropped, or truncated to SEQ_LEN
    truncated = [row for batch in loader(folder, "truncate") for row in batch]
    lengths = [len(e["input_ids"]) for row in truncated for e in row]
    assert max(lengths) == SEQ_LEN and len(lengths) > len(keys)


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [1, 4])
def test_a_resume_goes_on_with_the_rows_of_an_uninterrupted_run(tmp_path, stop_after):
    folder = write_parquet(tmp_path / "data")
    reference = list(loader(folder))
    first = loader(folder)
    head = take(first, stop_after)
    state = roundtrip(first.state_dict())
    resumed = loader(folder)
    resumed.load_state_dict(state)
    assert head + list(resumed) == reference
    other = loader(folder, buffer=11)
    with pytest.raises(StateError):
        other.load_state_dict(state)


def keys_in(batches) -> list[str]:
    return [example["key"][0] for batch in batches for row in batch for example in row]


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [((2, 2), (1, 1)), ((1, 2), (2, 3))])
def test_a_resume_on_another_layout_trains_every_example_once(tmp_path, monkeypatch, before,
                                                              after):
    """Stopped mid-buffer on one layout (ranks x workers), resumed on another: the examples
    the first layout delivered and those the second delivers are each example once, all of
    them but the fewer than `world` records an epoch plan leaves over per layout."""
    folder = write_parquet(tmp_path / "data")

    def make():
        return PackedExamples(wdstream.StreamingDataset(str(folder), seed=3, shuffle_window=16),
                              example_of, SEQ_LEN, buffer=10)

    (world, workers), (new_world, new_workers) = before, after
    first, states = run_ranks(monkeypatch, make, world, workers, 2, n=3, collate_fn=list)
    state = merged(states)
    cut = [p for value in state["positions"]
           for p in (ranks_of(value) if isinstance(value, dict) else [value]) if p and p[2]]
    assert cut  # some streams stopped inside a buffer
    rest, _ = run_ranks(monkeypatch, make, new_world, new_workers, 2, state=state,
                        collate_fn=list)
    keys = keys_in(b for batches in first + rest for b in batches)
    assert len(keys) == len(set(keys))  # none twice
    ids = {key: len(key.split(":")[0]) * 1000 + int(key.split(":")[1]) for key in all_keys()}
    fit = {key for key, i in ids.items() if i % 7 and i % 30 + 1 <= SEQ_LEN}
    assert set(keys) <= fit
    assert len(fit - set(keys)) < world + new_world  # the plans' remainders, no more

