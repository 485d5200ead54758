"""SFT sample packing, streamed (``sample_packing: true`` with ``datasets:``): prompt-formatted
examples packed into rows of at most ``sequence_len`` tokens, as axolotl's multipack does, by
first-fit decreasing over a buffer of records read in a row. A position is ``[rows, inner
position before the buffer, rows of the buffer delivered, inner position after it]``: a
resume reads the buffer again from its start and packs it again (a pure function of the
records), then skips the rows delivered, so it goes on token for token. On another layout
(elastic resume) the records each stream read count as read, a buffer cut part-delivered is
read again by one stream of the new layout, which delivers its other rows first, and the
inner dataset lays the records not yet read over the new layout: no example twice, none
lost. The rows of a pass depend on the examples' lengths (no counts, so no equal rows per
rank)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from wdstream.errors import InputError, StateError, UnsizedError
from wdstream.stages.base import Stage, StageOptions, inner_history, segment_entries
from wdstream.stages.cut import is_tail_marker
from wdstream.stream.load.contract import IterationSpec
from wdstream.stream.load.ranks import rank_position
from wdstream.stream.plan.epoch import STREAM_END, HistorySegment

EXCESS = ("drop", "truncate")


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of indices of ``lengths`` (each at most ``capacity``): the longest first, each
    into the first bin with room, ties in index order; bins in the order they were opened,
    each's indices in the order placed."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    room: list[int] = []
    bins: list[list[int]] = []
    for index in order:
        size = lengths[index]
        for b, left in enumerate(room):
            if left >= size:
                room[b] -= size
                bins[b].append(index)
                break
        else:
            room.append(capacity - size)
            bins.append([index])
    return bins


class PackedExamples(Stage):
    """Rows packed from the records of ``dataset``, each formatted by ``make_examples(record)``
    into its examples, dicts of token lists (``input_ids``, ``labels``...): none (a record a
    format filters out), one, or several (a long text a format splits). Each item is a row:
    the list of its examples, each with ``position_ids`` restarting at 0 (axolotl's packed
    collator joins them).

    Args:
        dataset: a ``StreamingDataset`` or ``Mix``.
        make_examples: ``record -> list[dict]``, run in the DataLoader workers.
        seq_len (int): tokens per row, at most.
        buffer (int): records packed together (first-fit decreasing over their examples).
        excess (str): an example longer than ``seq_len`` is ``"drop"``ped or
            ``"truncate"``d to ``seq_len`` tokens.
        pack (bool): False: each example is a row of its own (unpacked SFT).
    """

    positions_per_rank = True
    counts_setting = "counts (the rows a pass packs depend on the examples' lengths)"
    # another layout resumes without counts: the new layout's streams read the records not
    # yet read (the inner dataset's plan), after the buffers the cut left part-delivered
    resumes_unsized = True

    def __init__(self, dataset, make_examples: Callable, seq_len: int, *, buffer: int = 1000,
                 excess: str = "drop", pack: bool = True, identity: str = ""):
        super().__init__()
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise InputError(f"sequence_len must be an integer >= 2, not {seq_len!r}")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise InputError(f"the packing buffer must be a positive integer, not {buffer!r}")
        if excess not in EXCESS:
            raise InputError(f"excess_length_strategy must be one of {', '.join(EXCESS)}, "
                             f"not {excess!r}")
        self.dataset, self.make_examples = dataset, make_examples
        self.seq_len, self.buffer, self.excess, self.pack = seq_len, buffer, excess, pack
        self.identity = identity  # what else shapes the examples (the formats, tokenizer)
        self.options = StageOptions(seed=dataset.options.seed)
        self.source = f"PackedExamples({dataset.source})"

    @property
    def has_counts(self) -> bool:
        return False

    def inner(self) -> list:
        return [self.dataset]

    def plan(self, epoch: int, world: int, workers: int,
             history: Sequence[HistorySegment] = ()):
        raise UnsizedError(f"{self.source}: the rows of a pass depend on the examples' "
                           "lengths; set max_steps")

    def fingerprint(self) -> str:
        settings = [self.dataset.fingerprint(), self.dataset.options.seed,
                    self.seq_len, self.buffer, self.excess, self.identity]
        text = json.dumps(settings if self.pack else [*settings, "unpacked"])
        return "packed-examples-" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def check_own(self, position) -> None:
        _parse(position)

    def extract(self, position, base) -> tuple:
        """(pass, inner position read) of a stream's position (``base.inner_history``): the
        records before its buffer, or, cut inside a buffer, the whole buffer (the rows it
        had left are a ``Cut`` the next layout delivers); a stream still delivering an
        earlier layout's cuts has read none of its own."""
        if position == 0:
            return base, 0
        if position == STREAM_END:
            return None, STREAM_END
        _rows, before, skip, after = _parse(position)
        if is_tail_marker(before):
            return base, 0
        return base, after if skip else before

    # ---- iteration ------------------------------------------------------------------------
    def examples(self, record) -> list[dict]:
        """A record's examples, with position ids, after the excess-length rule."""
        return fitted(self.make_examples(record), self.seq_len, self.excess)

    def packed(self, records) -> tuple[list[list], int, object]:
        """The rows of the next buffer of ``records`` (iterator of (record, position)): the
        examples of each, how many records were read, the inner position after them."""
        examples: list[dict] = []
        read, after = 0, None
        for record, position in records:
            read, after = read + 1, position
            examples += self.examples(record)
            if read == self.buffer:
                break
        if not self.pack:
            return [[example] for example in examples], read, after
        bins = first_fit_decreasing([len(e["input_ids"]) for e in examples], self.seq_len)
        return [[examples[i] for i in b] for b in bins], read, after

    def positioned(self, spec: IterationSpec, stream: int, start
                   ) -> Iterator[tuple[list, list]]:
        """Stream ``stream``'s rows from position ``start``, each with the position after it:
        first the rows of the buffers an earlier layout's cut left to it, then its own."""
        rows, before, skip, _after = _parse(rank_position(start, spec.rank))
        _base, segments = inner_history(spec.history, self.extract)
        streams = spec.world * spec.workers
        cuts = buffer_cuts(self, spec.history)[spec.rank * spec.workers + stream::streams]
        if start == 0 and cuts:
            before = [0]
        if is_tail_marker(before):
            for index in range(before[0], len(cuts)):
                for row, delivered in self.cut_rows(spec, cuts[index], skip):
                    rows += 1
                    yield row, [rows, [index + (delivered == 0)], delivered, 0]
                skip = 0
            before = 0
        inner = replace(spec, history=segments)
        records = self.dataset.positioned(inner, stream, before)
        while True:
            bins, read, after = self.packed(records)
            if not read:
                return  # the stream ended
            for k in range(skip, len(bins)):
                rows += 1
                done = k + 1 == len(bins)
                yield bins[k], [rows, after, 0, 0] if done else [rows, before, k + 1, after]
            before, skip = after, 0

    def cut_rows(self, spec: IterationSpec, cut: Cut, skip: int) -> Iterator[tuple[list, int]]:
        """The rows of a cut buffer not yet delivered (from ``skip``, at least the cut's),
        read again where the old layout's stream read it; each with the rows of the buffer
        delivered after it (0: all of them)."""
        old = IterationSpec(spec.epoch, cut.rank, cut.world, cut.workers, history=cut.history,
                            batch_size=cut.batch_size, context=spec.context)
        bins, _read, after = self.packed(self.dataset.positioned(old, cut.stream, cut.before))
        if after != cut.after:
            raise StateError(f"{self.source}: a buffer cut by the layout change reads "
                             f"otherwise on resume (its end at {after!r:.80}, not "
                             f"{cut.after!r:.80}): the data changed")
        for k in range(max(skip, cut.skip), len(bins)):
            yield bins[k], (k + 1) % len(bins)


