"""Deterministic epochs and exact resume through the real DataLoader, on local shards."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter

import pytest

import wdstream
from tests.support.shard_data import all_keys, batch_keys, take, write_dataset
from wdstream.errors import StateError

COUNTS = [13, 40, 7, 25, 3, 31, 18, 9]  # uneven shards


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_dataset(folder, COUNTS)
    return str(folder)


def make(data, workers=2, batch_size=4, seed=3, window=5, **kwargs):
    ds = wdstream.StreamingDataset(data, seed=seed, shuffle_window=window, **kwargs)
    return wdstream.DataLoader(ds, batch_size=batch_size, num_workers=workers)


keys_of = batch_keys


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_one_epoch_reads_every_sample_once(data, single_rank, workers):
    loader = make(data, workers=workers)
    batches = keys_of(loader)
    flat = [k for b in batches for k in b]
    assert Counter(flat) == Counter(all_keys(COUNTS))
    assert len(batches) == len(loader)
    assert len(loader.dataset) == sum(COUNTS)


def test_samples_are_decoded(data, single_rank):
    loader = make(data, workers=0, batch_size=None)
    sample = next(iter(loader))
    assert set(sample) == {"__key__", "__url__", "json", "txt"}
    assert isinstance(sample["json"], dict) and isinstance(sample["txt"], str)
    assert sample["__url__"].endswith(".tar")


def test_deterministic_epochs_advance(data, single_rank):
    first, second = make(data), make(data)
    assert keys_of(first) == keys_of(second)
    assert keys_of(first) == keys_of(second)  # epoch 1, both
    other_seed = make(data, seed=4)
    assert keys_of(other_seed) != keys_of(make(data))
    ds = make(data).dataset
    ds.set_epoch(1)
    loader = wdstream.DataLoader(ds, batch_size=4, num_workers=2)
    reference = make(data)
    keys_of(reference)
    assert keys_of(loader) == keys_of(reference)


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.slow
def test_exact_resume_at_many_stop_points(data, single_rank, workers):
    reference = keys_of(make(data, workers=workers))
    next_epoch = None
    stops = sorted({0, 1, 2, 3, len(reference) // 2, len(reference) - 1, len(reference)})
    for stop in stops:
        loader = make(data, workers=workers)
        before = take(loader, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        assert len(json.dumps(state)) < 4096
        resumed = make(data, workers=workers)
        resumed.load_state_dict(state)
        after = keys_of(resumed)
        if stop == len(reference):  # saved at the very end: the next epoch starts
            if next_epoch is None:
                ref = make(data, workers=workers)
                keys_of(ref)
                next_epoch = keys_of(ref)
            assert after == next_epoch
        else:
            assert before + after == reference, f"stop {stop}"


def test_resume_twice(data, single_rank):
    reference = keys_of(make(data))
    first = make(data)
    part1 = take(first, 5)
    second = make(data)
    second.load_state_dict(first.state_dict())
    part2 = take(second, 7)
    third = make(data)
    third.load_state_dict(second.state_dict())
    assert part1 + part2 + keys_of(third) == reference


def test_a_resume_says_what_it_restored(data, single_rank, caplog):
    first = make(data)
    take(first, 5)
    second = make(data)
    with caplog.at_level(logging.INFO, logger="wdstream.loader"):
        second.load_state_dict(first.state_dict())
    said = [r.getMessage() for r in caplog.records if r.name == "wdstream.loader"]
    assert said == ["resuming epoch 0: 5 batches per rank delivered on 1 ranks x "
                    f"{first.streams} workers, batch {first.batch_size} (0 earlier layouts)"]


def test_drop_last_resume(data, single_rank):
    def loader():
        ds = wdstream.StreamingDataset(data, seed=1, shuffle_window=8)
        return wdstream.DataLoader(ds, batch_size=5, num_workers=2, drop_last=True)

    reference = keys_of(loader())
    assert len(reference) == len(loader()) and all(len(b) == 5 for b in reference)
    first = loader()
    part = take(first, 9)
    second = loader()
    second.load_state_dict(first.state_dict())
    assert part + keys_of(second) == reference


def run_ranks(data, world, workers, batches, state=None, batch_size=4, **options):
    """Run `world` ranks in lockstep for `batches` batches (all if None); return the keys each
    delivered and rank 0's state."""
    delivered, states = [], []
    for rank in range(world):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
        loader = make(data, workers=workers, batch_size=batch_size, **options)
        if state is not None:
            loader.load_state_dict(state)
        got = keys_of(loader) if batches is None else take(loader, batches)
        delivered.append(got)
        states.append(loader.state_dict())
    return delivered, states[0]


