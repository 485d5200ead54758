"""A prompt format's maps and filters, recorded as axolotl asks for them and run on each
record as ``datasets`` runs them: a record gives none, one or several examples."""

from __future__ import annotations

import pytest

from wdstream.errors import InputError
from wdstream.integrations.axolotl import PromptFormat, RecordedMaps, examples_of


def chunks(columns: dict) -> dict:
    """A batched map splitting each text into examples of at most 3 words."""
    made: dict = {"input_ids": [], "labels": []}
    for text in columns["text"]:
        words = text.split()
        for start in range(0, len(words), 3):
            ids = [len(word) for word in words[start:start + 3]]
            made["input_ids"].append(ids)
            made["labels"].append(ids)
    return made


def format_of(maps: RecordedMaps) -> PromptFormat:
    made = PromptFormat({"path": "s3://bucket/texts/"}, None, None)  # no type: no strategy
    made.kind, made.steps = "custom", maps.steps
    return made


def test_a_record_gives_the_examples_the_maps_and_filters_leave():
    maps = RecordedMaps.make()
    maps.filter(lambda row: not row["text"].startswith("skip"))
    maps.map(chunks, batched=True)
    maps.filter(lambda columns: [len(ids) > 1 for ids in columns["input_ids"]], batched=True)
    found = format_of(maps)
    assert not found.one_each
    assert found({"text": "skip this one"}) == []
    assert found({"text": "a bb ccc dddd"}) == [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}]
    assert [e["input_ids"] for e in found({"text": "a bb ccc dddd eeeee"})] == [[1, 2, 3],
                                                                               [4, 5]]


def test_maps_alone_give_one_example_a_record():
    maps = RecordedMaps.make()
    maps.map(lambda row: {"input_ids": [len(row["text"])]})
    found = format_of(maps)
    assert found.one_each
    assert found({"text": "abc"}) == [{"input_ids": [3]}]


def test_a_batched_map_of_uneven_columns_is_an_input_error():
    maps = RecordedMaps.make()
    maps.map(lambda columns: {"input_ids": [[1], [2]], "labels": [[1]]}, batched=True)
    with pytest.raises(InputError, match="s3://bucket/texts/: the prompt format made columns"):
        format_of(maps)({"text": "a"})


def test_a_record_the_format_cannot_read_is_an_input_error_naming_it():
    maps = RecordedMaps.make()
    maps.map(lambda row: {"input_ids": [len(row["prompt"])]})
    sample = {"__source__": "texts", "__key__": "part-0.parquet:3", "text": "a"}
    with pytest.raises(InputError, match=r"s3://bucket/texts/: type 'custom' cannot read the "
                       r"record part-0\.parquet:3 \(KeyError: 'prompt'; its columns: text\)"):
        examples_of({"texts": format_of(maps)}, sample)


class Lengths:
    """A prompt strategy as axolotl's stepwise-supervised type hands it to its
    ``TokenizedPromptDataset``."""

    supports_batched = False
    filter_rows = None

    def tokenize_prompt(self, row):
        return {"input_ids": [len(word) for word in row["text"].split()]}


def test_a_strategy_building_a_dataset_on_the_maps_is_recorded():
    """axolotl's ``TokenizedPromptDataset`` (a ``datasets.Dataset`` of the mapped rows) built
    on the recorder: its map is recorded, and the dataset it builds holds no rows."""
    from axolotl.datasets import TokenizedPromptDataset

    maps = RecordedMaps.make()
    built = TokenizedPromptDataset(Lengths(), maps)
    assert len(built) == 0
    assert format_of(maps)({"text": "a bb ccc"}) == [{"input_ids": [1, 2, 3]}]
