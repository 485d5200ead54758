"""Decoding members by extension: ``json`` to objects, ``txt`` to str, ``npy`` to arrays,
anything else stays bytes. Users extend or replace the table; nothing unpickles unless asked
for by name (``decoders={"pyd": "pickle"}``)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping

from ..errors import OptionError, OptionTypeError, ShardError


def _json(data: bytes):
    try:
        import orjson  # noqa: PLC0415 - optional, about 3x faster on small records
    except ImportError:
        return json.loads(data)
    return orjson.loads(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


# the header np.save writes for a 1-d array of a plain number type (token ids, embeddings)
_NPY_1D = re.compile(rb"\{'descr': '([<|][uif][1248])', 'fortran_order': False, "
                     rb"'shape': \((\d+),\), \} *\n")


def _npy(data: bytes):
    import numpy as np

    # A 1-d array is read without np.load's header parser (literal_eval: ~50 us a member,
    # most of the cost of a pre-tokenized document); anything else goes through np.load.
    if data[:8] == b"\x93NUMPY\x01\x00":
        end = 10 + int.from_bytes(data[8:10], "little")
        header = _NPY_1D.fullmatch(data, 10, end)
        if header is not None:
            dtype = np.dtype(header[1].decode())
            count = int(header[2])
            if len(data) - end == count * dtype.itemsize:
                return np.frombuffer(data, dtype, count, end).copy()
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
        if not isinstance(ext, str) or not ext:
            raise OptionTypeError(f"decoders: keys are extensions such as 'json', not {ext!r}")
        if decoder is None:
            table.pop(ext, None)
        elif isinstance(decoder, str):
            if decoder not in OPT_IN_DECODERS:
                raise OptionError(f"decoders: unknown decoder {decoder!r} for .{ext}; "
                                  f"named decoders: {sorted(OPT_IN_DECODERS)}")
            table[ext] = OPT_IN_DECODERS[decoder]
        elif callable(decoder):
            table[ext] = decoder
        else:
            raise OptionTypeError(f"decoders: the decoder for .{ext} must be a callable, a "
                                  f"name ({sorted(OPT_IN_DECODERS)}) or None, not "
                                  f"{type(decoder).__name__}")
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
