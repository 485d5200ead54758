"""``wdstream.PackedSequences``: documents tokenized (in the DataLoader workers) and packed into
sequences of exactly ``seq_len`` tokens. A position is ``[sequences, pass, inner position,
offset, tokens and documents per source]``: where the next sequence starts (the inner
position before its document, re-read on resume, and the token offset in it), so no partial
sequence is saved."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import cast

import numpy as np

from wdstream.errors import InputError, OptionTypeError, StateError, UnsizedError
from wdstream.options import CHOICES, choice
from wdstream.stages.base import (
    Stage,
    StageOptions,
    StagePlan,
    check_inner,
    fixed_plan,
    inner_history,
    remaining_items,
)
from wdstream.stages.cut import cut_history, is_tail_marker
from wdstream.stages.documents import Document, DocumentReader, field_name, field_value, where
from wdstream.stages.schedule import TokenClock
from wdstream.stream.load.contract import IterationSpec
from wdstream.stream.load.ranks import rank_entry, rank_position
from wdstream.stream.plan.epoch import STREAM_END, HistorySegment, is_count
from wdstream.write.tokenizer import Tokenizer

LONG_DOCUMENTS = CHOICES["long_documents"]


def _check_text_field(text_field) -> None:
    if not isinstance(text_field, str | Mapping) or (
            isinstance(text_field, Mapping)
            and not all(isinstance(v, str) for v in text_field.values())):
        raise OptionTypeError("PackedSequences: text_field must be a field name or a "
                              f"mapping {{source: field name}}, not {text_field!r:.80}")


def _epoch_sequences(sequences_per_epoch, tokens_per_epoch, seq_len: int) -> int | None:
    """Sequences per epoch, given as such or as a token budget (whole sequences of it)."""
    if sequences_per_epoch is not None and (
            isinstance(sequences_per_epoch, bool) or not isinstance(sequences_per_epoch, int)
            or sequences_per_epoch < 1):
        raise InputError("PackedSequences: sequences_per_epoch must be a positive integer, "
                         f"not {sequences_per_epoch!r}")
    if tokens_per_epoch is None:
        return sequences_per_epoch
    if sequences_per_epoch is not None:
        raise InputError("PackedSequences: give sequences_per_epoch or "
                         "tokens_per_epoch, not both")
    if isinstance(tokens_per_epoch, bool) or not isinstance(tokens_per_epoch, int) \
            or tokens_per_epoch < seq_len:
        raise InputError("PackedSequences: tokens_per_epoch must be an integer of at "
                         f"least seq_len ({seq_len}), not {tokens_per_epoch!r}")
    return tokens_per_epoch // seq_len


def _eos_id(eos, tokenizer) -> int:
    """The end-of-document token's id: ``eos`` itself, or a token string's id."""
    if isinstance(eos, str):
        if tokenizer is None:
            raise InputError(f"eos {eos!r}: a token string needs a tokenizer")
        eos = tokenizer.token_id(eos)
    if isinstance(eos, bool) or not isinstance(eos, int | np.integer) or eos < 0:
        raise InputError(f"PackedSequences: eos must be a token id >= 0 or a token string, "
                         f"not {eos!r}")
    return int(eos)


class PackedSequences(Stage):
    """Sequences of ``seq_len`` tokens packed from the documents of ``dataset``. Each item is
    a dict of int64 arrays of length ``seq_len``: ``input_ids``, ``labels`` (a copy: models
    shift them) and ``position_ids``, which restart at 0 at each document and each sequence
    start. Tokens left at the end of a stream (fewer than ``seq_len``) are dropped.

    Args:
        dataset: a ``StreamingDataset``, a ``Mix`` or another stage yielding documents.
        tokenizer (None, a ``tokenizer.json`` path or text, a ``tokenizers.Tokenizer`` or a
            callable ``str -> list[int]``): tokenizes ``str`` documents; integer arrays or
            lists (pre-tokenized data) are packed as they are.
        seq_len (int, default 2048): tokens per sequence, at least 2.
        eos (int | str): the end-of-document token appended to every document: an id, or a
            token string looked up in the tokenizer.
        text_field (str | dict, default "text"): the member or JSON field holding a
            document: ``"txt"`` (a member), ``"json.text"`` (a key of the ``json`` member) or
            a bare name (a member, then a key of ``json``); ``{source: field}`` per
            ``__source__`` of a ``Mix``.
        long_documents (str, default "split"): documents longer than ``seq_len`` are
            ``"split"`` across sequences, ``"truncate"``d (the last token EOS) or
            ``"drop"``ped.
        sequences_per_epoch (int | None): sequences per epoch, split over ranks and workers
            (the inner stream restarts on a new order when a pass runs out); without it the
            count depends on the text and ranks may get unequal counts: set it under DDP.
        tokens_per_epoch (int | None): the same as a token budget (``tokens_per_epoch //
            seq_len`` sequences).
    """

    def __init__(self, dataset, tokenizer=None, seq_len: int = 2048, *, eos: int | str,
                 text_field: str | Mapping[object, str] = "text", long_documents: str = "split",
                 sequences_per_epoch: int | None = None, tokens_per_epoch: int | None = None):
        super().__init__()
        if not hasattr(dataset, "positioned"):
            raise InputError(f"PackedSequences: {type(dataset).__name__} is not a wdstream "
                             "dataset or stage")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise InputError(f"PackedSequences: seq_len must be an integer >= 2, not {seq_len!r}")
        choice("PackedSequences", "long_documents", long_documents)
        _check_text_field(text_field)
        self.dataset = dataset
        self.seq_len = seq_len
        self.sequences_per_epoch = _epoch_sequences(sequences_per_epoch, tokens_per_epoch,
                                                    seq_len)
        self.tokenizer = Tokenizer(tokenizer) if tokenizer is not None else None
        self.eos = _eos_id(eos, self.tokenizer)
        self.text_field = dict(text_field) if isinstance(text_field, Mapping) else text_field
        self.long_documents = long_documents
        self.options = StageOptions(seed=dataset.options.seed)
        self.source = f"PackedSequences({dataset.source})"

    # ---- sizes and identity ---------------------------------------------------------------
    # the documents a stream has packed depend on their lengths, so on the rank
    positions_per_rank = True

    @property
    def has_counts(self) -> bool:
        return self.sequences_per_epoch is not None

    # what gives the stage its sizes when has_counts is False (named in a refused resume)
    counts_setting = ("sequences_per_epoch or tokens_per_epoch (how many sequences an epoch "
                      "packs depends on the text)")

    def inner(self) -> list:
        return [self.dataset]

    def plan(self, epoch: int, world: int, workers: int,
             history: Sequence[HistorySegment] = ()) -> StagePlan:
        """Sequences per stream of every rank: known only with ``sequences_per_epoch``."""
        if self.sequences_per_epoch is None:
            raise UnsizedError(f"{self.source}: sequences per epoch depend on the text; set "
                               "sequences_per_epoch for a known length")
        return fixed_plan(self._quota(history), world, workers)

    def _quota(self, history: Sequence[HistorySegment]) -> int:
        """The sequences of the epoch not delivered in the segments ``history``."""
        total = cast(int, self.sequences_per_epoch)  # both callers checked it is not None
        return remaining_items(total, history,
                               lambda position: self._parse(position)[0])

    def extract(self, position, base) -> tuple:
        """(pass, inner position read) of a stream's position (see ``base.inner_history``):
        the inner dataset counts as read up to the document its next sequence starts in
        (past it when the next layout delivers its rest itself, ``wdstream.stages.cut``)."""
        if position == 0:
            return base, 0
        if position == STREAM_END:
            return None, STREAM_END
        _sequences, cycle, before, _offset = self._parse(position)
        return cycle, before

    def fingerprint(self) -> str:
        """The inner dataset's and everything that shapes the sequences."""
        fields: object = self.text_field
        if isinstance(self.text_field, dict):
            fields = sorted((str(k), v) for k, v in self.text_field.items())
        text = json.dumps([self.dataset.fingerprint(), self.dataset.options.seed,
                           self.tokenizer.identity if self.tokenizer else None, self.eos,
                           self.seq_len, fields, self.long_documents, self.sequences_per_epoch])
        return "packed-" + hashlib.sha256(text.encode()).hexdigest()[:16]

    # ---- documents ------------------------------------------------------------------------
    def tokens(self, sample) -> np.ndarray | None:
        """A document's tokens with EOS, after the long-document rule (None: dropped)."""
        value = field_value(self.text_field, sample)
        if isinstance(value, str):
            if self.tokenizer is None:
                raise InputError(f"{where(sample)}: text found but no tokenizer given")
            ids = self.tokenizer(value)
        else:
            ids = np.asarray(value)
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise InputError(f"{where(sample)}: field {field_name(self.text_field, sample)!r} holds "
                                 f"neither text nor a 1-d array of token ids")
            ids = ids.astype(np.int64, copy=False)
        tokens = np.empty(len(ids) + 1, dtype=np.int64)
        tokens[:-1] = ids
        tokens[-1] = self.eos
        if len(tokens) > self.seq_len:
            if self.long_documents == "drop":
                return None
            if self.long_documents == "truncate":
                tokens = np.concatenate([tokens[: self.seq_len - 1], tokens[-1:]])
        return tokens

    # ---- iteration ------------------------------------------------------------------------
    def positioned(self, spec: IterationSpec, stream: int, start
                   ) -> Iterator[tuple[dict, list]]:
        """Stream ``stream``'s sequences from position ``start`` (0, or a position this method
        yielded), each with the position after it."""
        start = rank_position(start, spec.rank)
        sequences, cycle, inner_start, offset = self._parse(start)
        # per source: tokens delivered, documents delivered to their end (this segment)
        tally = self.tally(start)
        history, tails = cut_history(self, spec.epoch, spec.history)
        base, inner_segments = inner_history(history, self.extract)
        tails = tails[spec.rank * spec.workers + stream::spec.world * spec.workers]
        if start == 0:
            cycle = base
        quota = None
        if self.sequences_per_epoch is not None:
            quota = self.plan(spec.epoch, spec.world, spec.workers,
                              spec.history).stream_samples[stream]
        clock = self.clock(spec.history, spec.world, spec.workers)
        if clock is not None:
            # the document the next sequence starts in was drawn that many sequences ago
            clock.at(sequences - self._lag(start))
        documents = DocumentReader(self, spec, stream, cycle, inner_start, offset,
                                   restart=quota is not None, history=(base, inner_segments),
                                   clock=clock, tails=tails)
        queue: deque[Document] = deque()
        available = 0
        seq_len = self.seq_len
        ramp = np.arange(seq_len, dtype=np.int64)
        while quota is None or sequences < quota:
            while available < seq_len:
                document = documents.next()
                if document is None:
                    return  # the stream's last tokens make no whole sequence: dropped
                if clock is not None:
                    document.pulled = clock.sequences
                    clock.at(sequences)
                queue.append(document)
                available += len(document.tokens) - document.taken
            input_ids = np.empty(seq_len, dtype=np.int64)
            position_ids = np.empty(seq_len, dtype=np.int64)
            filled = 0
            while filled < seq_len:
                document = queue[0]
                n = min(seq_len - filled, len(document.tokens) - document.taken)
                input_ids[filled:filled + n] = document.tokens[document.taken:document.taken + n]
                position_ids[filled:filled + n] = ramp[:n]
                filled += n
                document.taken += n
                tally[document.source] += n
                if document.taken == len(document.tokens):
                    tally[document.source + 1] += 1
                    queue.popleft()
            available -= seq_len
            sequences += 1
            if queue:  # the next sequence starts inside a document already read
                head = queue[0]
                position = [sequences, head.cycle, head.before, head.taken, *tally]
            else:  # ... or at the next document to be read
                head = None
                position = [sequences, documents.cycle, documents.before, 0, *tally]
            if clock is not None:
                clock.at(sequences)
                position.append(sequences - head.pulled if head is not None else 0)
            yield ({"input_ids": input_ids, "labels": input_ids.copy(),
                    "position_ids": position_ids}, position)

    def clock(self, history, world: int, workers: int) -> TokenClock | None:
        """A stream's clock for a mixture whose schedule counts tokens (else None), after
        the segments ``history``: the tokens they delivered, then seq_len x world x workers a
        sequence."""
        if not getattr(self.dataset, "by_tokens", False):
            return None
        delivered = 0 if self.sequences_per_epoch is None else \
            self.sequences_per_epoch - self._quota(history)
        return TokenClock(self.dataset.schedule, delivered * self.seq_len,
                          self.seq_len * world * workers)

    def _lag(self, position) -> int:
        """By tokens: how many sequences before the position its head document was drawn
        (the last entry of the position)."""
        return position[-1] if position != 0 and len(position) == 5 + 2 * len(self.names) else 0

    def _parse(self, start) -> tuple[int, int, object, int]:
        if start == 0:
            return 0, 0, 0, 0
        tallied = 4 + 2 * len(self.names)
        length = tallied + getattr(self.dataset, "by_tokens", False)  # by tokens: the lag
        try:
            sequences, cycle, inner, offset = start[:4]
            valid = isinstance(start, list) and len(start) == length \
                and all(is_count(v) for v in (sequences, cycle, offset, *start[4:])) \
                and (len(start) <= tallied or start[-1] <= sequences)
        except (TypeError, ValueError):
            valid = False
        if not valid:
            raise StateError(f"not a position of this packing stage: {start!r:.200}")
        return sequences, cycle, inner, offset

    def check_own(self, position) -> None:
        """A position of this stage, with an inner one its dataset can start from."""
        _sequences, _cycle, inner, _offset = self._parse(position)
        if not is_tail_marker(inner):
            check_inner(self.dataset, inner)

    @property
    def names(self) -> list[str]:
        """The sources counted apart: a ``Mix``'s names, else the one dataset's."""
        return list(getattr(self.dataset, "names", None) or [str(self.dataset.source)])

    def tally(self, position) -> list[int]:
        """[tokens, documents] of each source, from a position."""
        if position == 0:
            return [0] * (2 * len(self.names))
        return list(position[4:4 + 2 * len(self.names)])

    def accounting(self, positions, history, rank: int) -> dict:
        """Per source, this rank's tokens and documents (delivered to their end) in the
        epoch's sequences (on earlier layouts: what the rank of the same number delivered),
        and the pass of the inner stream in progress (1 and up: it restarted)."""
        totals = [0] * (2 * len(self.names))
        deepest = 0
        entries = [rank_entry(v, rank) for s in history for v in s.consumed]
        current = [rank_entry(p, rank) for p in positions]
        for index, position in enumerate(entries + current):
            if not position or position == STREAM_END:
                continue
            totals = [a + b for a, b in zip(totals, self.tally(position), strict=True)]
            if index >= len(entries):
                deepest = max(deepest, self._parse(position)[1])
        return {name: {"tokens": totals[2 * i], "documents": totals[2 * i + 1],
                       "pass": deepest} for i, name in enumerate(self.names)}
