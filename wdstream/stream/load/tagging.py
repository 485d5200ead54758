"""The loader's collate wrapper, run in a worker on each fetch: it cuts the fetched items into
batches, collates each and tags it with the stream's position after it."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch.utils.data

from wdstream.stream.load.context import END_OF_STREAM, StreamContext, StreamFailure
from wdstream.stream.transfer.batching import collate, collate_fetch, share_raw


class TaggedCollate:
    """A fetch travels as one transfer of ``(stream, [(position, batch), ...], reader
    counters, stream ended, error that ended it)``. With ``batch_size=None`` a fetch is one
    sample.

    ``wdstream.DataLoader`` makes one for each iteration (``for_iteration``), with the
    iteration's ``rotation`` and the ``StreamContext`` it also gives the dataset, where the
    dataset's iterator keeps the position after each item (``trail``) and its readers'
    counters (``stats``)."""

    def __init__(self, collate_fn: Callable, workers: int, batch_size: int | None,
                 drop_last: bool, share_bytes: bool = False):
        self.share_bytes = share_bytes  # bytes_as="tensor": all bytes into shared memory
        # the default collate pools large bytes under "tensor", and decodes no JSON the
        # stream left for the main process
        self.default = collate_fn is collate
        self.collate_fn = collate_fn
        self.workers = workers
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rotation = 0
        self.context = StreamContext()

    def for_iteration(self, rotation: int, context: StreamContext) -> TaggedCollate:
        """This wrapper for one iteration: its first stream and the context of its streams."""
        tagger = copy.copy(self)
        tagger.rotation, tagger.context = rotation, context
        return tagger

    def __call__(self, samples):
        info = torch.utils.data.get_worker_info()
        stream = (self.rotation + (info.id if info is not None else 0)) % self.workers
        context = self.context
        trail = context.trail
        collate_fn = self._collate_and_share
        failure = None
        if self.batch_size is None:  # one sample per fetch
            if isinstance(samples, StreamFailure):
                failure, samples = samples.error, END_OF_STREAM
            ended = samples is END_OF_STREAM
            batches = [] if ended else [(trail[0], collate_fn(samples))]
            taken = 0 if ended else 1
        else:
            if samples and isinstance(samples[-1], StreamFailure):
                failure, samples = samples[-1].error, samples[:-1] + [END_OF_STREAM]
            ended = bool(samples) and samples[-1] is END_OF_STREAM
            if ended:
                samples = samples[:-1]
            size = self.batch_size
            stop = taken = len(samples)
            if self.drop_last or failure is not None:
                stop -= stop % size  # only a stream's last batch can be short
            batches = list(zip([trail[min(start + size, stop) - 1]
                                for start in range(0, stop, size)],
                               self._collated(samples[:stop], size), strict=True))
        del trail[:taken]  # the positions of these items; the dataset may have given more
        return stream, batches, context.stats.take(), ended, failure

    def _collated(self, samples: list, size: int) -> list:
        """The fetch's batches of ``size`` samples, each collated and shared; the default
        collate takes each member's column from the whole fetch at once."""
        if not self.default:
            return [self._collate_and_share(samples[start:start + size])
                    for start in range(0, len(samples), size)]
        names = self.context.json_names
        return [share_raw(batch, self.share_bytes, names)
                for batch in collate_fetch(samples, size, pooled=self.share_bytes,
                                           json_names=names)]

    def _collate_and_share(self, samples):
        names = self.context.json_names
        if self.default:
            return share_raw(collate(samples, pooled=self.share_bytes, arena_tensors=True,
                                     json_names=names),
                             self.share_bytes, names)
        return share_raw(self.collate_fn(samples), self.share_bytes, names)
