"""JSON members decoded in the training process rather than in DataLoader workers: pickling
decoded objects costs more than decoding them, so under ``wdstream.DataLoader`` with workers
and the default collate, small members the built-in JSON decoder would decode stay bytes in
the worker (``Deferred``) and a batch's column of them crosses as one ``JsonColumn``, decoded
with the same decoder and collate rules. Nothing is deferred where the worker needs the value
(a ``map``, a stage, a user's collate or decoder, ``on_error="skip"``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import accumulate

from wdstream.stream.read.decode import (
    DEFAULT_LIMITS,
    JSON_READS_VIEWS,
    SampleDecoder,
    _fast_loads,
    decode_error,
    json_member,
    within,
)

# Members from this size on are decoded in the worker: their objects are few for their bytes,
# and the main process has one core to share with training.
DEFER_MAX = 64 << 10


class Deferred:
    """A JSON member's bytes, still to be decoded (in the main process)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def decode(self):
        return json_member(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Deferred({len(self.data)} bytes of JSON)"


def _defer(data):
    return Deferred(data) if type(data) is bytes and len(data) < DEFER_MAX else json_member(data)


def _defer_within(data, budget: int):
    if type(data) is bytes and len(data) < DEFER_MAX:
        return Deferred(data), 0
    return within(json_member, data, budget)


vars(_defer)["within"] = _defer_within  # the bounded form (wdstream.stream.read.decode.within)


def deferring(table: Mapping[str, Callable]) -> dict[str, Callable]:
    """``table`` with the built-in JSON decoder replaced by one that defers small members
    (other decoders, a user's JSON decoder included, untouched)."""
    return {ext: _defer if decoder is json_member else decoder for ext, decoder in table.items()}


class DeferringDecoder(SampleDecoder):
    """A stream's ``SampleDecoder`` under deferral: a member that the built-in JSON decoder
    would decode stays ``bytes`` below ``DEFER_MAX`` (a decoded JSON value is never
    ``bytes``), and its name goes into ``names``, which the stream's default collate is given:
    a column of ``bytes`` there is JSON to decode in the main process. Other members are
    decoded as ``decode_sample`` does (``NAME.gz`` to ``Deferred``)."""

    __slots__ = ("names",)

    def __init__(self, table: Mapping[str, Callable], names: set[str],
                 sample_bytes: int = DEFAULT_LIMITS.sample_bytes):
        super().__init__(deferring(table), kept=_defer, kept_below=DEFER_MAX,
                         sample_bytes=sample_bytes)
        self.names = names

    def _decoder(self, name: str) -> Callable | None:
        decoder = super()._decoder(name)
        if decoder is _defer:
            self.names.add(name)
        return decoder


def can_defer(table: Mapping[str, Callable] | None) -> bool:
    """Whether ``table`` decodes anything with the built-in JSON decoder."""
    return table is not None and any(d is json_member for d in table.values())


class JsonColumn:
    """A batch's JSON members of one name, undecoded: one ``bytes`` and the members' ends.
    ``single``: the column is one sample's member (``batch_size=None``), not a list."""

    __slots__ = ("blob", "ends", "single")

    def __init__(self, values: list[bytes], single: bool = False):
        self.blob = b"".join(values)
        self.ends = list(accumulate(map(len, values)))
        self.single = single

    def __getstate__(self):
        return self.blob, self.ends, self.single

    def __setstate__(self, state) -> None:
        self.blob, self.ends, self.single = state

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def nbytes(self) -> int:
        return len(self.blob)

    def decode(self, name: str, urls, keys) -> list:
        """The decoded values; a member that does not decode raises ``ShardError`` naming its
        shard (``urls[i]``), sample (``keys[i]``) and member (``name``)."""
        blob, ends = self.blob, self.ends
        values: list = []
        if JSON_READS_VIEWS:  # the usual case: orjson, straight from the blob
            view, start, append, loads = memoryview(blob), 0, values.append, _fast_loads
            try:
                for end in ends:
                    append(loads(view[start:end]))
                    start = end
            except Exception:  # NaN, a lone surrogate, a member that does not decode...
                pass  # ... decoded from there on as json_member does, or reported
            del view
        start = ends[len(values) - 1] if values else 0
        for index in range(len(values), len(ends)):
            end = ends[index]
            try:
                values.append(json_member(blob[start:end]))
            except Exception as error:  # as decode_sample reports it
                raise decode_error(_at(urls, index), _at(keys, index), name, error) from error
            start = end
        return values


def _at(values, index: int):
    if isinstance(values, (list, tuple)) and index < len(values):
        return values[index]
    return values if isinstance(values, str) else None
