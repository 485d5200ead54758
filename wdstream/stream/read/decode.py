"""Decoding members by extension, as webdataset's decoders do (``json``, ``txt``, ``cls``,
``npy``, ``mp``, ``NAME.gz``...; images only when asked for; anything else stays bytes;
nothing unpickles unless named). A built-in decoder whose value may outgrow its bytes has a
bounded form, ``decoder.within(data, budget) -> (value, bytes made)``, which raises
``LimitError`` before making more than the sample's budget (``SampleDecoder`` keeps it per
sample); a user's decoder is called as it is."""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any

from wdstream.errors import LimitError, OptionError, OptionTypeError, ShardError
from wdstream.limits import Limits
from wdstream.options import IMAGE_MODES

DEFAULT_LIMITS = Limits()
# The most bytes of Python objects one byte of JSON text makes (``[{"":0},...]``: a dict of
# 184 bytes and its pointer per 7 bytes), and a bound of the bytes one value takes, counted
# by the ",", "[" and "{" that start or separate values: below len(text) * JSON_GROWTH
# bytes the text is not counted.
JSON_GROWTH = 32
JSON_VALUE_BYTES = 100
GUNZIP_PIECE = 64 << 20  # gunzipped at a time (zlib joins a call's output once more)
# msgpack: a one-byte empty map becomes a dict of 64 bytes and its pointer.
MSGPACK_GROWTH = 72

_fast_loads: Callable[[Any], Any]
_FastJSONError: type[ValueError]
try:  # a core dependency, for small records (docs/decisions.md)
    from orjson import JSONDecodeError as _FastJSONError
    from orjson import loads as _fast_loads
except ImportError:  # a platform without an orjson wheel: the standard library
    _fast_loads, _FastJSONError = json.loads, json.JSONDecodeError
JSON_READS_VIEWS = _fast_loads is not json.loads  # orjson decodes a memoryview as it is


def json_member(data: bytes):
    """A JSON member's value (orjson; what it refuses and json accepts through json)."""
    try:
        return _fast_loads(data)
    except _FastJSONError:
        # what orjson refuses and json accepts (NaN, Infinity, lone surrogates) still decodes
        return json.loads(data)


def _left(budget: int) -> str:
    return f"the {max(budget, 0):,} bytes left of the sample's limit (sample_bytes of wdstream.Limits)"


def _json_within(data: bytes, budget: int):
    made = len(data)
    if made * JSON_GROWTH > budget:  # a large member: its values counted first
        text = data if type(data) is bytes else bytes(data)
        made += JSON_VALUE_BYTES * (text.count(b",") + text.count(b"[") + text.count(b"{"))
        if made > budget:
            raise LimitError(f"{len(text):,} bytes of JSON would make about {made:,} bytes of "
                             f"objects, more than {_left(budget)}")
    return json_member(data), made


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _text_within(data: bytes, budget: int):
    # a str takes up to 4 bytes a character once one character needs them
    made = len(data) if len(data) * 4 <= budget or data.isascii() else len(data) * 4
    if made > budget:
        raise LimitError(f"{len(data):,} bytes of text may take {made:,} bytes as a str, more "
                         f"than {_left(budget)}")
    return data.decode("utf-8"), made


# the header np.save writes for a 1-d array of a plain number type (token ids, embeddings)
_NPY_1D = re.compile(rb"\{'descr': '([<|][uif][1248])', 'fortran_order': False, "
                     rb"'shape': \((\d+),\), \} *\n")


def _npy(data: bytes):
    return _npy_within(data, DEFAULT_LIMITS.sample_bytes)[0]


def _npy_within(data: bytes, budget: int):
    import numpy as np

    # A 1-d array is read without np.load's header parser (docs/decisions.md);
    # anything else goes through np.load.
    if data[:8] == b"\x93NUMPY\x01\x00":
        end = 10 + int.from_bytes(data[8:10], "little")
        header = _NPY_1D.fullmatch(data, 10, end)
        if header is not None:
            dtype = np.dtype(header[1].decode())
            count = int(header[2])
            if len(data) - end == count * dtype.itemsize:
                if count * dtype.itemsize > budget:
                    raise LimitError(f"an array of {count * dtype.itemsize:,} bytes, more "
                                     f"than {_left(budget)}")
                return np.frombuffer(data, dtype, count, end).copy(), count * dtype.itemsize
    body = io.BytesIO(data)
    version = np.lib.format.read_magic(body)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
        else np.lib.format.read_array_header_2_0  # 2.0 and 3.0: a 4-byte header length
    shape, _, dtype = read_header(body)
    size = dtype.itemsize
    for length in shape:
        size *= length
    if size > len(data) - body.tell():  # np.load would allocate it before reading
        raise ValueError(f"the header says {size:,} bytes of array data; "
                         f"{len(data) - body.tell():,} follow")
    if size > budget:
        raise LimitError(f"an array of {size:,} bytes, more than {_left(budget)}")
    return np.load(io.BytesIO(data), allow_pickle=False), size


