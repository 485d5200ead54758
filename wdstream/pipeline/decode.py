"""Decoding members by extension: ``json`` to objects, ``txt`` to str, ``npy`` to arrays,
anything else stays bytes. Users extend or replace the table; nothing unpickles unless asked
for by name (``decoders={"pyd": "pickle"}``)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping

from ..errors import ShardError

try:  # a core dependency: about 3x faster than json on small records
    from orjson import JSONDecodeError as _FastJSONError
    from orjson import loads as _fast_loads
except ImportError:  # a platform without an orjson wheel: the standard library
    _fast_loads, _FastJSONError = json.loads, json.JSONDecodeError


def _json(data: bytes):
    try:
        return _fast_loads(data)
    except _FastJSONError:
        # what orjson refuses and json accepts (NaN, Infinity, lone surrogates) still decodes
        return json.loads(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _npy(data: bytes):
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _pickle(data: bytes):
    import pickle

    return pickle.loads(data)


def _int(data: bytes) -> int:
    return int(data)


DEFAULT_DECODERS: dict[str, Callable[[bytes], object]] = {
    "json": _json,
    "txt": _text,
    "text": _text,
    "npy": _npy,
    "cls": _int,
}

# Decoders that can run arbitrary code; only used when named explicitly.
OPT_IN_DECODERS = {"pickle": _pickle}


def build_decoders(decoders: Mapping[str, object] | None) -> dict[str, Callable]:
    """The default table updated with the user's: ``{ext: callable | "pickle" | None}``;
    None removes a default (the member stays bytes)."""
    table = dict(DEFAULT_DECODERS)
    for ext, decoder in (decoders or {}).items():
        if decoder is None:
            table.pop(ext, None)
        elif isinstance(decoder, str):
            if decoder not in OPT_IN_DECODERS:
                raise ValueError(f"unknown decoder {decoder!r} for .{ext}; "
                                 f"named decoders: {sorted(OPT_IN_DECODERS)}")
            table[ext] = OPT_IN_DECODERS[decoder]
        elif callable(decoder):
            table[ext] = decoder
        else:
            raise TypeError(f"decoder for .{ext} must be callable, a name or None")
    return table


def find_decoder(table: Mapping[str, Callable], extension: str) -> Callable | None:
    """The decoder of a member's (lowercased) extension, or of its last dotted part."""
    return table.get(extension) or table.get(extension.rsplit(".", 1)[-1])


def decode_sample(sample: dict, table: Mapping[str, Callable]) -> dict:
    """Decode each member whose extension (its last dotted part) has a decoder."""
    decoded = {}
    for name, value in sample.items():
        if name.startswith("__"):
            decoded[name] = value
            continue
        decoder = find_decoder(table, name)
        if decoder is None:
            decoded[name] = value
            continue
        try:
            decoded[name] = decoder(value)
        except Exception as error:  # noqa: BLE001 - any decoder failure names the sample
            raise ShardError(f"{sample.get('__url__')}: sample {sample.get('__key__')!r}: "
                             f"cannot decode .{name}: {error}") from error
    return decoded
