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


def examples_of(record: dict) -> list[dict]:
    """An example of 1 to 30 tokens (the row's id + 1 tokens, cycled); none for every 7th
    row, and for every 5th a second example of 3 tokens."""
    if record["id"] % 7 == 0:
        return []
    n = record["id"] % 30 + 1
    ids = [record["id"]] * n
    made = [{"input_ids": ids, "attention_mask": [1] * n, "labels": ids,
             "key": [record["__key__"]] * n}]
    if record["id"] % 5 == 0:
        made.append({"input_ids": [1, 2, 3], "attention_mask": [1] * 3, "labels": [1, 2, 3],
                     "key": [record["__key__"] + "+"] * 3})
    return made


def expected_keys(seq_len: int = SEQ_LEN) -> set[str]:
    """The keys of the examples that fit in ``seq_len`` tokens."""
    ids = {key: len(key.split(":")[0]) * 1000 + int(key.split(":")[1]) for key in all_keys()}
    return ({key for key, i in ids.items() if i % 7 and i % 30 + 1 <= seq_len}
            | {key + "+" for key, i in ids.items() if i % 7 and i % 5 == 0})


def loader(folder, excess="drop", buffer=10, pack=True):
    dataset = PackedExamples(wdstream.StreamingDataset(str(folder), seed=3, shuffle_window=16),
                             examples_of, SEQ_LEN, buffer=buffer, excess=excess, pack=pack)
    return wdstream.DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=list)


def test_first_fit_decreasing_fills_the_first_bin_with_room():
    assert first_fit_decreasing([5, 9, 3, 7, 2], 10) == [[1], [3, 2], [0, 4]]


@pytest.mark.slow  # DataLoader worker processes
def test_rows_hold_every_example_that_fits_once(tmp_path):
    folder = write_parquet(tmp_path / "data")
    rows = [row for batch in loader(folder) for row in batch]
    keys = [example["key"][0] for row in rows for example in row]
    assert len(keys) == len(set(keys))
    assert set(keys) == expected_keys()
    assert any(key.endswith("+") for key in keys)  # records that gave two examples
    assert all(sum(len(e["input_ids"]) for e in row) <= SEQ_LEN for row in rows)
    assert max(len(row) for row in rows) > 1
    assert all(e["position_ids"] == list(range(len(e["input_ids"]))) for r in rows for e in r)
    # too long (over SEQ_LEN) dropped, or truncated to SEQ_LEN
    truncated = [row for batch in loader(folder, "truncate") for row in batch]
    lengths = [len(e["input_ids"]) for row in truncated for e in row]
    assert max(lengths) == SEQ_LEN and len(lengths) > len(keys)
    # unpacked: each example a row of its own
    unpacked = [row for batch in loader(folder, pack=False) for row in batch]
    assert {len(row) for row in unpacked} == {1}
    assert sorted(row[0]["key"][0] for row in unpacked) == sorted(keys)


@pytest.mark.slow
@pytest.mark.parametrize(("stop_after", "pack"), [(1, True), (4, True), (3, False)])
def test_a_resume_goes_on_with_the_rows_of_an_uninterrupted_run(tmp_path, stop_after, pack):
    folder = write_parquet(tmp_path / "data")
    reference = list(loader(folder, pack=pack))
    first = loader(folder, pack=pack)
    head = take(first, stop_after)
    state = roundtrip(first.state_dict())
    resumed = loader(folder, pack=pack)
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
                              examples_of, SEQ_LEN, buffer=10)

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
    fit = expected_keys()
    assert set(keys) <= fit
    lost = {key.rstrip("+") for key in fit - set(keys)}
    assert len(lost) < world + new_world  # the plans' remainders, no more