@dataclass(frozen=True)
class Cut:
    """A buffer a layout change cut after ``skip`` of its rows: where the old layout's
    stream read it (its rank and stream, the inner segments before, the inner positions
    before and after it)."""

    world: int
    workers: int
    batch_size: int
    rank: int
    stream: int
    history: tuple
    before: object
    after: object
    skip: int


def buffer_cuts(stage: PackedExamples, history: Sequence[HistorySegment]) -> list[Cut]:
    """The buffers the last of the segments ``history`` left part-delivered, in the order of
    the streams over the job (a stream still delivering cuts of the segment before hands the
    rest on)."""
    cuts: list[Cut] = []
    for index, segment in enumerate(history):
        _base, before = inner_history(history[:index], stage.extract)
        found: dict[int, list[Cut]] = {}
        streams = segment.world * segment.workers
        for k, ranks in enumerate(segment_entries(segment)):
            for r, position in enumerate(ranks):
                if position in (0, STREAM_END):
                    continue
                _rows, start, skip, after = _parse(position)
                g = r * segment.workers + k
                if is_tail_marker(start):
                    left = cuts[g::streams][start[0]:]
                    if left and skip:
                        left[0] = replace(left[0], skip=skip)
                    found[g] = left
                elif skip:
                    found[g] = [Cut(segment.world, segment.workers, segment.batch_size, r, k,
                                    before, start, after, skip)]
        cuts = [cut for g in sorted(found) for cut in found[g]]
    return cuts


