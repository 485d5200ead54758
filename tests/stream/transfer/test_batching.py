"""The worker side of batches: the shared-memory arena, its reuse and the batches cut from it."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers how tensors cross in shared memory

import wdstream.stream.transfer.batching as batching
import wdstream.stream.transfer.shm as shm


def _cross(value):
    """``value`` as the main process receives it from a DataLoader worker."""
    return pickle.loads(ForkingPickler.dumps(value))


def test_arena_reuses_a_segment_only_when_nothing_holds_it(monkeypatch):
    monkeypatch.setattr(shm.Arena, "SEGMENT", 1 << 20)
    monkeypatch.setattr(shm.Arena, "KEEP", 0)  # no idle segment kept but the one reused
    arena = shm.Arena()
    first = arena.cut(600_000)
    assert first.start == shm.MemorySegment.HOLDS and len(first) == 600_000
    assert first.segment.tensor.is_shared() and first.segment.live == 1
    second = arena.cut(600_000)  # does not fit the rest of the first segment
    assert second.segment is not first.segment
    segment = first.segment
    flag = segment.hold()  # a batch using it is with the main process
    del first
    third = arena.cut(600_000)  # the first segment: nothing alive here, but held
    assert third.segment not in (segment, second.segment)
    shm.release(segment.tensor, flag)
    fourth = arena.cut(600_000)
    assert fourth.segment is segment and fourth.start == shm.MemorySegment.HOLDS
    # once their spans go, the second segment is reused and the third kept: three segments
    # were in use at once, and no more are mapped
    reused, kept = second.segment, third.segment
    reused.sent = kept.sent = True
    del second, third
    fifth = arena.cut(600_000)
    assert fifth.segment is reused and not arena.dropped
    # a span larger than any segment: a segment of its size, and the idle ones beyond the
    # most ever in use (now this one and the two still cut from) let go; the main process,
    # which has them mapped, is told
    del fourth
    large = arena.cut(3 << 20)
    assert large.segment.capacity == shm.MemorySegment.HOLDS + (3 << 20)
    assert list(arena.dropped) == [kept.uid] and fifth.segment is reused


def _count_allocations(monkeypatch) -> list[int]:
    """The sizes of the segments arenas allocate from now on (as private memory)."""
    allocated: list[int] = []
    monkeypatch.setattr(shm, "allocate",
                        lambda n: allocated.append(n) or torch.zeros(n, dtype=torch.uint8))
    return allocated


def test_a_shuffle_window_of_payloads_reuses_its_segments(monkeypatch):
    """A window holds many payloads, then lets them all go: the next window is cut from the
    same segments, with no new shared memory (each new page costs more than the copy)."""
    monkeypatch.setattr(shm.Arena, "SEGMENT", 1 << 20)
    monkeypatch.setattr(shm.Arena, "KEEP", 2 << 20)
    allocated = _count_allocations(monkeypatch)
    arena = shm.Arena()
    window = [arena.cut(300_000) for _ in range(30)]  # 10 segments, more than KEEP (2)
    assert len(allocated) == 10
    for _ in range(3):
        window.clear()
        window = [arena.cut(300_000) for _ in range(30)]
    assert len(allocated) == 10 and not arena.dropped


def test_new_segments_start_small_and_double_up_to_the_segment_size(monkeypatch):
    """A worker's first segment is small (its first batch waits for it to be mapped); each
    new one is twice the last, up to SEGMENT; a span larger than that gets its own size."""
    monkeypatch.setattr(shm.Arena, "FIRST", 1 << 20)
    monkeypatch.setattr(shm.Arena, "SEGMENT", 4 << 20)
    allocated = _count_allocations(monkeypatch)
    arena = shm.Arena()
    held = [arena.cut(900_000) for _ in range(8)]  # each fills a 1 MiB segment's rest
    assert allocated[:4] == [1 << 20, 2 << 20, 4 << 20, 4 << 20]
    held.append(arena.cut(5 << 20))
    assert allocated[-1] == shm.MemorySegment.HOLDS + (5 << 20)
    assert all(size <= 4 << 20 for size in allocated[:-1])


def test_a_segment_holds_many_batches_and_reports_when_all_flags_are_raised():
    segment = shm.MemorySegment(shm.allocate(shm.MemorySegment.HOLDS + 64), uid=0)
    flags = [segment.hold() for _ in range(shm.MemorySegment.HOLDS)]
    assert sorted(flags) == list(range(shm.MemorySegment.HOLDS)) and segment.hold() == -1
    for flag in (700, 5):  # released out of order: the free ones are found
        shm.release(segment.tensor, flag)
    assert {segment.hold(), segment.hold()} == {5, 700} and segment.hold() == -1
    for flag in flags:
        shm.release(segment.tensor, flag)
    assert segment.idle()


def test_shared_bytes_from_spans_and_bytes_round_trip(monkeypatch):
    """In a worker: payloads already in the arena stay there, bytes are packed beside them;
    the main process gets the same values, as bytes or as views, and releases the segment."""
    monkeypatch.setattr(batching, "_in_worker", lambda: True)
    arena = shm.Arena()
    monkeypatch.setattr(batching, "arena", lambda: arena)
    span = arena.cut(300_000)
    span.memory()[:] = b"s" * 300_000
    values = [b"a" * 1000, span, b"", b"bc" * 500]
    expected = [b"a" * 1000, b"s" * 300_000, b"", b"bc" * 500]
    packed = batching._SharedBytes(values, pooled=True)
    segment = span.segment
    del span, values
    assert packed.holds == [0] and segment.array[: shm.MemorySegment.HOLDS].sum() == 1
    assert not segment.live  # the batch's spans are gone; its flag keeps the segment
    # what the main process receives: the segment by number after its first crossing
    received = _cross(packed)
    assert received.unpack() == expected
    assert segment.idle()  # copied out: the worker may use the memory again
    again = batching._SharedBytes([b"xyz"], pooled=True)
    state = again.__getstate__()
    assert state["sources"] == [("segment", segment.uid, None)]  # sent: no tensor this time
    views = _cross(again).views()
    assert bytes(views[0].numpy()) == b"xyz" and not segment.idle()
    del views
    assert segment.idle()  # the last view went: released
    shm.unmap_workers(list(shm._kept))
    unpooled = batching._SharedBytes(expected)  # the default: a fresh buffer, no flags
    assert unpooled.holds is None and unpooled.unpack() == expected


def test_a_batch_maps_only_the_parts_of_a_file_it_reads(tmp_path, monkeypatch):
    """A shuffled batch takes payloads from all over a shard: the main process reads those
    payloads where they lie, asking for no page ahead of its reads."""
    path = tmp_path / "shard.tar"
    data = bytes(range(256)) * (16 << 12)  # 16 MiB
    path.write_bytes(data)
    status = path.stat()
    region = (str(path), 0, status.st_size, status.st_dev, status.st_ino)
    mib = 1 << 20

    def span(offset, size=mib):
        return shm.FileSpan((region[0], offset, *region[2:]), size)

    monkeypatch.setattr(batching, "_in_worker", lambda: True)
    values = [span(12 * mib), span(0), span(mib), span(6 * mib, 1000)]
    received = _cross(batching._SharedBytes(values, pooled=True))
    advice = []  # every madvise a populate() would make, however it is imported
    monkeypatch.setattr(shm, "_madvise", lambda: lambda *args: advice.append(args))
    assert received.unpack() == [data[12 * mib: 13 * mib], data[:mib], data[mib: 2 * mib],
                                 data[6 * mib: 6 * mib + 1000]]
    assert advice == []  # no page mapped ahead: the reads fault in what they read


def _frozen(sample):
    import gc

    return {**sample, "frozen": gc.get_freeze_count()}


@pytest.mark.slow
def test_workers_keep_what_they_inherited_out_of_the_collector(tmp_path, single_rank):
    import gc

    import wdstream
    from tests.support.shard_data import write_dataset

    write_dataset(tmp_path, [20, 20])
    before = gc.get_freeze_count()
    loader = wdstream.DataLoader(wdstream.StreamingDataset(str(tmp_path), map=_frozen),
                                 batch_size=10, num_workers=2)
    counts = [count for batch in loader for count in batch["frozen"].tolist()]
    assert len(counts) == 40 and min(counts) > 1000  # torch's objects, the dataset...
    assert gc.get_freeze_count() == before  # the training process is left as it was
