"""The worker side of batches: shared-memory buffers, their pool and its budget."""

from __future__ import annotations

import wdstream.batching as batching


def test_pool_reuses_released_buffers_within_its_budget(monkeypatch):
    monkeypatch.setattr(batching._BufferPool, "BUDGET", 3 << 20)
    pool = batching._BufferPool(shared=True)
    first, flags, slot = pool.take(1 << 20)
    assert slot == 0 and flags is pool.flags and first.is_shared()
    second, _, slot2 = pool.take(1 << 20)  # slot 0 still held by the main process
    assert slot2 == 1
    third, flags3, slot3 = pool.take(2 << 20)  # 1 + 1 + 2 MiB > 3 MiB: not kept
    assert flags3 is None and slot3 == -1 and third.numel() == 2 << 20
    batching._release_slot(flags, slot)
    again, _, slot4 = pool.take(1000)  # a smaller batch fits the released buffer
    assert slot4 == 0 and again.data_ptr() == first.data_ptr() and again.numel() == 1000
    plain, no_flags, _ = batching._BufferPool(shared=False).take(10)
    assert no_flags is None and not plain.is_shared()


def test_shared_bytes_round_trip_and_release(monkeypatch):
    pool = batching._BufferPool(shared=True)  # as in a DataLoader worker
    monkeypatch.setattr(batching, "_pool", lambda: pool)
    values = [b"a" * 300_000, b"", b"bc" * 1000]
    packed = batching._SharedBytes(values, pooled=True)
    flags, slot = packed.flags, packed.slot
    assert flags is not None and flags.numpy()[slot] == 1
    assert packed.unpack() == values
    assert flags.numpy()[slot] == 0  # copied out: the worker may refill it
    views = batching._SharedBytes(values, pooled=True).views()
    unpooled = batching._SharedBytes(values)  # the default: a fresh segment, nothing to release
    assert unpooled.flags is None and unpooled.unpack() == values
    assert [v.numpy().tobytes() for v in views] == values
