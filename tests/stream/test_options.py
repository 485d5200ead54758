"""Options are checked when the object is built, with the accepted values in the message;
every error is a WdstreamError; on_error="skip" skips data failures only; loader.stats tells
the truth after an error."""

from __future__ import annotations

import json
import os

import pytest

import wdstream
from tests.support.shard_data import write_dataset
from wdstream.errors import AccessError, InputError, OptionError, ShardError, WdstreamError
from wdstream.options import CHOICES

COUNTS = [6, 5, 7]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_dataset(folder, COUNTS)
    return str(folder)


@pytest.fixture(autouse=True)
def no_opener_in_env(single_rank, monkeypatch):
    monkeypatch.delenv("WDSTREAM_OPENER", raising=False)


@pytest.mark.parametrize(("option", "value", "listed"), [
    ("opener", "bogus", "'auto', 'cli', 'fsspec', 'sdk'"),
    ("decode", "rgb9", "True, False, 'pil'"),
    ("on_error", "ignore", "'raise', 'skip'"),
    ("remainder", "keep", "'drop', 'pad'"),
])
def test_a_bad_choice_fails_when_the_dataset_is_built(data, option, value, listed):
    with pytest.raises(OptionError, match="use one of") as caught:
        wdstream.StreamingDataset(data, **{option: value})
    assert f"{option}={value!r}" in str(caught.value) and listed in str(caught.value)
    assert isinstance(caught.value, ValueError)  # callers catching ValueError still do


@pytest.mark.parametrize(("option", "value", "expect"), [
    ("seed", "3", "integer"), ("seed", -1, ">= 0"), ("seed", 1.5, "integer"),
    ("shuffle_window", 0, ">= 1"), ("retries", -1, ">= 0"), ("retries", True, "integer"),
    ("timeout", 0, "> 0"), ("timeout", float("nan"), "finite"), ("retry_backoff", -1, ">= 0"),
    ("shuffle", "yes", "True or False"), ("verify_digest", 1, "True or False"),
    ("map", 3, "callable"), ("decoders", ["json"], "dict"),
    ("decoders", {"json": 3}, "callable"), ("decoders", {"pyd": "unpickle"}, "pickle"),
    ("cache_limit", "lots", "not a size"), ("cache_limit", "1GB", "give cache_dir"),
])
def test_every_dataset_option_is_checked_when_built(data, option, value, expect):
    with pytest.raises(InputError, match=expect):
        wdstream.StreamingDataset(data, **{option: value})


def test_the_opener_variable_and_scheme_are_checked_when_built(data, monkeypatch):
    monkeypatch.setenv("WDSTREAM_OPENER", "bogus")
    with pytest.raises(InputError, match="WDSTREAM_OPENER='bogus'.*auto, cli, fsspec, sdk"):
        wdstream.StreamingDataset(data)
    monkeypatch.delenv("WDSTREAM_OPENER")
    with pytest.raises(InputError, match="sdk opener reads s3:// and gs:// only"):
        wdstream.StreamingDataset(["memory://x/shard-0.tar"], opener="sdk")


def test_choices_are_one_table():
    # new modes (decoders named like webdataset's, openers) are entries of this table
    from wdstream.stream.read.decode import IMAGE_MODES
    assert CHOICES["decode"] == (True, False, *IMAGE_MODES)
    from wdstream.sources.openers import OPENERS
    from wdstream.stream.plan.epoch import REMAINDER_POLICIES
    assert REMAINDER_POLICIES == CHOICES["remainder"] and OPENERS == CHOICES["opener"]


@pytest.mark.parametrize(("kwargs", "expect"), [
    ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"batch_size": "4"}, "batch_size must be an integer"),
    ({"num_workers": -1}, "num_workers must be >= 0"),
    ({"bytes_as": "array"}, "'bytes', 'tensor'"),
    ({"collate_fn": "stack"}, "callable"),
    ({"drop_last": "no"}, "True or False"),
    ({"tune_malloc": "yes"}, "tune_malloc must be True or False"),
    ({"persistent_workers": True, "num_workers": 1}, "persistent_workers"),
    ({"in_order": False, "num_workers": 1}, "in_order"),
    ({"sampler": [1, 2]}, "samplers"),
    ({"shuffle": True}, "shuffle"),
    ({"prefetch_factor": 2}, "num_workers > 0"),
    ({"prefetch_factor": 0, "num_workers": 1}, "prefetch_factor must be >= 1"),
    ({"timeout": -1}, "timeout"),
    ({"multiprocessing_context": "bogus", "num_workers": 1}, "DataLoader"),
])
def test_every_loader_option_is_checked_when_built(data, kwargs, expect):
    ds = wdstream.StreamingDataset(data)
    with pytest.raises(WdstreamError, match=expect) as caught:
        wdstream.DataLoader(ds, **kwargs)
    assert isinstance(caught.value, ValueError | TypeError)


