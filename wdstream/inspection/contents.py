"""``read_samples``: a dataset's raw samples in file order, and ``sample_to_json``, how
``wdstream cat`` shows them."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from wdstream.errors import InputError
from wdstream.limits import Limits
from wdstream.shards.compression import DecompressingBody, open_tar
from wdstream.shards.identity import head_check
from wdstream.shards.locate import Shards, find_shards
from wdstream.shards.manifest import ShardInfo
from wdstream.shards.samples import iter_samples
from wdstream.shards.tar_reader import iter_members
from wdstream.sources.openers import open_read
from wdstream.stream.read.decode import build_decoders, member_within


def read_samples(
    source: str | Sequence[str] | Shards,
    *,
    key: str | None = None,
    limit: int | None = None,
    opener: str | None = None,
    allow_external_shards: bool = False,
    limits: Limits | None = None,
) -> Iterator[dict]:
    """Raw samples (``{"__key__", "__url__", ext: bytes}``) in file order: shard by shard as
    listed, members as stored, no shuffling.

    ``key`` yields only the first sample with that key, and raises InputError if no shard
    holds it; ``limit`` stops after that many samples. A corrupt shard raises ShardError,
    one past ``limits`` (``wdstream.Limits``, default ``Limits()``) a LimitError.
    """
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    found = find_shards(source, allow_external_shards=allow_external_shards)
    limits = Limits() if limits is None else limits
    yielded = 0
    scanned = 0
    shards = found.manifest.shards if found.manifest is not None else None
    for index, url in enumerate(found.urls):
        if limit is not None and yielded >= limit:
            return
        info = shards[index] if shards is not None else None  # bound and identity, if known
        with contextlib.closing(_shard_samples(url, info, opener, limits)) as samples:
            for sample in samples:
                scanned += 1
                if key is not None and sample["__key__"] != key:
                    continue
                yield sample
                yielded += 1
                if key is not None or (limit is not None and yielded >= limit):
                    return
    if key is not None:
        raise InputError(f"{found.source}: no sample with key {key!r} in {scanned:,} samples "
                         f"of {len(found.urls):,} shards")


def _shard_samples(url: str, info: ShardInfo | None, opener: str | None,
                   limits: Limits) -> Generator[dict, None, None]:
    """The raw samples of one shard, checked against its manifest entry ``info`` if any."""
    checks: dict[str, Any] = {} if info is None else {
        "limit": info.bytes or None,
        "on_head": head_check(url, info.head) if info.head else None}
    with open_read(url, opener=opener) as stream:
        tar = open_tar(stream, url, stored_limit=checks.get("limit"), limits=limits)
        if isinstance(tar, DecompressingBody):  # the manifest's bytes are the stored ones
            checks.pop("limit", None)
        members = iter_members(tar, url, member_limit=limits.sample_bytes, **checks)
        yield from iter_samples(members, url, sample_limit=limits.sample_bytes)


def member_to_json(ext: str, payload: bytes, *, decode: bool = True,
                   base64_bytes: bool = False, budget: int | None = None) -> object:
    """One member as a JSON value: ``json`` parsed, ``txt``/``text`` as str, ``cls`` as int,
    ``npy`` as ``{"npy": {"shape", "dtype"}}``; anything else (or everything when not
    ``decode``) as ``{"bytes": size}`` or ``{"base64": ...}``. A member that fails to decode
    is shown as binary with a ``decode_error``, as is one whose decoding would make more than
    ``budget`` bytes (default ``Limits().sample_bytes``)."""
    return _member_json(ext, payload, decode, base64_bytes,
                        Limits().sample_bytes if budget is None else budget)[0]


def _member_json(ext: str, payload: bytes, decode: bool, base64_bytes: bool, budget: int
                 ) -> tuple[object, int]:
    """``member_to_json``'s value and the bytes its decoding made."""
    if decode:
        try:
            value, made = member_within(build_decoders(None), ext, payload, budget)
        except Exception as error:  # shown, not raised: cat is for looking
            return _binary(payload, base64_bytes) | {"decode_error": str(error)}, 0
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return {"npy": {"shape": list(value.shape), "dtype": str(value.dtype)}}, made
        if isinstance(value, bytes):
            return _binary(value, base64_bytes), made
        return value, made
    return _binary(payload, base64_bytes), 0


def _binary(payload: bytes, base64_bytes: bool) -> dict:
    if base64_bytes:
        return {"base64": base64.b64encode(payload).decode("ascii")}
    return {"bytes": len(payload)}


def sample_to_json(sample: dict, *, fields: Sequence[str] | None = None, decode: bool = True,
                   base64_bytes: bool = False, limits: Limits | None = None) -> dict:
    """A raw sample as a JSON-serialisable dict: ``__key__``, ``__url__`` (unless ``fields``
    is given) and each member through ``member_to_json``. ``fields`` keeps only those members
    (by extension), in that order; ``__key__`` is always kept. Its members and what decoding
    makes of them take at most ``limits.sample_bytes`` (``wdstream.Limits``)."""
    out: dict = {"__key__": sample["__key__"]}
    if fields is None:
        out["__url__"] = sample["__url__"]
        names = [name for name in sample if not name.startswith("__")]
    else:
        names = [name for name in fields if name in sample and not name.startswith("__")]
        if "__url__" in fields:
            out["__url__"] = sample["__url__"]
    limits = Limits() if limits is None else limits
    budget = limits.sample_bytes - sum(len(v) for v in sample.values() if type(v) is bytes)
    for name in names:
        out[name], made = _member_json(name, sample[name], decode, base64_bytes, budget)
        budget -= made
    return out
