"""The documents a ``PackedSequences`` stream packs: its inner stream read document by
document from a position, each document's tokens with EOS, and the tokens of it already
packed."""

from __future__ import annotations

from typing import cast

import numpy as np

from wdstream.errors import InputError, StateError
from wdstream.stages.base import cycle_epoch
from wdstream.stages.cut import is_tail_marker
from wdstream.stream.load.contract import IterationSpec


class Document:
    __slots__ = ("tokens", "taken", "cycle", "before", "source", "pulled")

    def __init__(self, tokens: np.ndarray, taken: int, cycle: int, before, source: int = 0):
        self.source = source  # 2 x the index of its source (its slot in the tally)
        self.tokens = tokens  # the document's tokens, EOS included
        self.taken = taken  # tokens already packed into earlier sequences
        self.cycle = cycle  # inner pass it was read in
        self.before = before  # inner position before it
        self.pulled = 0  # by tokens: the sequences delivered when it was drawn


class DocumentReader:
    """The inner stream as documents, from a position: re-reads the document a resumed
    sequence starts in and skips the tokens already packed; with ``restart``, goes on with the
    next pass of the inner stream when one ends."""

    def __init__(self, stage, spec: IterationSpec, stream: int, cycle: int,
                 before, offset: int, restart: bool, history: tuple[int, tuple] = (0, ()),
                 clock=None, tails=()):
        self.stage, self.spec, self.stream, self.restart = stage, spec, stream, restart
        self._options = {} if clock is None else {"clock": clock}  # a Mix's, by tokens
        if hasattr(stage.dataset, "by_tokens"):  # a Mix: the packing counts the documents
            self._options["tally"] = False
        self.history = history  # (inner pass, its segments already read on other layouts)
        self.cycle = cycle
        # documents cut by the last layout change, delivered first (``stages.cut``): while
        # they last, ``before`` is [index of the next one]
        self._tails, self._tail = list(tails), len(tails)
        if is_tail_marker(before):
            self._tail, before = before[0], 0
        elif before == 0 and self._tails:
            self._tail = 0
        self._skip = offset
        self._pass_is_empty = False  # a pass read from its start gave no document yet
        names = stage.names
        self._sources = {name: 2 * i for i, name in enumerate(names)} if len(names) > 1 else None
        self.before = before
        self._open()
        if self._tail < len(self._tails):
            self.before = [self._tail]

    def _open(self) -> None:
        spec = self.spec
        base, history = self.history
        inner = IterationSpec(cycle_epoch(spec.epoch, self.cycle), spec.rank, spec.world,
                              spec.workers, history=history if self.cycle == base else (),
                              batch_size=spec.batch_size, context=spec.context)
        self._items = self.stage.dataset.positioned(inner, self.stream, self.before,
                                                    **self._options)

    def _next_tail(self) -> Document | None:
        while self._tail < len(self._tails):
            index, tail = self._tail, self._tails[self._tail]
            self._tail += 1
            self.before = [self._tail] if self._tail < len(self._tails) else 0
            taken, self._skip = self._skip or tail.offset, 0
            spec = IterationSpec(cycle_epoch(self.spec.epoch, tail.cycle), tail.rank,
                                 tail.world, tail.workers, history=tail.inner_history,
                                 batch_size=tail.batch_size, context=self.spec.context)
            options = self._options if tail.clock is None else \
                {**self._options, "clock": tail.clock}
            items = self.stage.dataset.positioned(spec, tail.stream, tail.before, **options)
            try:
                sample, after = next(items, (None, None))
            finally:
                items.close()
            if after != tail.after:
                continue  # not the sample after the position: the new layout reads it whole
            tokens = self.stage.tokens(sample)
            if tokens is None or taken >= len(tokens):
                raise StateError(f"resume offset {taken} is past the end of the document at "
                                 f"{where(sample)}")
            found = cast(dict, sample)  # it has tokens: a sample
            source = self._sources.get(found.get("__source__"), 0) if self._sources else 0
            return Document(tokens, taken, self.cycle, [index], source)
        return None

    def next(self) -> Document | None:
        """The next document, or None at the end (without ``restart``)."""
        if self._tail < len(self._tails):
            document = self._next_tail()
            if document is not None:
                return document
        while True:
            item = next(self._items, None)
            if item is None:
                if not self.restart:
                    return None
                if self._pass_is_empty:
                    raise InputError(f"{self.stage.source}: a whole pass of stream "
                                     f"{self.stream} of rank {self.spec.rank} has no document")
                self.cycle, self.before, self._pass_is_empty = self.cycle + 1, 0, True
                self._open()
                continue
            sample, after = item
            before, self.before = self.before, after
            tokens = self.stage.tokens(sample)
            if tokens is None:  # a long document under long_documents="drop"
                continue
            self._pass_is_empty = False
            taken, self._skip = self._skip, 0
            if taken >= len(tokens):
                raise StateError(f"resume offset {taken} is past the end of the document at "
                                 f"{where(sample)} ({len(tokens)} tokens)")
            source = self._sources.get(sample.get("__source__"), 0) if self._sources else 0
            return Document(tokens, taken, self.cycle, before, source)


def field_name(text_field, sample) -> str:
    """The member or JSON field holding a sample's document (``text_field``, or its entry
    for the sample's ``__source__``)."""
    if isinstance(text_field, dict):
        source = sample.get("__source__")
        if source not in text_field:
            raise InputError(f"{where(sample)}: no text_field for source {source!r}")
        return text_field[source]
    return text_field


def field_value(text_field, sample):
    """A sample's document: a member, a ``member.key`` of a JSON member, or a bare name
    looked up as a member and then as a key of ``json``."""
    if not isinstance(sample, dict):
        raise InputError(f"PackedSequences needs dict samples, not {type(sample).__name__}")
    name = field_name(text_field, sample)
    if name in sample:
        return sample[name]
    member, dot, key = name.partition(".")
    record = sample.get(member) if dot else sample.get("json")
    key = key if dot else name
    if isinstance(record, dict) and key in record:
        return record[key]
    members = sorted(k for k in sample if not k.startswith("__"))
    raise InputError(f"{where(sample)}: no field {name!r} (members: {members})")


def where(sample) -> str:
    if isinstance(sample, dict):
        return f"{sample.get('__url__', '?')}: sample {sample.get('__key__', '?')!r}"
    return "a sample"