def fitted(examples: list[dict], seq_len: int, excess: str) -> list[dict]:
    """Examples with ``position_ids``, those longer than ``seq_len`` dropped or truncated
    (``excess``), empty ones dropped."""
    kept = []
    for example in examples:
        example = {key: list(value) for key, value in example.items()}
        length = len(example["input_ids"])
        if length == 0 or length > seq_len and excess == "drop":
            continue
        if length > seq_len:
            example = {key: value[:seq_len] for key, value in example.items()}
            length = seq_len
        example["position_ids"] = list(range(length))
        kept.append(example)
    return kept


def _parse(position) -> tuple[int, object, int, object]:
    """(rows delivered, inner position before the buffer or ``[cut]``, rows of the buffer
    delivered, inner position after it) of a position."""
    if position == 0:
        return 0, 0, 0, 0
    if not (isinstance(position, list) and len(position) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for v in (position[0], position[2]))):
        raise StateError(f"not a position of packed examples: {position!r:.200}")
    return position[0], position[1], position[2], position[3]


DEFAULT_BUFFER = 1000  # records packed together by default (wdstream: {packing_buffer: N})


def packed_examples(mix, config: dict, formats: dict, cfg) -> PackedExamples:
    """The ``datasets:`` mixture's records formatted by their entries' prompt formats, the
    rows ``val_set_size`` holds out left out, packed into ``sequence_len`` rows
    (``sample_packing: true``; else one example a row)."""
    return PackedExamples(mix, SourceFormats(formats, held_out_share(cfg), cfg.seed or 0),
                          cfg.sequence_len,
                          buffer=config.get("packing_buffer", DEFAULT_BUFFER)
                          if cfg.sample_packing else 1,
                          excess=(cfg.excess_length_strategy or "drop").lower(),
                          pack=bool(cfg.sample_packing),
                          identity=json.dumps([held_out_share(cfg), cfg.seed or 0]))


class SourceFormats:
    """A sample of a mixture formatted by its source's prompt format (``__source__``); with
    ``share`` (``val_set_size``), only the samples ``held_out`` says are ``held`` (the eval
    split) or not (training) give examples."""

    def __init__(self, formats: dict, share: float = 0.0, seed: int = 0, held: bool = False):
        self.formats, self.share, self.seed, self.held = formats, share, seed, held

    def __call__(self, sample: dict) -> list[dict]:
        from wdstream.integrations.axolotl import examples_of

        if self.share and held_out(sample, self.share, self.seed) != self.held:
            return []
        return [{key: example[key] for key in ("input_ids", "attention_mask", "labels")
                 if key in example}
                for example in examples_of(self.formats, sample)]


def held_out_share(cfg) -> float:
    return float(cfg.get("val_set_size") or 0.0)


def held_out(sample: dict, share: float, seed: int = 0) -> bool:
    """Whether ``val_set_size`` holds the sample out of training: a hash of its source and
    ``__key__`` (a file's name and row, a shard sample's key), read as a number in [0, 1),
    below ``share``. The same on every run, resume and layout."""
    text = f"{seed}\0{sample.get('__source__', '')}\0{sample['__key__']}"
    number = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return number / 2**64 < share


DEFAULT_EVAL_EXAMPLES = 1000  # held-out examples evaluated (wdstream: {eval_examples: N})


