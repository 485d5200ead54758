"""``read_samples``: a dataset's raw samples in file order, and ``sample_to_json``, how
``wdstream cat`` shows them."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence

from wdstream.errors import InputError
from wdstream.shards.locate import Shards, find_shards


def read_samples(
    source: str | Sequence[str] | Shards,
    *,
    key: str | None = None,
    limit: int | None = None,
    opener: str | None = None,
    allow_external_shards: bool = False,
) -> Iterator[dict]:
    """Raw samples (``{"__key__", "__url__", ext: bytes}``) in file order: shard by shard as
    listed, members as stored, no shuffling.

    ``key`` yields only the first sample with that key, and raises InputError if no shard
    holds it; ``limit`` stops after that many samples. A corrupt shard raises ShardError.
    """
    from wdstream.shards.compression import DecompressingStream, open_tar
    from wdstream.shards.identity import head_check
    from wdstream.shards.samples import iter_samples
    from wdstream.shards.tar_reader import iter_members
    from wdstream.sources.openers import open_read

    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    found = find_shards(source, allow_external_shards=allow_external_shards)
    yielded = 0
    scanned = 0
    shards = found.manifest.shards if found.manifest is not None else None
    for index, url in enumerate(found.urls):
        if limit is not None and yielded >= limit:
            return
        info = shards[index] if shards is not None else None  # bound and identity, if known
        checks = {} if info is None else {
            "limit": info.bytes or None,
            "on_head": head_check(url, info.head) if info.head else None}
        with open_read(url, opener=opener) as stream:
            tar = open_tar(stream, url, stored_limit=checks.get("limit"))
            if isinstance(tar, DecompressingStream):  # the manifest's bytes are the stored ones
                checks.pop("limit", None)
            for sample in iter_samples(iter_members(tar, url, **checks), url):
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


def member_to_json(ext: str, payload: bytes, *, decode: bool = True,
                   base64_bytes: bool = False) -> object:
    """One member as a JSON value: ``json`` parsed, ``txt``/``text`` as str, ``cls`` as int,
    ``npy`` as ``{"npy": {"shape", "dtype"}}``; anything else (or everything when not
    ``decode``) as ``{"bytes": size}`` or ``{"base64": ...}``. A member that fails to decode
    is shown as binary with a ``decode_error``."""
    if decode:
        from wdstream.stream.decode import build_decoders, decode_member

        try:
            value = decode_member(build_decoders(None), ext, payload)
        except Exception as error:  # shown, not raised: cat is for looking
            return _binary(payload, base64_bytes) | {"decode_error": str(error)}
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return {"npy": {"shape": list(value.shape), "dtype": str(value.dtype)}}
        if isinstance(value, bytes):
            return _binary(value, base64_bytes)
        return value
    return _binary(payload, base64_bytes)


def _binary(payload: bytes, base64_bytes: bool) -> dict:
    if base64_bytes:
        return {"base64": base64.b64encode(payload).decode("ascii")}
    return {"bytes": len(payload)}


def sample_to_json(sample: dict, *, fields: Sequence[str] | None = None, decode: bool = True,
                   base64_bytes: bool = False) -> dict:
    """A raw sample as a JSON-serialisable dict: ``__key__``, ``__url__`` (unless ``fields``
    is given) and each member through ``member_to_json``. ``fields`` keeps only those members
    (by extension), in that order; ``__key__`` is always kept."""
    out: dict = {"__key__": sample["__key__"]}
    if fields is None:
        out["__url__"] = sample["__url__"]
        names = [name for name in sample if not name.startswith("__")]
    else:
        names = [name for name in fields if name in sample and not name.startswith("__")]
        if "__url__" in fields:
            out["__url__"] = sample["__url__"]
    for name in names:
        out[name] = member_to_json(name, sample[name], decode=decode, base64_bytes=base64_bytes)
    return out