def _pickle(data: bytes):
    import pickle

    return pickle.loads(data)


def _torch(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)  # unpickles: opt-in only


def _int(data: bytes) -> int:
    return int(data)


def _msgpack(data: bytes):
    return _msgpack_within(data, DEFAULT_LIMITS.sample_bytes)[0]


def _msgpack_within(data: bytes, budget: int):
    import msgpack

    made = len(data) * MSGPACK_GROWTH
    if made > budget:
        raise LimitError(f"{len(data):,} bytes of msgpack may make up to {made:,} bytes of "
                         f"objects, more than {_left(budget)}")
    return msgpack.unpackb(data, raw=False), made


def gunzip(data: bytes) -> bytes:
    """A gzip member's content (several gzip members one after another too), at most
    ``Limits().sample_bytes`` bytes (``gunzip.within``: at most a given budget)."""
    return _gunzip_within(data, DEFAULT_LIMITS.sample_bytes)[0]


def _gunzip_within(data: bytes, budget: int):
    out = []
    size = 0
    while data:  # a gzip member at a time
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while data and not decompressor.eof:  # in pieces: nothing joined past the budget
            piece = decompressor.decompress(data, min(GUNZIP_PIECE, max(budget - size, 0) + 1))
            size += len(piece)
            if size > budget:
                raise LimitError(f"gzip data expands to more than {_left(budget)}")
            out.append(piece)
            data = decompressor.unconsumed_tail
        if not decompressor.eof:
            raise ValueError("truncated gzip data")
        data = decompressor.unused_data
    return (out[0] if len(out) == 1 else b"".join(out)), size


# the bounded forms of the built-in decoders (see the module's docstring)
# (set through vars(): a function's attribute the type checker knows nothing of)
vars(json_member)["within"] = _json_within
vars(_text)["within"] = _text_within
vars(_npy)["within"] = _npy_within
vars(_msgpack)["within"] = _msgpack_within
vars(gunzip)["within"] = _gunzip_within


def within(decoder: Callable, data, budget: int) -> tuple[object, int]:
    """``decoder(data)`` and the bytes its value takes beyond ``data``, at most ``budget``
    (``LimitError`` before more) for a decoder with a bounded form; 0 for any other."""
    bounded = getattr(decoder, "within", None)
    if bounded is None:
        return decoder(data), 0
    return bounded(data, budget)


DEFAULT_DECODERS: dict[str, Callable[[bytes], object]] = {
    "json": json_member,
    "jsn": json_member,
    "txt": _text,
    "text": _text,
    "transcript": _text,
    "npy": _npy,
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), _int),
    "gz": gunzip,  # NAME.gz: see decode_sample
}


def _msgpack_installed() -> bool:
    try:
        import msgpack  # noqa: F401
    except ImportError:
        return False
    return True


# Decoders that can run arbitrary code; only used when named explicitly.
OPT_IN_DECODERS = {"pickle": _pickle, "torch": _torch}

# --- images -----------------------------------------------------------------------------------

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif",
                    "tif", "tiff")


