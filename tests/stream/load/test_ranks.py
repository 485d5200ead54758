"""Positions gathered from every rank (``wdstream.stream.load.ranks``)."""

from __future__ import annotations

import pytest

from wdstream.errors import StateError
from wdstream.stream.load import ranks


def test_a_gather_keeps_its_tensors_until_the_next(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        assert ranks.all_gather_json([[3, "end", None]], 1) == [[[3, "end", None]]]
        first = ranks._last_gather[:]
        assert ranks.all_gather_json({"a": 1}, 1) == [{"a": 1}]
        # freed by this thread when the next gather replaces them, never by the group's
        kept = ranks._last_gather
        assert len(kept) == 4 and not any(a is b for a, b in zip(kept, first, strict=True))
    finally:
        dist.destroy_process_group()


def test_a_position_without_this_rank_is_a_state_error():
    gathered = ranks.gather_positions([[1, 2]], 0, 2)  # no process group: rank 0's alone
    assert ranks.rank_position(gathered[0], 0) == [1, 2]
    with pytest.raises(StateError, match="no position for rank 1"):
        ranks.rank_position(gathered[0], 1)