def eval_split(mix, config: dict, formats: dict, cfg):
    """The eval dataset of ``val_set_size``: the first ``eval_examples`` examples of the
    rows ``held_out`` sets apart, in the order of the mixture's first pass as one process
    reads it (the same on every rank), as a ``datasets.Dataset`` axolotl evaluates as its own
    (packed with ``eval_sample_packing``)."""
    import datasets

    make = SourceFormats(formats, held_out_share(cfg), cfg.seed or 0, held=True)
    limit = config.get("eval_examples", DEFAULT_EVAL_EXAMPLES)
    examples = first_examples(samples_of(mix), make, cfg, limit)
    if not examples:
        raise InputError(f"val_set_size: {cfg.val_set_size} holds out no example of the "
                         "datasets (too few rows): raise it, or set it to 0")
    return datasets.Dataset.from_list(examples)


def tests_split(mix, config: dict, formats: dict, cfg):
    """The eval dataset of ``test_datasets:`` entries (``mix``: their mixture, whose weights
    play no part): of each entry in turn, its first examples as one process reads its first
    pass (the same on every rank), ``eval_examples`` in all shared equally between the
    entries, as a ``datasets.Dataset`` axolotl evaluates at ``eval_steps``."""
    import datasets

    from wdstream.integrations.axolotl_checks import label_of

    make = SourceFormats(formats)
    each = max(config.get("eval_examples", DEFAULT_EVAL_EXAMPLES) // len(mix.datasets), 1)
    examples = []
    for index, (name, dataset) in enumerate(zip(mix.names, mix.datasets, strict=True)):
        found = first_examples(({**sample, "__source__": name} for sample in
                                samples_of(dataset)), make, cfg, each)
        if not found:
            raise InputError(f"{label_of('test_datasets', index, config['test_datasets'][index])}"
                             ": no example to evaluate (no rows, or none fits sequence_len)")
        examples += found
    return datasets.Dataset.from_list(examples)


def samples_of(dataset) -> Iterator[dict]:
    """The samples of a dataset's (or mixture's) first pass as one process reads it."""
    from wdstream.stream.load.context import StreamContext

    spec = IterationSpec(0, 0, 1, 1, context=StreamContext())
    return (sample for sample, _position in dataset.positioned(spec, 0, 0))


def first_examples(samples, make: Callable, cfg, limit: int) -> list[dict]:
    """The first ``limit`` examples ``make`` gives of ``samples``, after the excess-length
    rule."""
    excess = (cfg.excess_length_strategy or "drop").lower()
    examples: list[dict] = []
    for sample in samples:
        examples += fitted(make(sample), cfg.sequence_len, excess)
        if len(examples) >= limit:
            break
    return examples[:limit]


class PackedRows:
    """The collate function of ``PackedExamples``' rows, as axolotl's trainer makes a batch:
    packed (``sample_packing``), by its multipack collator
    (``V2BatchSamplerDataCollatorForSeq2Seq``: each row's examples joined, ``attention_mask``
    numbering them 1, 2...), else each row's one example by ``DataCollatorForSeq2Seq``; padded
    to the longest row, rounded up as axolotl's trainer builder rounds it (to
    ``sequence_len`` with ``pad_to_sequence_len``)."""

    def __init__(self, tokenizer, cfg):
        from axolotl.utils.collators import (
            DataCollatorForSeq2Seq,
            V2BatchSamplerDataCollatorForSeq2Seq,
        )

        self.pack = bool(cfg.sample_packing)
        made = V2BatchSamplerDataCollatorForSeq2Seq if self.pack else DataCollatorForSeq2Seq
        self.collator = made(tokenizer, padding=True, return_tensors="pt", **padding_of(cfg))

    def __call__(self, rows: list) -> dict:
        if not self.pack:
            return self.collator([row[0] for row in rows])
        return self.collator([[{key: np.asarray(value) for key, value in example.items()}
                               for example in row] for row in rows])


def padding_of(cfg) -> dict:
    """The collator's ``pad_to_multiple_of`` as axolotl's trainer builder sets it."""
    multiple = cfg.get("pad_to_multiple_of") or 64
    if cfg.get("pad_to_sequence_len"):
        return {"pad_to_multiple_of": multiple * math.ceil(cfg.sequence_len / multiple)}
    if cfg.get("pad_to_sequence_len") is None:
        return {"pad_to_multiple_of": multiple}
    return {}
