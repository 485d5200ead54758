"""The documents a layout change cuts (elastic resume of ``PackedSequences``): the new layout
counts each document a stream was packing as read, computing the inner position after it
without reading (``advance``), and delivers the rest of its tokens itself as a *tail*, re-read
at its old position by one of its streams (tail i to stream ``i % (world x workers)``), so
no token is trained on twice or lost. Where the position after it cannot be told, the
document is read again whole and its first ``offset`` tokens come twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from wdstream.stages.base import cycle_epoch, inner_history, segment_entries
from wdstream.stream.plan.epoch import RANKS, STREAM_END, HistorySegment, is_count


@dataclass(frozen=True)
class Tail:
    """A document cut by a layout change: where it is (the old layout's inner stream and the
    position before it, the inner position after it) and the tokens of it already packed."""

    world: int
    workers: int
    batch_size: int
    rank: int
    stream: int
    cycle: int
    inner_history: tuple  # the inner segments of its pass before the segment that read it
    before: object
    after: object
    offset: int
    clock: object = None  # a schedule by tokens: the old stream's clock when it was drawn


def is_tail_marker(inner) -> TypeGuard[list[int]]:
    """A packing position's inner position ``[t]``: the stream was at its tail ``t``."""
    return isinstance(inner, list) and len(inner) == 1 and is_count(inner[0])


def advance(dataset, position, epoch: int, rank: int, world: int, workers: int, stream: int,
            history, stage: int | None = None) -> object | None:
    """The inner position one document after ``position``, without reading; None when that
    cannot be told. ``stage``: under a schedule by tokens, the stage it was drawn in."""
    if isinstance(position, int) and not isinstance(position, bool) and \
            hasattr(dataset, "shards"):  # a StreamingDataset: samples consumed in the stream
        return position + 1
    step = getattr(dataset, "advance", None)
    if step is None or position == STREAM_END:
        return None
    return step(position, epoch, world, workers, stream, history, stage)


def cut_history(stage, epoch: int, history) -> tuple[tuple[HistorySegment, ...], list[Tail]]:
    """``history`` (a packing stage's segments) with each cut document counted as read, and
    the tails the segment after it delivers, in order."""
    out: list[HistorySegment] = []
    tails: list[Tail] = []
    for segment in history:
        cut, tails = _cut_segment(stage, epoch, tuple(out), segment, tails)
        out.append(cut)
    return tuple(out), tails


def _cut_segment(stage, epoch: int, before: tuple, segment: HistorySegment,
                 tails: list[Tail]) -> tuple[HistorySegment, list[Tail]]:
    """``segment`` (after the segments ``before``, which left ``tails``) with its cut
    documents counted as read, and the tails the segment after it delivers."""
    base, segments = inner_history(before, stage.extract)
    entries = segment_entries(segment)
    parsed, current = _parsed(stage, entries, base)
    new_tails: dict[int, list[Tail]] = {}
    rewritten = [list(ranks) for ranks in entries]
    for k, ranks in enumerate(parsed):
        for r, p in enumerate(ranks):
            if p is None:
                continue
            g = r * segment.workers + k  # the stream's number over the job
            sequences, cycle, inner, offset = p
            if is_tail_marker(inner):  # still packing its tails: the rest go on
                new_tails[g] = _carried(tails[g::segment.world * segment.workers], inner, offset)
                rewritten[k][r] = [sequences, cycle, 0, 0, *entries[k][r][4:]]
            elif offset and cycle == current:
                tail = _cut_document(stage, epoch, before, segment, r, k, p, entries[k][r],
                                     segments if cycle == base else ())
                if tail is not None:
                    new_tails[g] = [tail]
                    rewritten[k][r] = [sequences, cycle, tail.after, 0, *entries[k][r][4:]]
    consumed = tuple({RANKS: ranks} if isinstance(raw, dict) else ranks[0]
                     for raw, ranks in zip(segment.consumed, rewritten, strict=True))
    return (HistorySegment(segment.world, segment.workers, segment.batch_size, consumed),
            [t for g in sorted(new_tails) for t in new_tails[g]])


def _parsed(stage, entries: list[list], base: int) -> tuple[list[list], int]:
    """The entries' positions parsed (None where a stream had not started or had ended), and
    the pass the next segment continues."""
    parsed = [[None if p in (0, STREAM_END) else stage._parse(p) for p in ranks]
              for ranks in entries]
    passes = [p[1] for ranks in parsed for p in ranks if p is not None]
    return parsed, min(passes, default=base)


def _carried(stream_tails: list[Tail], inner: list, offset: int) -> list[Tail]:
    """The tails a stream still packing them (at tail ``inner[0]``, ``offset`` tokens into
    it) hands on."""
    carried = stream_tails[inner[0]:]
    if carried and offset:
        carried[0] = _with_offset(carried[0], offset)
    return carried


def _cut_document(stage, epoch: int, before: tuple, segment: HistorySegment, rank: int,
                  stream: int, parsed: tuple, entry: list, inner_segments: tuple) -> Tail | None:
    """The tail of the document stream ``stream`` of ``rank`` was packing when ``segment``
    ended, or None when the inner position after it cannot be told without reading."""
    sequences, cycle, inner, offset = parsed
    clock = stage.clock(before, segment.world, segment.workers)
    if clock is not None:  # the stage it was drawn in, so many sequences ago
        clock.at(sequences - stage._lag(entry))
    after = advance(stage.dataset, inner, cycle_epoch(epoch, cycle), rank, segment.world,
                    segment.workers, stream, inner_segments,
                    None if clock is None else clock.stage)
    if after is None:
        return None
    return Tail(segment.world, segment.workers, segment.batch_size, rank, stream, cycle,
                inner_segments, inner, after, offset, clock)


def _with_offset(tail: Tail, offset: int) -> Tail:
    return Tail(tail.world, tail.workers, tail.batch_size, tail.rank, tail.stream, tail.cycle,
                tail.inner_history, tail.before, tail.after, offset, tail.clock)
