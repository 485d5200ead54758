"""Which source each draw of a ``Mix`` stream takes: blocks of ``BLOCK`` draws whose counts
per source are the weights times ``BLOCK`` (the fractional seats by systematic sampling, so
a block is within one draw of the weights and their expectation is exact), in an order
shuffled by a generator seeded with (seed, epoch, stream, block[, segment]). A pure
function of those words: resuming at draw n computes one block, with no replay."""

from __future__ import annotations

import numpy as np

from wdstream.stream.plan.epoch import generator

BLOCK = 1024  # draws per block of choices: the unit of exact proportions and of resume cost
_MIX_CHOICES = 101  # domain tag: keeps these draws apart from the plan's own generators
_TOKEN_STAGE_CHOICES = 102


def _block_counts(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """How many of a block's draws go to each source: the weights' share, the fractional
    seats by systematic sampling (source i gets one more with probability frac_i exactly)."""
    quota = weights * BLOCK
    counts = np.floor(quota).astype(np.int64)
    seats = BLOCK - int(counts.sum())
    if seats:
        edges = np.cumsum(quota - counts)
        points = rng.random() + np.arange(seats)
        picks = np.minimum(np.searchsorted(edges, points, side="right"), len(weights) - 1)
        counts += np.bincount(picks, minlength=len(weights))
    return counts


def _block_generator(seed: int, epoch: int, stream: int, block: int, segment: int,
                     stage: int | None = None):
    if stage is not None:  # a schedule by tokens: blocks counted within each stage
        return generator(_TOKEN_STAGE_CHOICES, seed, epoch, stream, block, segment, stage)
    # segment 0 (no layout change yet) keeps the words it always had
    words = (seed, epoch, stream, block) + ((segment,) if segment else ())
    return generator(_MIX_CHOICES, *words)


def block_counts(weights: np.ndarray, seed: int, epoch: int, stream: int, block: int,
                 segment: int = 0) -> np.ndarray:
    """The draws of each source in block ``block`` (without computing their order)."""
    return _block_counts(weights, _block_generator(seed, epoch, stream, block, segment))


def block_choices(weights: np.ndarray, seed: int, epoch: int, stream: int, block: int,
                  segment: int = 0, stage: int | None = None) -> np.ndarray:
    """The source index of each of the ``BLOCK`` draws of block ``block`` (of stage
    ``stage`` of a schedule by tokens)."""
    rng = _block_generator(seed, epoch, stream, block, segment, stage)
    choices = np.repeat(np.arange(len(weights)), _block_counts(weights, rng))
    rng.shuffle(choices)
    return choices


def stream_length(sizes: np.ndarray, stop: str, active: np.ndarray, block_weights,
                  seed: int, epoch: int, stream: int, segment: int = 0) -> int:
    """Draws a stream makes before it stops under ``stop`` (``first_exhausted`` or
    ``cycle``), given each source's stream size and which sources count (``active``): the
    rules of ``Mix.positioned`` computed from counts alone. Blocks before the one where the
    stream stops need only their counts; that block's order then gives the exact draw."""
    before = np.zeros(len(sizes), dtype=np.int64)  # draws of each source in earlier blocks
    block = 0
    while True:
        weights = block_weights(block)
        after = before + block_counts(weights, seed, epoch, stream, block, segment)
        if stop == "first_exhausted":
            # the draw that finds a source empty (its size + 1-th) ends the stream
            ending = np.flatnonzero(active & (after > sizes))
        else:  # cycle: the draw that reads the last source's last sample ends it
            ending = np.flatnonzero(active & (before < sizes) & (after >= sizes))
            if not np.all(after[active] >= sizes[active]):
                ending = ending[:0]
        if len(ending):
            choices = block_choices(weights, seed, epoch, stream, block, segment)
            draws = [int(np.flatnonzero(choices == source)[sizes[source] - before[source]
                                                           - (stop == "cycle")])
                     for source in ending]
            if stop == "first_exhausted":
                return block * BLOCK + min(draws)
            return block * BLOCK + max(draws) + 1
        if stop == "cycle" and np.all(sizes[active] <= 0):
            return 0  # every source empty: ended before the first draw
        before = after
        block += 1