def test_a_loader_of_something_else_is_a_wdstream_error():
    with pytest.raises(WdstreamError, match="needs a wdstream.StreamingDataset") as caught:
        wdstream.DataLoader([1, 2, 3])
    assert isinstance(caught.value, TypeError)


def test_len_of_an_unsized_loader_is_a_wdstream_type_error(tmp_path):
    write_dataset(tmp_path, [3, 3], manifest=False)
    loader = wdstream.DataLoader(wdstream.StreamingDataset(str(tmp_path)), batch_size=2)
    with pytest.raises(WdstreamError, match="manifest") as caught:
        len(loader)
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize(("kwargs", "expect"), [
    ({"stop": "never"}, "'first_exhausted', 'cycle', 'fixed'"),
    ({"seed": "1"}, "seed must be an integer"),
    ({"weights": [1, float("inf")]}, "finite"),
    ({"stop": "fixed", "samples_per_epoch": 0}, "positive integer"),
    ({"names": ["a", "a"]}, "distinct"),
])
def test_mix_options_are_checked_when_built(data, kwargs, expect):
    datasets = [wdstream.StreamingDataset(data), wdstream.StreamingDataset(data, seed=1)]
    with pytest.raises(InputError, match=expect):
        wdstream.Mix(datasets, **kwargs)


@pytest.mark.parametrize(("kwargs", "expect"), [
    ({"seq_len": 1}, "seq_len"),
    ({"long_documents": "wrap"}, "'split', 'truncate', 'drop'"),
    ({"text_field": 3}, "text_field"),
    ({"eos": -1}, "eos"),
    ({"sequences_per_epoch": 0}, "positive integer"),
    ({"tokenizer": 3}, "tokenizer"),
])
def test_packed_sequences_options_are_checked_when_built(data, kwargs, expect):
    kwargs = {"eos": 0, **kwargs}
    with pytest.raises(InputError, match=expect):
        wdstream.PackedSequences(wdstream.StreamingDataset(data), **kwargs)


def test_an_invalid_tokenizer_fails_when_built(data, tmp_path):
    pytest.importorskip("tokenizers")
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"version": "1.0", "truncation": None}))  # no model
    with pytest.raises(InputError, match="tokenizer: not a usable tokenizer.json"):
        wdstream.PackedSequences(wdstream.StreamingDataset(data), str(path), eos=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_never_hides_a_permission_problem(tmp_path, workers):
    denied = "pipe:echo 'An error occurred (AccessDenied) when calling GetObject' >&2; exit 1"
    missing = "pipe:echo 'An error occurred (NoSuchKey): not found' >&2; exit 1"
    good = write_dataset(tmp_path, [4], manifest=False)[0]
    ds = wdstream.StreamingDataset([good, missing], shuffle=False, on_error="skip",
                                   retries=0)
    loader = wdstream.DataLoader(ds, batch_size=None, num_workers=workers)
    assert len(list(loader)) == 4 and loader.stats["skipped_shards"] == [missing]
    ds = wdstream.StreamingDataset([good, denied], shuffle=False, on_error="skip", retries=0)
    with pytest.raises(AccessError, match="access denied") as caught:
        list(wdstream.DataLoader(ds, batch_size=None, num_workers=workers))
    assert caught.value.url == denied and not caught.value.transient


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_stats_count_the_retries_made_before_a_raise(tmp_path, workers):
    paths = write_dataset(tmp_path, [5, 5, 5, 5])
    with open(paths[1], "r+b") as shard:  # the manifest's size no longer matches
        shard.truncate(os.path.getsize(paths[1]) - 1024)
    ds = wdstream.StreamingDataset(str(tmp_path), shuffle=False, retries=2, retry_backoff=0)
    loader = wdstream.DataLoader(ds, batch_size=1, num_workers=workers)
    received = 0
    with pytest.raises(ShardError, match="shard-000001.tar") as caught:
        for _batch in loader:
            received += 1
    assert "Caught" not in str(caught.value)  # the error's own message, not a worker's trace
    assert loader.stats["retries"] == 2
    assert received >= 5 if workers == 0 else received >= 0


@pytest.mark.parametrize(("kwargs", "expect"), [
    ({"workers": "2"}, "workers must be an integer"),
    ({"max_count": 1.5}, "max_count must be an integer"),
    ({"part": (0,)}, "part must be"),
    ({"via": "s3"}, "choose auto, cli or fsspec"),
    ({"name": 3}, "name must be a string"),
    ({"fields": {"text": 3}}, "strings"),
    ({"max_size": "big"}, "not a size"),
])
@pytest.mark.slow
def test_pack_arguments_are_checked_before_any_work(tmp_path, kwargs, expect):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(InputError, match=expect):
        wdstream.pack(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()
