"""``StreamContext``: what the stream a process iterates reports (reader counters, positions of
items not yet batched), made by ``wdstream.DataLoader`` once per iteration and handed to the
dataset and its collate wrapper, never kept in module globals; a dataset iterated on its own
makes its own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from wdstream.errors import WdstreamError
from wdstream.stream.read.shard_reader import ReadStats

# Under wdstream.DataLoader a stream ends with this marker, so that the batch carrying the
# stream's last samples (or an empty one after them) tells the loader the stream is done.
END_OF_STREAM = object()


class StreamFailure:
    """Under wdstream.DataLoader, the WdstreamError that ended a stream, as the stream's last
    item: it reaches the loader whole (its class and fields, not a worker's traceback text),
    after the batches before it and with the reader's counters (retries made before it)."""

    __slots__ = ("error",)

    def __init__(self, error: WdstreamError):
        self.error = error


class StreamContext:
    """One stream's reports while it is iterated.

    ``stats``: the counters its readers count into (retries, skipped shards and samples, stray
    members); the loader's collate wrapper sends what they gained with each fetch.
    ``position``: the position after the last item handed out (direct iteration; the
    dataset's torchdata ``state_dict()`` reads it). ``trail``: under the loader, the position
    after each item not yet batched; a worker's fetcher pulls a fetch's items and then
    collates, so the collate wrapper finds at its front the position after each of them.
    ``json_names``: the members whose JSON the stream's samples carry undecoded, for the
    default collate (``wdstream.stream.transfer.deferred``)."""

    __slots__ = ("stats", "position", "trail", "json_names")

    def __init__(self, position: object = 0):
        self.stats = ReadStats()
        self.position = position
        self.trail: list = []
        self.json_names: set[str] = set()

    def with_positions(self, chunks: Iterator[tuple[list, Sequence]]) -> Iterator[object]:
        """The items of ``(items, position after each)`` lists, keeping each position."""
        for items, positions in chunks:
            for item, position in zip(items, positions, strict=True):
                self.position = position
                yield item

    def with_trail(self, chunks: Iterator[tuple[list, Sequence]]) -> Iterator[object]:
        """``with_positions`` for wdstream.DataLoader: keeps the position after each item in
        the trail instead (the collate wrapper cuts a fetch into batches and tags each with its
        own position), and ends with ``END_OF_STREAM``, or a ``StreamFailure``. A list's
        positions join the trail before its items are handed out, so the trail may run ahead
        of the items taken; the collate wrapper takes from its front the positions of the
        items it was given."""
        extend = self.trail.extend
        try:
            for items, positions in chunks:
                extend(positions)
                yield from items
        except WdstreamError as error:
            yield StreamFailure(error)
            return
        yield END_OF_STREAM
