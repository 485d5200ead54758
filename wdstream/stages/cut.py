"""The documents a layout change cuts: what ``PackedSequences`` does with the document each
stream was packing when the layout changed (elastic resume).

At the cut, a stream's next sequence starts ``offset`` tokens into a document (its position:
the inner position before that document and the offset). The new layout counts that
document as read by the old one -- the inner position one document further, computed
without reading (``advance``) -- and delivers its remaining tokens itself: each such
document is a *tail*, read again at its old position (one shuffle window, as any resume) by
one stream of the new layout, which packs its tokens from ``offset`` on before its own
documents. Tails go round the new layout's streams (tail i to global stream ``i % (world x
workers)``). A stream cut again while still packing its tails hands the rest on to the next
layout, so no token is trained on twice and none is lost at any cut.

When the inner position cannot be advanced without reading (a source that restarts at that
draw, a stage that is not a ``StreamingDataset`` or ``Mix`` of them),
or the document is not the sample right after the position (samples dropped in between by
``map`` or ``on_error="skip"``), the document is read again whole by the new layout, and
its first ``offset`` tokens come twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from wdstream.stages.base import cycle_epoch, inner_history, segment_entries
from wdstream.stream.plan import RANKS, STREAM_END, HistorySegment, is_count


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


def is_tail_marker(inner) -> bool:
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
        base, segments = inner_history(tuple(out), stage.extract)
        entries = segment_entries(segment)
        parsed = [[None if p in (0, STREAM_END) else stage._parse(p) for p in ranks]
                  for ranks in entries]
        passes = [p[1] for ranks in parsed for p in ranks if p is not None]
        current = min(passes, default=base)  # the pass the next segment continues
        workers = segment.workers
        new_tails: dict[int, list[Tail]] = {}
        rewritten = [list(ranks) for ranks in entries]
        for k, ranks in enumerate(parsed):
            for r, p in enumerate(ranks):
                if p is None:
                    continue
                sequences, cycle, inner, offset = p
                g = r * workers + k  # the stream's number over the job
                if is_tail_marker(inner):  # still packing its tails: the rest go on
                    carried = tails[g::segment.world * workers][inner[0]:]
                    if carried and offset:
                        carried[0] = _with_offset(carried[0], offset)
                    new_tails[g] = carried
                    rewritten[k][r] = [sequences, cycle, 0, 0, *entries[k][r][4:]]
                    continue
                if not offset or cycle != current:
                    continue
                inner_segments = segments if cycle == base else ()
                clock = stage.clock(tuple(out), segment.world, workers)
                if clock is not None:  # the stage it was drawn in, so many sequences ago
                    clock.at(sequences - stage._lag(entries[k][r]))
                after = advance(stage.dataset, inner, cycle_epoch(epoch, cycle), r,
                                segment.world, workers, k, inner_segments,
                                None if clock is None else clock.stage)
                if after is None:
                    continue
                new_tails[g] = [Tail(segment.world, workers, segment.batch_size, r, k, cycle,
                                     inner_segments, inner, after, offset, clock)]
                rewritten[k][r] = [sequences, cycle, after, 0, *entries[k][r][4:]]
        tails = [t for g in sorted(new_tails) for t in new_tails[g]]
        consumed = tuple({RANKS: ranks} if isinstance(raw, dict) else ranks[0]
                         for raw, ranks in zip(segment.consumed, rewritten, strict=True))
        out.append(HistorySegment(segment.world, segment.workers, segment.batch_size,
                                  consumed))
    return tuple(out), tails


def _with_offset(tail: Tail, offset: int) -> Tail:
    return Tail(tail.world, tail.workers, tail.batch_size, tail.rank, tail.stream, tail.cycle,
                tail.inner_history, tail.before, tail.after, offset, tail.clock)