class ImageDecoder:
    """Decodes an image member with Pillow: a PIL image, an ``HxWxC`` numpy array (``HxW``
    for ``L``), or a ``CxHxW`` tensor; ``uint8``, or ``float32`` in [0, 1]. Picklable, so it
    goes to DataLoader workers with the dataset.

    Only ``limits.image_formats`` are read (by their content, whatever the member's name); an
    image's size is read from its header and checked (``limits.image_pixels``, and the bytes
    its pixels take decoded against the sample's budget) before its pixels are decoded."""

    def __init__(self, name: str, limits: Limits = DEFAULT_LIMITS):
        if name not in IMAGE_MODES:
            raise OptionError(f"decode={name!r}: image modes are {', '.join(IMAGE_MODES)} "
                             "(or True / False)")
        try:
            from PIL import Image  # checked when the dataset is built
        except ImportError:
            raise OptionError(f"decode={name!r} decodes images with Pillow: "
                             "pip install 'wdstream[image]'") from None
        Image.init()
        unknown = [f for f in limits.image_formats if f not in Image.OPEN]
        if unknown:
            raise OptionError(f"Limits: image_formats: Pillow reads no {', '.join(unknown)} "
                              f"(it reads {', '.join(sorted(Image.OPEN))})")
        self.name = name
        self.limits = limits
        self.mode, self.output, self.dtype = IMAGE_MODES[name]

    def __call__(self, data: bytes):
        return self.within(data, self.limits.sample_bytes)[0]

    def _bytes_per_pixel(self, mode: str) -> int:
        """What Pillow's image of ``mode``, its conversion and the array made of it take per
        pixel, at most (Pillow keeps 3 and 4 bands in 4 bytes)."""
        from PIL import Image

        made = 1 if mode in ("1", "L", "P") else 4
        if self.mode is not None and mode != self.mode:
            made += 1 if self.mode == "L" else 4
        if self.output == "pil":
            return made
        bands = Image.getmodebands(self.mode or mode)
        return made + bands * (9 if self.dtype == "float" else 2)  # float: 2 arrays at once

    def within(self, data: bytes, budget: int):
        from PIL import Image

        image = Image.open(io.BytesIO(data), formats=self.limits.image_formats)
        width, height = image.size
        if width * height > self.limits.image_pixels:
            raise LimitError(f"a {width}x{height} image: more than "
                             f"{self.limits.image_pixels:,} pixels (the limit image_pixels of "
                             "wdstream.Limits)")
        made = width * height * self._bytes_per_pixel(image.mode)
        if made > budget:
            raise LimitError(f"a {width}x{height} image takes {made:,} bytes decoded, more "
                             f"than {_left(budget)}")
        return self._pixels(image), made

    def _pixels(self, image):
        if self.mode is not None and image.mode != self.mode:
            image = image.convert(self.mode)
        else:
            image.load()
        if self.output == "pil":
            return image
        import numpy as np

        array = np.asarray(image)  # read-only: it views the bytes Pillow hands over
        if self.dtype == "float":
            array = array.astype(np.float32) / 255.0
        if self.output == "numpy":
            return array
        import torch

        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
        return tensor.permute(2, 0, 1) if tensor.ndim == 3 else tensor

    def __repr__(self) -> str:
        return f"ImageDecoder({self.name!r})"


def build_decoders(decoders: Mapping[str, object] | None, images: str | None = None,
                   limits: Limits = DEFAULT_LIMITS) -> dict[str, Callable]:
    """The default table (with images decoded as ``images``, a name of IMAGE_MODES, if given,
    within ``limits``) updated with the user's: ``{ext: callable | "pickle" | "torch" |
    None}``; None removes a default (the member stays bytes)."""
    table = dict(DEFAULT_DECODERS)
    if _msgpack_installed():
        table.update(dict.fromkeys(("mp", "msgpack", "msg"), _msgpack))
    if images is not None:
        table.update(dict.fromkeys(IMAGE_EXTENSIONS, ImageDecoder(images, limits)))
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


def decode_option(decode: bool | str) -> str | None:
    """The image mode of a ``decode=`` value (None: images stay bytes); OptionError (a
    ValueError) if bad."""
    if isinstance(decode, bool):
        return None
    if isinstance(decode, str):
        ImageDecoder(decode)  # checks the name and that Pillow is there
        return decode
    raise OptionTypeError(f"decode must be True, False or an image mode such as 'rgb8', "
                     f"not {decode!r}")


def find_decoder(table: Mapping[str, Callable], extension: str) -> Callable | None:
    """The decoder of a member's (lowercased) extension, or of its last dotted part."""
    return table.get(extension) or table.get(extension.rsplit(".", 1)[-1])


def decode_member(table: Mapping[str, Callable], name: str, value,
                  budget: int = DEFAULT_LIMITS.sample_bytes):
    """One member's value: decoded by the decoder of ``name`` (its extension), else bytes;
    at most ``budget`` bytes made by a built-in decoder."""
    return member_within(table, name, value, budget)[0]


def member_within(table: Mapping[str, Callable], name: str, value, budget: int):
    """``decode_member``'s value and the bytes it made (see ``within``)."""
    decoder = table.get(name)
    if decoder is None:
        inner, dot, last = name.rpartition(".")
        decoder = table.get(last)
        if decoder is gunzip and dot:  # NAME.gz: gunzipped, then decoded as NAME
            data, made = _gunzip_within(value, budget)
            inner_decoder = find_decoder(table, inner)
            if inner_decoder is None or inner_decoder is gunzip:
                return data, made
            value, more = within(inner_decoder, data, budget - made)
            return value, made + more
    return (value, 0) if decoder is None else within(decoder, value, budget)


