"""Hugging Face ``datasets``: ``to_iterable_dataset(ds, num_workers=W)`` gives a
``datasets.IterableDataset`` with one shard per wdstream stream of a world x ``W`` layout, so
each rank's worker reads what ``wdstream.DataLoader`` would give it; ``set_epoch``, the
usual transforms and ``state_dict()`` resume work. See docs/hf-datasets.md."""

from __future__ import annotations

import copy
from typing import Any

from datasets.iterable_dataset import _BaseExamplesIterable

from wdstream.stream.load.contract import IterationSpec, world_info


def to_iterable_dataset(dataset, *, num_workers: int = 1, world: int | None = None,
                        features=None, split=None):
    """A ``datasets.IterableDataset`` reading ``dataset`` with ``world * num_workers``
    shards, one per wdstream stream.

    Args:
        dataset (StreamingDataset | Mix | PackedSequences): what to read.
        num_workers (int, default 1): the DataLoader workers each rank will use (at least 1).
        world (int | None): the ranks the shards are laid out for; default the current world
            size.
        features (datasets.Features | None): the examples' features, if known.
        split (datasets.Split | str | None): the split the dataset says it is.
    """
    import datasets

    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, not {num_workers}")
    if world is None:
        world = world_info()[1]
    if world < 1:
        raise ValueError(f"world must be at least 1, not {world}")
    examples = _StreamExamples(dataset, world, num_workers, list(range(world * num_workers)))
    return datasets.IterableDataset(examples, info=datasets.DatasetInfo(features=features),
                                    split=split)


class _StreamExamples(_BaseExamplesIterable):
    """The examples of some wdstream streams, in order; a shard is one stream."""

    _state_dict: dict[str, Any] | None

    def __init__(self, dataset, world: int, workers: int, shards: list[int], epoch: int = 0):
        super().__init__()
        self.dataset = dataset
        self.world, self.workers = world, workers
        self.shards = shards
        self.epoch = epoch

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def _with(self, **changes) -> _StreamExamples:
        made = copy.copy(self)
        made._state_dict = None
        for key, value in changes.items():
            setattr(made, key, value)
        return made

    def shard_data_sources(self, num_shards: int, index: int, contiguous=True):
        picked = self.split_shard_indices_by_worker(num_shards, index, contiguous=contiguous)
        return self._with(shards=[self.shards[i] for i in picked])

    def shuffle_data_sources(self, generator):
        # The shards keep their order (so that ranks and workers keep their streams); the
        # generator, drawn from datasets' epoch (or a .shuffle seed), picks wdstream's order.
        draw = int(copy.deepcopy(generator).integers(1, 1 << 31))
        return self._with(epoch=(self.epoch * 1_000_003 + draw) % (1 << 31))

    def reshard_data_sources(self):
        return self  # a stream cannot be split further without changing its order

    def _init_state_dict(self) -> dict:
        self._state_dict = {"shard_idx": 0, "position": None, "type": "wdstream"}
        return self._state_dict

    def __iter__(self):
        state = self._state_dict
        first = state["shard_idx"] if state else 0
        for index in range(first, len(self.shards)):
            shard = self.shards[index]
            rank, stream = shard % self.world, shard // self.world
            spec = IterationSpec(epoch=self.epoch, rank=rank, world=self.world,
                                 workers=self.workers)
            start = state["position"] if state and state["position"] is not None else 0
            for item, position in self.dataset.positioned(spec, stream, start):
                if state:
                    state["position"] = position
                yield f"{shard}:{position}", item
            if state:
                state["shard_idx"] += 1
                state["position"] = None