@pytest.mark.parametrize("after", [(1, 3), (3, 1), (2, 2), (4, 2)])
def test_elastic_resume_exactly_once(data, monkeypatch, after):
    monkeypatch.setenv("RANK", "0")  # run_ranks changes both; monkeypatch restores them
    monkeypatch.setenv("WORLD_SIZE", "1")
    before, state = run_ranks(data, 2, 2, batches=5)
    assert len({len(b) for b in before}) == 1
    rest, _ = run_ranks(data, *after, batches=None, state=state)
    assert len({len(b) for b in rest}) == 1, "unequal batch counts across ranks"
    seen = Counter(k for rank in before + rest for batch in rank for k in batch)
    assert max(seen.values()) == 1
    missing = all_keys(COUNTS) - set(seen)
    assert len(missing) < after[0], "only the remainder (< world size) may be left out"


@pytest.mark.parametrize("after", [(1, 3), (3, 1)])
@pytest.mark.parametrize("stop", [1, 2, 3, 5])
def test_elastic_resume_inside_growing_windows_exactly_once(data, monkeypatch, after, stop):
    """Stopped while the streams' windows still grow (2, 4, 8, 16, then 40 samples)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    options = {"window": 40, "shuffle_start": 2}
    before, state = run_ranks(data, 2, 2, batches=stop, batch_size=3, **options)
    assert any(p not in (0, 2, 6, 14, 30) for p in state["positions"])  # inside a window
    rest, _ = run_ranks(data, *after, batches=None, state=state, batch_size=3, **options)
    assert len({len(b) for b in rest}) == 1, "unequal batch counts across ranks"
    seen = Counter(k for rank in before + rest for batch in rank for k in batch)
    assert max(seen.values()) == 1
    assert len(all_keys(COUNTS) - set(seen)) < after[0], "only the remainder may be left out"


def test_uneven_shards_equal_batches_on_every_rank(data, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    for world in (2, 3, 5):
        delivered, _ = run_ranks(data, world, 2, batches=None)
        assert len({len(b) for b in delivered}) == 1


def test_mismatched_state_is_refused(data, single_rank):
    loader = make(data)
    state = loader.state_dict()
    with pytest.raises(StateError, match="seed"):
        make(data, seed=99).load_state_dict(state)
    with pytest.raises(StateError, match="another dataset"):
        make(data, window=7).load_state_dict(state)
    for bad in ({}, {**state, "positions": [1]}, {**state, "epoch": "x"}, [1, 2],
                {**state, "batches": [0, -1]}):
        with pytest.raises(StateError):
            make(data).load_state_dict(bad)


def test_without_manifest_still_streams(tmp_path, single_rank):
    write_dataset(tmp_path, [6, 4, 5], manifest=False)
    ds = wdstream.StreamingDataset(str(tmp_path), seed=0)
    loader = wdstream.DataLoader(ds, batch_size=2, num_workers=2)
    flat = [k for b in keys_of(loader) for k in b]
    assert sorted(flat) == sorted(all_keys([6, 4, 5]))
    with pytest.raises(TypeError, match="manifest"):
        len(ds)
    brace = wdstream.StreamingDataset(str(tmp_path) + "/shard-{000000..000002}.tar", shuffle=False)
    assert len(list(brace)) == 15


def test_without_manifest_resume_is_exact_on_the_same_layout_and_refused_on_another(
        tmp_path, single_rank):
    """docs/resume.md's table: shards without a manifest resume exactly on the same workers
    (skipping by reading) and refuse a state saved with other workers."""
    write_dataset(tmp_path, [6, 4, 5, 7], manifest=False)

    def loader(workers):
        return wdstream.DataLoader(wdstream.StreamingDataset(str(tmp_path), seed=4),
                                   batch_size=2, num_workers=workers)

    whole = batch_keys(loader(2))
    first = loader(2)
    head = take(first, 3)
    state = json.loads(json.dumps(first.state_dict()))
    same = loader(2)
    same.load_state_dict(state)
    assert head + batch_keys(same) == whole
    other = loader(1)
    with pytest.raises(StateError, match="another layout needs a manifest"):
        other.load_state_dict(state)
        list(other)


@pytest.mark.parametrize("size", [300_000, 40_000])
@pytest.mark.parametrize("map_files", [True, False], ids=["mapped", "read"])
def test_large_binary_members_cross_workers_intact(tmp_path, single_rank, monkeypatch,
                                                   map_files, size):
    """Large bytes members (from 32 KiB) reach the main process unchanged, as bytes, in
    batches and one sample at a time: mapped from the local file, or read into the worker's
    shared memory (as from a remote stream); small ones beside them (below 32 KiB) are read
    as they were."""
    import wdstream.stream.load.dataset
    import wdstream.stream.transfer.batching
    import wdstream.stream.transfer.shm as shm

    monkeypatch.setattr(wdstream.stream.load.dataset, "CAN_MAP_FILES", map_files)  # workers inherit it
    opened = []  # files the main process reads payloads from
    read = shm.WorkerFile.read
    monkeypatch.setattr(shm.WorkerFile, "read",
                        lambda self, bounds: opened.append(self.path) or read(self, bounds))
    shared = []  # payloads the main process copied out of shared memory or a mapped file
    unpack = wdstream.stream.transfer.batching._SharedBytes.unpack
    monkeypatch.setattr(wdstream.stream.transfer.batching._SharedBytes, "unpack",
                        lambda self: shared.extend(unpack(self)) or shared[-len(self):])
    payloads = {f"k{i:03d}": bytes([i]) * (size + i) for i in range(40)}
    payloads.update({f"s{i}": bytes([i]) * 1000 for i in range(3)})
    source = _binary_dataset(tmp_path, payloads)
    for batch_size in (4, None):
        loader = wdstream.DataLoader(wdstream.StreamingDataset(source), batch_size=batch_size,
                                     num_workers=2)
        got = {}
        for batch in loader:
            if batch_size is None:
                batch = {name: [value] for name, value in batch.items()}
            assert all(type(v) is bytes for v in batch["bin"])
            got.update(zip(batch["__key__"], batch["bin"], strict=True))
        assert got == payloads and not shm._kept
    assert bool(opened) == map_files
    large = sorted(len(v) for v in payloads.values() if len(v) >= 32 << 10)
    assert sorted(len(v) for v in shared if len(v) >= 32 << 10) == sorted(large * 2)


@pytest.mark.parametrize(("bytes_as", "tune_malloc", "tuned"), [
    ("bytes", True, True), ("bytes", False, False), ("tensor", True, False)])
def test_the_training_process_malloc_is_tuned_where_payloads_are_copied(
        tmp_path, single_rank, monkeypatch, bytes_as, tune_malloc, tuned):
    """Payloads copied from shared memory into ``bytes`` in the training process set its
    malloc once (``tune_malloc``); views (``bytes_as="tensor"``) copy nothing and leave it."""
    import wdstream.stream.load.loader

    calls = []
    monkeypatch.setattr(wdstream.stream.load.loader, "tune_allocator", lambda: calls.append(1))
    source = _binary_dataset(tmp_path, {f"k{i}": bytes([i]) * 50_000 for i in range(12)})
    loader = wdstream.DataLoader(wdstream.StreamingDataset(source), batch_size=4,
                                 num_workers=2, bytes_as=bytes_as, tune_malloc=tune_malloc)
    for _epoch in range(2):
        assert sum(len(batch["__key__"]) for batch in loader) == 12
    assert calls == ([1] if tuned else [])


@pytest.mark.slow
def test_tuned_malloc_spares_the_training_process_page_faults(tmp_path):
    """The effect itself, in a process of its own (glibc's settings are the process's): the
    training process faults in far fewer pages copying 1 MiB payloads once tuned."""
    payloads = {f"k{i:03d}": bytes([i]) * (1 << 20) for i in range(96)}
    source = _binary_dataset(tmp_path, payloads)
    script = f"""