class _Gunzipped:
    """The decoder of a member named ``NAME.gz``: gunzipped, then decoded as ``NAME``."""

    __slots__ = ("table", "name")

    def __init__(self, table: Mapping[str, Callable], name: str):
        self.table, self.name = table, name

    def __call__(self, data):
        return decode_member(self.table, self.name, data)

    def within(self, data, budget: int):
        return member_within(self.table, self.name, data, budget)


def decode_sample(sample: dict, table: Mapping[str, Callable],
                  sample_bytes: int = DEFAULT_LIMITS.sample_bytes) -> dict:
    """Decode each member whose extension (its last dotted part) has a decoder (a new dict;
    ``sample_bytes``: ``Limits.sample_bytes``)."""
    return SampleDecoder(table, sample_bytes=sample_bytes)(dict(sample))


_UNSEEN: Any = object()  # a sentinel: compared by identity, of any type to the checker
_NAMES_KEPT = 256  # member names whose decoder a SampleDecoder remembers


class SampleDecoder:
    """``decode_sample`` for one stream: the decoder of each member name (or that it has
    none) is looked up once, not for every sample. ``kept``: a decoder of the table whose
    ``bytes`` values under ``kept_below`` bytes are left as they are (JSON that the main
    process decodes: ``stream.transfer.deferred``). A sample's members and what the built-in decoders
    make of them take at most ``sample_bytes`` (``Limits.sample_bytes``; see ``within``)."""

    __slots__ = ("table", "_by_name", "_kept", "_kept_below", "_sample_bytes")

    def __init__(self, table: Mapping[str, Callable], kept: Callable | None = None,
                 kept_below: int = 0, sample_bytes: int = DEFAULT_LIMITS.sample_bytes):
        self.table = table
        self._by_name: dict[str, Callable | None] = {}
        self._kept = _UNSEEN if kept is None else kept  # _UNSEEN: no decoder is kept
        self._kept_below = kept_below
        self._sample_bytes = sample_bytes

    def _decoder(self, name: str) -> Callable | None:
        """What ``decode_member`` would call for a member ``name``."""
        table = self.table
        if name.startswith("__"):
            decoder = None
        else:
            decoder = table.get(name)
            if decoder is None:
                inner, dot, last = name.rpartition(".")
                decoder = table.get(last)
                if decoder is gunzip and dot:  # NAME.gz: gunzipped, then decoded as NAME
                    decoder = _Gunzipped(table, name)
        if len(self._by_name) < _NAMES_KEPT:
            self._by_name[name] = decoder
        return decoder

    def __call__(self, sample: dict) -> dict:
        """``sample`` decoded in place (the reader's dict: nothing else holds it)."""
        by_name, kept, below = self._by_name, self._kept, self._kept_below
        budget = None  # bytes the sample may still take; counted at its first bounded decoder
        for name, value in sample.items():  # values replaced, no key added: no resize
            decoder = by_name.get(name, _UNSEEN)
            if decoder is _UNSEEN:
                decoder = self._decoder(name)
            if decoder is None or (decoder is kept and type(value) is bytes
                                   and len(value) < below):
                continue
            try:
                bounded = getattr(decoder, "within", None)
                if bounded is None:
                    sample[name] = decoder(value)
                    continue
                if budget is None:
                    budget = self._sample_bytes - sum(
                        len(v) for v in sample.values() if type(v) is bytes)
                sample[name], made = bounded(value, budget)
                budget -= made
            except Exception as error:  # any decoder failure names the sample
                raise decode_error(sample.get("__url__"), sample.get("__key__"), name,
                                   error) from error
        return sample

    def unchanged(self, samples: list[dict]) -> bool:
        """Whether decoding leaves each of ``samples`` as it is (each of their members has no
        decoder, or is a value kept as it is): checked a list at a time, in C, rather than
        member by member."""
        by_name, kept = self._by_name, []
        for name in set().union(*samples):  # the names of all their members
            decoder = by_name.get(name, _UNSEEN)
            if decoder is _UNSEEN:
                decoder = self._decoder(name)
            if decoder is None:
                continue
            if decoder is not self._kept:
                return False
            kept.append(name)
        for name in kept:
            try:
                values = list(map(itemgetter(name), samples))
            except KeyError:  # a member not every sample has
                values = [sample[name] for sample in samples if name in sample]
            if set(map(type, values)) != _BYTES or max(map(len, values)) >= self._kept_below:
                return False
        return True


_BYTES = frozenset((bytes,))


def decode_error(url, key, name: str, error: Exception) -> ShardError:
    """The error of a member that does not decode: its shard, sample and member (a
    ``LimitError`` for a member past a limit)."""
    kind = LimitError if isinstance(error, LimitError) else ShardError
    return kind(f"{url}: sample {key!r}: cannot decode .{name}: {error}")
