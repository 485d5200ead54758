"""Small JSON members decoded in the training process: through real DataLoader workers the
batches are the ones the workers' own decoding gives (same values, same types), a member that
does not decode names its shard, sample and member, and whatever needs the decoded value in
the worker (a map, a user's decoder, on_error="skip") still gets it there."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

import wdstream
import wdstream.stream.load.loader as loader_module
from wdstream.errors import ShardError
from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.shards.tar_writer import TarWriter
from wdstream.stream.read.decode import build_decoders, decode_sample, json_member
from wdstream.stream.transfer import deferred
from wdstream.stream.transfer.batching import collate, unpack_shared

BIG = 2**70 + 3  # beyond 64 bits: orjson makes it a float (the standard library an int)


def record(shard: int, index: int) -> bytes:
    """Members of every kind the two decoders treat differently."""
    kind = index % 6
    if kind == 0:
        value = {"text": f"naïve café {index} 東京 \u00e9\U0001f600", "i": index, "f": index / 7}
        return json.dumps(value, ensure_ascii=index % 12 == 0).encode()
    if kind == 1:
        return b'{"x": NaN, "y": Infinity, "z": -Infinity, "i": %d}' % index
    if kind == 2:
        return json.dumps({"big": BIG * (index + 1), "neg": -BIG, "list": [BIG, 1]}).encode()
    if kind == 3:
        return b'{"dup": 1, "dup": %d, "nested": {"dup": "a", "dup": "b"}}' % index
    if kind == 4:
        return json.dumps([index, None, True, False, "", [], {}, 1e300, -0.0]).encode()
    return json.dumps({"s": "\\", "q": '"', "u": "\u2028\u2029", "ctrl": "\x01"}).encode()


def write(folder, counts, member=record, extra=None) -> str:
    os.makedirs(folder, exist_ok=True)
    infos = []
    for shard, count in enumerate(counts):
        path = os.path.join(folder, f"shard-{shard:06d}.tar")
        with open(path, "wb") as file:
            writer = TarWriter(file)
            for index in range(count):
                key = f"s{shard}_{index:04d}"
                writer.add(f"{key}.json", member(shard, index))
                writer.add(f"{key}.n.json", str(index * 3).encode())  # a number: a tensor
                for name, data in (extra(shard, index) if extra else {}).items():
                    writer.add(f"{key}.{name}", data)
            writer.close()
        data = open(path, "rb").read()
        infos.append(ShardInfo(os.path.basename(path), count, len(data),
                               hashlib.sha256(data).hexdigest()))
    with open(os.path.join(folder, "index.json"), "w") as file:
        file.write(Manifest(infos, extensions=["json"]).to_json())
    return folder


def canonical(value):
    """A comparable form that keeps types (int vs float vs tensor) and NaN."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, dict):
        return ("dict", [(k, canonical(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [canonical(v) for v in value])
    return (type(value).__name__, value)


@pytest.fixture
def columns(monkeypatch):
    """The kinds of batch values that reach the main process from the workers."""
    seen = []

    def spy(batch, bytes_as="bytes", before_copy=None):
        if isinstance(batch, dict):
            seen.append({name: type(value).__name__ for name, value in batch.items()})
        return unpack_shared(batch, bytes_as, before_copy)

    monkeypatch.setattr(loader_module, "unpack_shared", spy)
    return seen


def test_batches_are_those_the_workers_decoding_gives(tmp_path, single_rank, columns):
    def extra(shard, index):  # a gzipped JSON member and a large one beside small ones
        members = {"json.gz": gzip.compress(b'{"g": %d}' % index)}
        if index == 5:
            members["big.json"] = json.dumps({"pad": "p" * deferred.DEFER_MAX}).encode()
        else:
            members["big.json"] = b'{"pad": "small"}'
        return members

    source = write(tmp_path / "d", [40, 35], extra=extra)
    got = list(wdstream.DataLoader(wdstream.StreamingDataset(source, shuffle=True, seed=3),
                                   batch_size=8, num_workers=2))
    assert all(kinds["json"] == "JsonColumn" and kinds["n.json"] == "JsonColumn"
               and kinds["json.gz"] == "JsonColumn" for kinds in columns)
    # the column holding a large member was decoded in the worker, the others were not
    assert {kinds["big.json"] for kinds in columns} == {"JsonColumn", "list"}
    # the workers' decoding: the same collate given explicitly, decoded objects pickled
    reference = list(wdstream.DataLoader(wdstream.StreamingDataset(source, shuffle=True, seed=3),
                                         batch_size=8, num_workers=2,
                                         collate_fn=wdstream.collate))
    assert len(got) == len(reference) == 10
    assert [canonical(b) for b in got] == [canonical(b) for b in reference]
    first = got[0]
    assert first["n.json"].dtype == torch.int64 and isinstance(first["json"], list)
    values = [v for batch in got for v in batch["json"]]
    assert any(isinstance(v, dict) and v.get("neg") == json_member(b"-%d" % BIG)
               for v in values)
    assert any(isinstance(v, dict) and "東京" in v.get("text", "") for v in values)
    assert any(isinstance(v, dict) and math.isnan(v.get("x", 0.0)) for v in values)
    assert any(isinstance(v, dict) and v.get("nested") == {"dup": "b"} for v in values)


def test_one_sample_per_fetch_and_the_main_process_path(tmp_path, single_rank, columns):
    source = write(tmp_path / "d", [12])
    got = list(wdstream.DataLoader(wdstream.StreamingDataset(source, shuffle=False),
                                   batch_size=None, num_workers=1))
    assert {kinds["json"] for kinds in columns} == {"JsonColumn"}
    dataset = wdstream.StreamingDataset(source, shuffle=False)
    in_process = list(wdstream.DataLoader(dataset, batch_size=None))  # no workers: decoded
    assert [canonical(s) for s in got] == [canonical(s) for s in in_process]
    assert got[0]["n.json"] == 0 and isinstance(got[0]["json"], dict)


def test_a_member_that_does_not_decode_names_it_and_is_not_consumed(tmp_path, single_rank,
                                                                     columns):
    def member(shard, index):
        return b'{"bad": ' if (shard, index) == (0, 21) else b'{"ok": %d}' % index

    source = write(tmp_path / "d", [40], member=member)
    for collate_fn in (None, wdstream.collate):  # decoded here, then in the workers
        dataset = wdstream.StreamingDataset(source, shuffle=False)
        loader = wdstream.DataLoader(dataset, batch_size=8, num_workers=1,
                                     collate_fn=collate_fn)
        batches = []
        with pytest.raises(ShardError, match=r"shard-000000\.tar: sample 's0_0021': cannot "
                                             r"decode \.json: "):
            for batch in loader:
                batches.append(batch)
        assert len(batches) == 2  # the batches before the member's
        assert loader.state_dict()["positions"] == [16]
        kinds = {kinds["json"] for kinds in columns}
        assert kinds == ({"JsonColumn"} if collate_fn is None else {"list"})
        columns.clear()


def test_what_needs_the_decoded_value_gets_it_in_the_worker(tmp_path, single_rank, columns):
    source = write(tmp_path / "d", [16])

    def mapped(sample):
        assert isinstance(sample["json"], (dict, list))
        return {**sample, "worker": torch.utils.data.get_worker_info().id}

    def mine(data):
        return ("mine", len(data))

    for options in ({"map": mapped}, {"decoders": {"json": mine}}, {"on_error": "skip"}):
        columns.clear()
        dataset = wdstream.StreamingDataset(source, shuffle=False, **options)
        batches = list(wdstream.DataLoader(dataset, batch_size=8, num_workers=1))
        assert len(batches) == 2
        assert all(kinds["json"] == "list" for kinds in columns), options
        if "decoders" in options:
            assert batches[0]["json"][0] == ("mine", len(record(0, 0)))


def test_skipped_samples_are_still_dropped_in_the_worker(tmp_path, single_rank):
    def member(shard, index):
        return b"{bad" if index == 3 else b'{"ok": %d}' % index

    dataset = wdstream.StreamingDataset(write(tmp_path / "d", [16], member=member),
                                        shuffle=False, on_error="skip")
    loader = wdstream.DataLoader(dataset, batch_size=8, num_workers=1)
    keys = [key for batch in loader for key in batch["__key__"]]
    assert len(keys) == 15 and "s0_0003" not in keys
    assert loader.stats["skipped_samples"] == 1


def test_a_column_crosses_as_one_blob():
    table = deferred.deferring(build_decoders(None))
    samples = [decode_sample({"__key__": f"k{i}", "__url__": "u", "json": b'{"i": %d}' % i},
                             table) for i in range(3)]
    assert all(type(s["json"]) is deferred.Deferred for s in samples)
    column = collate(samples)["json"]
    received = pickle.loads(ForkingPickler.dumps(column))
    assert received.blob == b'{"i": 0}{"i": 1}{"i": 2}' and received.ends == [8, 16, 24]
    assert received.decode("json", ["u"] * 3, ["k0", "k1", "k2"]) == [{"i": i} for i in range(3)]
    # a user's JSON decoder is not the built-in one: nothing to defer
    assert not deferred.can_defer(build_decoders({"json": json.loads, "jsn": None}))


def test_a_stream_decoder_decodes_as_decode_sample_does():
    import zlib

    from wdstream.stream.read.decode import SampleDecoder

    table = build_decoders({"up": lambda data: data.upper(), "txt": None})
    decoder = SampleDecoder(table)
    gz = zlib.compressobj(wbits=31)
    samples = [{"__key__": f"k{i}", "__url__": "u", "json": b'{"i": %d}' % i,
                "n.json": b"%d" % i, "txt": b"kept", "cls": b"%d" % i, "x.up": b"ab",
                "json.gz": gz.compress(b"[1]") + gz.flush() if i == 0 else gzip.compress(b"[2]"),
                "__extra__": b"raw", "bin": b"\x00"} for i in range(3)]
    for sample in samples * 2:  # the second time from the names it has seen
        assert decoder(dict(sample)) == decode_sample(sample, table)  # in place
    with pytest.raises(ShardError, match=r"u: sample 'k9': cannot decode \.n\.json"):
        decoder({"__key__": "k9", "__url__": "u", "n.json": b"{bad"})


def test_deferred_json_stays_bytes_and_crosses_as_one_column():
    names: set[str] = set()
    decoder = deferred.DeferringDecoder(build_decoders(None), names)
    big = json.dumps({"pad": "p" * deferred.DEFER_MAX}).encode()
    samples = [decoder({"__key__": f"k{i}", "__url__": "u", "json": b'{"i": %d}' % i,
                        "n.json": big if i == 1 else b"%d" % i, "txt": b"t"})
               for i in range(3)]
    assert names == {"json", "n.json"}
    assert samples[0]["json"] == b'{"i": 0}' and samples[0]["txt"] == "t"
    assert samples[1]["n.json"] == {"pad": "p" * deferred.DEFER_MAX}  # decoded in the worker
    batch = collate(samples, json_names=names)
    assert type(batch["json"]) is deferred.JsonColumn
    assert batch["n.json"] == [0, {"pad": "p" * deferred.DEFER_MAX}, 2]  # beside a large one
    received = pickle.loads(ForkingPickler.dumps(batch))
    assert unpack_shared(received)["json"] == [{"i": i} for i in range(3)]
    # without the names (a user's collate_fn gets none): the bytes as they are
    assert collate(samples)["json"] == [b'{"i": 0}', b'{"i": 1}', b'{"i": 2}']


def test_a_column_decodes_past_members_orjson_refuses():
    values = [b'{"a": 1}', b'{"x": NaN}', b'[2]', b'{"bad"']
    column = deferred.JsonColumn(values)
    with pytest.raises(ShardError, match=r"s1.tar: sample 'k3': cannot decode \.json"):
        column.decode("json", ["s0.tar", "s0.tar", "s1.tar", "s1.tar"], ["k0", "k1", "k2", "k3"])
    got = deferred.JsonColumn(values[:3]).decode("json", "u", ["k0", "k1", "k2"])
    assert got[0] == {"a": 1} and math.isnan(got[1]["x"]) and got[2] == [2]