import resource, sys
import wdstream, wdstream.stream.load.dataset
wdstream.stream.load.dataset.CAN_MAP_FILES = False  # read into shared memory, as from S3
faults = []
for tune in (False, True) if sys.argv[1] == "off-first" else (True,):
    loader = wdstream.DataLoader(wdstream.StreamingDataset({source!r}, shuffle=False),
                                 batch_size=4, num_workers=2, tune_malloc=tune)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for batch in loader:
        assert sum(v[0] for v in batch["bin"]) >= 0
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""
    result = subprocess.run([sys.executable, "-c", script, "off-first"], capture_output=True,
                            text=True, timeout=120, check=True)
    untuned, tuned = (int(v) for v in result.stdout.split())
    # 96 MiB copied, 24,576 pages: about 18,000 faulted in untuned, 5,000 once tuned
    assert untuned > 12_000 and tuned < untuned / 2, result.stdout


@pytest.mark.parametrize("odd", [0, 5], ids=["first-sample", "later-sample"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_samples_with_other_members_in_one_batch_name_the_sample(tmp_path, single_rank, odd,
                                                                 workers):
    """Shards from another tool whose samples do not all have the same members: the default
    collate names the shard and the sample rather than fail with a KeyError or drop a column
    unsaid (the odd sample lacking a member, or having one more)."""
    import hashlib
    import io

    from wdstream.errors import ShardError
    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar_writer import TarWriter

    for extra in (False, True):
        folder = tmp_path / f"extra-{extra}"
        folder.mkdir()
        buffer = io.BytesIO()
        writer = TarWriter(buffer)
        for i in range(8):
            writer.add(f"k{i}.txt", b"text")
            if (i == odd) != extra:  # the odd one out lacks it, or alone has it
                writer.add(f"k{i}.cls", b"1")
        writer.close()
        data = buffer.getvalue()
        (folder / "shard.tar").write_bytes(data)
        info = ShardInfo("shard.tar", 8, len(data), hashlib.sha256(data).hexdigest())
        (folder / "index.json").write_text(Manifest([info], ["txt", "cls"]).to_json())
        loader = wdstream.DataLoader(wdstream.StreamingDataset(str(folder), shuffle=False),
                                     batch_size=8, num_workers=workers)
        with pytest.raises(ShardError, match=r"shard\.tar: sample 'k\d' has the members "
                           r".*the default collate needs the same members"):
            list(loader)


def _binary_dataset(folder, payloads: dict[str, bytes]) -> str:
    import hashlib
    import io

    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar_writer import TarWriter

    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for key, payload in payloads.items():
        writer.add(f"{key}.bin", payload)
    writer.close()
    data = buffer.getvalue()
    (folder / "shard-000000.tar").write_bytes(data)
    info = ShardInfo("shard-000000.tar", len(payloads), len(data),
                     hashlib.sha256(data).hexdigest())
    (folder / "index.json").write_text(Manifest([info], ["bin"]).to_json())
    return str(folder)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_bytes_as_tensor_shares_memory_without_copies(tmp_path, single_rank, workers):
    """bytes_as="tensor": raw members arrive as uint8 tensors, large and small alike. Views
    held by the loop keep their buffer: a worker refills a pooled buffer only once released,
    so holding every batch (more than the pool's slots) leaves every value intact."""
    import torch

    payloads = {f"k{i:03d}": bytes([i]) * (200_000 + i) for i in range(40)}
    payloads["small"] = b"tiny"
    source = _binary_dataset(tmp_path, payloads)
    loader = wdstream.DataLoader(wdstream.StreamingDataset(source, shuffle=False), batch_size=2,
                                 num_workers=workers, bytes_as="tensor")
    held = [batch for batch in loader]
    got = {}
    for batch in held:
        assert all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in batch["bin"])
        got.update(zip(batch["__key__"], (v.numpy().tobytes() for v in batch["bin"]),
                       strict=True))
    assert got == payloads
    single = wdstream.DataLoader(wdstream.StreamingDataset(source, shuffle=False),
                                 batch_size=None, num_workers=workers, bytes_as="tensor")
    sample = next(iter(single))
    assert isinstance(sample["bin"], torch.Tensor) and bytes(sample["bin"].numpy()) == \
        payloads[sample["__key__"]]
    with pytest.raises(ValueError, match="bytes_as"):
        wdstream.DataLoader(wdstream.StreamingDataset(source), bytes_as="memoryview")


def test_bytes_as_tensor_reads_large_payloads_into_reused_shared_memory(tmp_path, single_rank,
                                                                       monkeypatch):
    """Under bytes_as="tensor", workers read large raw payloads straight into shared-memory
    segments (small ones here, so that many are used) and reuse a segment once nothing cut
    from it is alive in the worker and the loop has let go of its batches: batches held to
    the end keep their values (a payload held only as a view of another dtype too), every
    batch arrives intact, members with a decoder are decoded, and the main process unmaps every segment at the
    end."""
    import hashlib
    import io

    import wdstream.stream.load.dataset
    import wdstream.stream.transfer.shm as shm
    from wdstream.shards.manifest import Manifest, ShardInfo
    from wdstream.shards.tar_writer import TarWriter

    monkeypatch.setattr(shm.Arena, "SEGMENT", 1 << 20)  # the forked workers inherit these
    monkeypatch.setattr(shm.Arena, "KEEP", 2 << 20)
    # read as from a remote stream: local files are otherwise mapped, not read (next test)
    monkeypatch.setattr(wdstream.stream.load.dataset, "CAN_MAP_FILES", False)
    samples = {f"k{i:03d}": (bytes([i]) * (150_000 + 1000 * i), f"t{i}" * 70_000)
               for i in range(48)}
    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for key, (raw, text) in samples.items():
        writer.add(f"{key}.bin", raw)
        writer.add(f"{key}.txt", text.encode())
    writer.close()
    folder = tmp_path / "raw"
    folder.mkdir()
    data = buffer.getvalue()
    (folder / "shard-000000.tar").write_bytes(data)
    info = ShardInfo("shard-000000.tar", len(samples), len(data), hashlib.sha256(data).hexdigest())
    (folder / "index.json").write_text(Manifest([info], ["bin", "txt"]).to_json())

    # a shuffle window keeps 10 samples' spans alive in the worker while it yields them
    dataset = wdstream.StreamingDataset(str(folder), shuffle=True, shuffle_window=10)
    loader = wdstream.DataLoader(dataset, batch_size=3, num_workers=2, bytes_as="tensor")
    import torch

    held, segments_seen, keys, reinterpreted = [], set(), [], []
    for n, batch in enumerate(loader):
        segments_seen.update((worker, uid) for worker, kept in shm._kept.items() for uid in kept)
        for key, raw, text in zip(batch["__key__"], batch["bin"], batch["txt"], strict=True):
            assert bytes(raw.numpy()) == samples[key][0] and text == samples[key][1]
        keys += batch["__key__"]
        if n % 4 == 0:
            held.append(batch)  # the others are let go: their memory is used again
        elif n % 4 == 2:  # only a reinterpreting view of one payload is kept
            reinterpreted.append((batch["__key__"][0], batch["bin"][0].view(torch.int16)))
    assert sorted(keys) == sorted(samples)
    for key, view in reinterpreted:
        assert bytes(view.view(torch.uint8).numpy()) == samples[key][0]
    assert len(segments_seen) >= 6 and not shm._kept  # many segments, all unmapped now
    for batch in held:
        for key, raw in zip(batch["__key__"], batch["bin"], strict=True):
            assert bytes(raw.numpy()) == samples[key][0]


@pytest.mark.parametrize("workers", [0, 2])
def test_bytes_as_tensor_maps_large_payloads_of_local_files(tmp_path, single_rank, workers):
    """Under bytes_as="tensor", a worker leaves large payloads of local shards in the file and
    the main process maps them from the page cache: the tensors are views of the whole shard,
    copy-on-write (writing to one leaves the file as it was). Without workers, nothing is
    mapped (the reader reads them)."""
    import torch

    payloads = {f"k{i:02d}": bytes([i]) * (150_000 + i) for i in range(10)}
    source = _binary_dataset(tmp_path, payloads)
    shard = os.path.join(source, "shard-000000.tar")
    before = open(shard, "rb").read()
    loader = wdstream.DataLoader(wdstream.StreamingDataset(source, shuffle=False), batch_size=4,
                                 num_workers=workers, bytes_as="tensor")
    batches = list(loader)
    values = [v for batch in batches for v in batch["bin"]]
    keys = [k for batch in batches for k in batch["__key__"]]
    assert [bytes(v.numpy()) for v in values] == [payloads[k] for k in keys]
    mapped = [v.untyped_storage().nbytes() == len(before) for v in values]
    assert all(mapped) if workers else not any(mapped)
    values[0][:10] = 255
    assert open(shard, "rb").read() == before
    assert isinstance(values[0], torch.Tensor) and bytes(values[0][:10].numpy()) == b"\xff" * 10


def test_a_file_read_or_mapped_must_be_the_one_the_worker_read(tmp_path, monkeypatch):
    from wdstream.errors import StreamError
    from wdstream.stream.transfer.shm import WorkerFile

    path = tmp_path / "shard.tar"
    path.write_bytes(b"x" * 4096)
    status = os.stat(path)
    identity = (status.st_dev, status.st_ino)
    assert bytes(WorkerFile(str(path), identity, 4096).map()[:3].numpy()) == b"xxx"
    assert WorkerFile(str(path), identity, 4096).read([(1, 4), (4090, 4096)]) == [
        b"xxx", b"x" * 6]
    too_long = WorkerFile(str(path), identity, 8192)
    for use in (too_long.map, lambda: too_long.read([(0, 3)])):
        with pytest.raises(StreamError, match="shard.tar: replaced or truncated"):
            use()
    with pytest.raises(StreamError, match="shard.tar: truncated while being read"):
        WorkerFile(str(path), identity, 4096).read([(4000, 4100)])
    with monkeypatch.context() as patch:
        patch.setattr(os, "pread", lambda *args: (_ for _ in ()).throw(OSError(5, "I/O error")))
        with pytest.raises(StreamError, match=r"shard.tar: cannot read .*\(I/O error\)"):
            WorkerFile(str(path), identity, 4096).read([(0, 3)])
    replacement = tmp_path / "new.tar"
    replacement.write_bytes(b"y" * 4096)
    os.replace(replacement, path)
    with pytest.raises(StreamError, match="shard.tar: replaced or truncated"):
        WorkerFile(str(path), identity, 4096).map()
    path.unlink()
    with pytest.raises(StreamError, match="shard.tar: cannot open"):
        WorkerFile(str(path), identity, 4096).read([(0, 3)])


def test_payload_target_only_for_members_nothing_decodes(tmp_path, monkeypatch):
    """The reader is given a target in a worker under bytes_as="tensor" (the loader sets
    ``shared_payloads``), which takes members without a decoder, and none with a map."""
    import torch.utils.data

    from wdstream.stream.load.contract import IterationSpec
    from wdstream.stream.transfer.shm import FileSpan, SharedSpan

    source = _binary_dataset(tmp_path, {"k": b"x"})
    spec = IterationSpec(epoch=0, rank=0, world=1, workers=1, shared_payloads=True)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    target = wdstream.StreamingDataset(source)._payload_target(spec)
    span, memory = target("dir/k.bin", 200_000, None)  # from a remote stream: shared memory
    assert isinstance(span, SharedSpan) and len(memory) == 200_000
    region = ("/data/shard.tar", 1536, 10_000_000, 1, 2)  # in a local file: left there
    file_span, no_memory = target("dir/k.bin", 200_000, region)
    assert isinstance(file_span, FileSpan) and no_memory is None
    assert (file_span.path, file_span.offset, len(file_span)) == ("/data/shard.tar", 1536, 200_000)
    assert target("k.json", 200_000, None) is None and target("k.Txt", 200_000, region) is None
    assert wdstream.StreamingDataset(source, decode=False)._payload_target(spec)("k.json", 9,
                                                                               None)
    assert wdstream.StreamingDataset(source, map=dict)._payload_target(spec) is None
    unasked = IterationSpec(epoch=0, rank=0, world=1, workers=1)
    assert wdstream.StreamingDataset(source)._payload_target(unasked) is None


def test_elastic_resume_reads_each_shard_once(data, monkeypatch):
    """A shuffle window's leftovers are many short spans; they are read in one pass per
    shard, not one download per span."""
    import wdstream.stream.read.shard_reader as read

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    first = make(data, workers=2, window=20)
    take(first, 6)
    state = first.state_dict()
    opened = []
    real_open = read.open_read

    def counting_open(url, **kwargs):
        opened.append(url)
        return real_open(url, **kwargs)

    monkeypatch.setattr(read, "open_read", counting_open)
    resumed = make(data, workers=0, window=20)
    resumed.load_state_dict(state)
    keys_of(resumed)
    assert len(opened) == len(set(opened)) <= len(COUNTS)


@pytest.mark.parametrize("batch_size,drop_last", [(4, False), (7, True), (1, False)])
def test_batch_order_does_not_depend_on_fetch_sizes(data, single_rank, monkeypatch, batch_size,
                                                    drop_last):
    """Workers send several batches per transfer; the loader still hands out one batch per
    stream in turn, so the order (and what a state means) is that of one batch per fetch."""
    def run(fetch_samples):
        monkeypatch.setattr(wdstream.DataLoader, "FETCH_SAMPLES", fetch_samples)
        ds = wdstream.StreamingDataset(data, seed=5, shuffle_window=6)
        loader = wdstream.DataLoader(ds, batch_size=batch_size, num_workers=3,
                                     drop_last=drop_last)
        batches = keys_of(loader)
        assert len(batches) == len(loader)
        return batches

    one_batch_per_fetch = run(batch_size)
    assert run(64) == one_batch_per_fetch
    assert run(512) == one_batch_per_fetch
    if drop_last:
        assert all(len(b) == batch_size for b in one_batch_per_fetch)


def test_fetches_grow_and_stay_small_for_large_samples(tmp_path, single_rank):
    """Fetch sizes: one batch first (time to first batch), then more batches per fetch for
    small samples, never more than FETCH_BYTES of large ones."""
    write_dataset(tmp_path, [50])
    small = wdstream.DataLoader(wdstream.StreamingDataset(str(tmp_path)), batch_size=4,
                                num_workers=2)
    sizes = small._fetch_sizes()
    assert [len(next(sizes)) for _ in range(2)] == [4, 4]
    small._sample_bytes = (1000.0, 0.0)
    grown = [len(next(sizes)) for _ in range(20)]
    assert grown[-1] == wdstream.DataLoader.FETCH_SAMPLES and grown == sorted(grown)
    small._sample_bytes = (1 << 20, 0.0)  # 1 MiB samples: one batch of 4 per fetch
    assert {len(next(sizes)) for _ in range(4)} == {4}
    # 8 KiB a sample in shared memory (a row of 2,048 int32 tokens), 100 bytes pickled: a
    # fetch holds up to FETCH_SHARED_BYTES of them, here FETCH_SAMPLES
    small._sample_bytes = (100.0, 8192.0)
    assert [len(next(sizes)) for _ in range(20)][-1] == wdstream.DataLoader.FETCH_SAMPLES
    small._sample_bytes = (100.0, 1 << 20)  # 1 MiB in shared memory: 4 samples, one batch
    assert {len(next(sizes)) for _ in range(4)} == {4}


def test_a_batch_size_estimate_tells_pickled_bytes_from_shared_memory():
    import torch

    from wdstream.stream.transfer.batching import approximate_bytes

    batch = {"input_ids": torch.zeros((4, 8), dtype=torch.int32), "__key__": ["ab", "cd"],
             "json": [b"12345"] * 4}
    assert approximate_bytes(batch) == (2 * 2 + 4 * 5, 4 * 8 * 4)


@pytest.mark.skipif(not os.path.exists("/proc/sys/fs/pipe-max-size"), reason="Linux only")
def test_worker_result_pipe_holds_a_whole_fetch(data, single_rank):
    """The workers' result pipe is widened so that a fetch of small samples crosses in one
    write (where the system allows a pipe that large)."""
    import fcntl

    from wdstream.stream.transfer import torch_internals

    with open("/proc/sys/fs/pipe-max-size") as file:
        allowed = int(file.read()) >= torch_internals.PIPE_BYTES
    loader = make(data, workers=2)
    iterator = loader._get_iterator()
    try:
        size = fcntl.fcntl(iterator._worker_result_queue._reader.fileno(), fcntl.F_GETPIPE_SZ)
    finally:
        iterator._shutdown_workers()
    assert (size >= torch_internals.PIPE_BYTES) == allowed


def test_small_fetches_keep_more_in_flight(tmp_path, single_rank, monkeypatch):
    """Small batches: 4 fetches in flight per worker once the first fetch shows their size;
    large ones (a fetch over 1 MiB) and an explicit prefetch_factor keep torch's setting."""
    seen = []
    real = wdstream.DataLoader._prefetch_small_fetches

    def spy(self, iterator):
        real(self, iterator)
        seen.append(iterator._prefetch_factor)

    monkeypatch.setattr(wdstream.DataLoader, "_prefetch_small_fetches", spy)
    write_dataset(tmp_path / "small", [200, 200])
    small = wdstream.StreamingDataset(str(tmp_path / "small"), shuffle=False)
    keys_of(wdstream.DataLoader(small, batch_size=4, num_workers=2))
    assert seen == [4]
    keys_of(wdstream.DataLoader(small, batch_size=4, num_workers=2, prefetch_factor=3))
    assert seen == [4]  # not called: the user chose
    large = _binary_dataset(tmp_path, {f"k{i:03d}": bytes(300_000) for i in range(8)})
    keys_of(wdstream.DataLoader(wdstream.StreamingDataset(large), batch_size=2, num_workers=2))
    assert seen == [4, 2]
