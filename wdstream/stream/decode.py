"""Decoding members by extension, as webdataset's decoders do: ``json`` to objects, ``txt`` to
str, ``cls``/``cls2``/``index``... to int, ``npy`` to arrays, ``mp``/``msgpack`` to objects when
msgpack is installed, ``NAME.gz`` gunzipped and decoded as ``NAME``; images only when asked for
(``decode="rgb8"``...: Pillow, in the workers); anything else stays bytes. Users extend or
replace the table; nothing unpickles unless asked for by name (``decoders={"pyd": "pickle"}``,
``{"pth": "torch"}``)."""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Callable, Mapping
from functools import partial
from operator import itemgetter

from wdstream.errors import OptionError, OptionTypeError, ShardError

# The largest a gzip member may expand to: beyond this it is refused (a hostile member of a few
# KB could otherwise fill the memory).
MAX_GUNZIPPED = 1 << 30

try:  # a core dependency: faster than json on small records (docs/benchmarks.md)
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


def _torch(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)  # unpickles: opt-in only


def _int(data: bytes) -> int:
    return int(data)


def _msgpack(data: bytes):
    import msgpack

    return msgpack.unpackb(data, raw=False)


def gunzip(data: bytes) -> bytes:
    """A gzip member's content (several gzip members one after another too), at most
    MAX_GUNZIPPED bytes."""
    out = []
    size = 0
    while data:
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        piece = decompressor.decompress(data, MAX_GUNZIPPED - size + 1)
        size += len(piece)
        if size > MAX_GUNZIPPED or decompressor.unconsumed_tail:
            raise ValueError(f"gzip member expands to more than {MAX_GUNZIPPED} bytes")
        if not decompressor.eof:
            raise ValueError("truncated gzip data")
        out.append(piece)
        data = decompressor.unused_data
    return b"".join(out)


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
# decode= names, as webdataset's ImageHandler names them: (PIL mode or None, output, dtype)
IMAGE_MODES = {
    "pil": (None, "pil", None),
    "pill": ("L", "pil", None), "pilrgb": ("RGB", "pil", None), "pilrgba": ("RGBA", "pil", None),
    "l8": ("L", "numpy", "uint8"), "rgb8": ("RGB", "numpy", "uint8"),
    "rgba8": ("RGBA", "numpy", "uint8"),
    "l": ("L", "numpy", "float"), "rgb": ("RGB", "numpy", "float"),
    "rgba": ("RGBA", "numpy", "float"),
    "torchl8": ("L", "torch", "uint8"), "torchrgb8": ("RGB", "torch", "uint8"),
    "torchrgba8": ("RGBA", "torch", "uint8"),
    "torchl": ("L", "torch", "float"), "torchrgb": ("RGB", "torch", "float"),
    "torchrgba": ("RGBA", "torch", "float"), "torch": ("RGB", "torch", "float"),
}


class ImageDecoder:
    """Decodes an image member with Pillow: a PIL image, an ``HxWxC`` numpy array (``HxW``
    for ``L``), or a ``CxHxW`` tensor; ``uint8``, or ``float32`` in [0, 1]. Picklable, so it
    goes to DataLoader workers with the dataset."""

    def __init__(self, name: str):
        if name not in IMAGE_MODES:
            raise OptionError(f"decode={name!r}: image modes are {', '.join(IMAGE_MODES)} "
                             "(or True / False)")
        try:
            import PIL.Image  # noqa: F401 - checked when the dataset is built
        except ImportError:
            raise OptionError(f"decode={name!r} decodes images with Pillow: "
                             "pip install 'wdstream[image]'") from None
        self.name = name
        self.mode, self.output, self.dtype = IMAGE_MODES[name]

    def __call__(self, data: bytes):
        from PIL import Image

        image = Image.open(io.BytesIO(data))
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


def build_decoders(decoders: Mapping[str, object] | None, images: str | None = None
                   ) -> dict[str, Callable]:
    """The default table (with images decoded as ``images``, a name of IMAGE_MODES, if given)
    updated with the user's: ``{ext: callable | "pickle" | "torch" | None}``; None removes a
    default (the member stays bytes)."""
    table = dict(DEFAULT_DECODERS)
    if _msgpack_installed():
        table.update(dict.fromkeys(("mp", "msgpack", "msg"), _msgpack))
    if images is not None:
        table.update(dict.fromkeys(IMAGE_EXTENSIONS, ImageDecoder(images)))
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


def decode_member(table: Mapping[str, Callable], name: str, value):
    """One member's value: decoded by the decoder of ``name`` (its extension), else bytes."""
    decoder = table.get(name)
    if decoder is None:
        inner, dot, last = name.rpartition(".")
        decoder = table.get(last)
        if decoder is gunzip and dot:  # NAME.gz: gunzipped, then decoded as NAME
            data = gunzip(value)
            inner_decoder = find_decoder(table, inner)
            return data if inner_decoder is None or inner_decoder is gunzip \
                else inner_decoder(data)
    return value if decoder is None else decoder(value)


def decode_sample(sample: dict, table: Mapping[str, Callable]) -> dict:
    """Decode each member whose extension (its last dotted part) has a decoder."""
    decoded = {}
    for name, value in sample.items():
        if name.startswith("__"):
            decoded[name] = value
            continue
        try:
            decoded[name] = decode_member(table, name, value)
        except Exception as error:  # any decoder failure names the sample
            raise decode_error(sample.get("__url__"), sample.get("__key__"), name,
                               error) from error
    return decoded


_UNSEEN = object()
_NAMES_KEPT = 256  # member names whose decoder a SampleDecoder remembers


class SampleDecoder:
    """``decode_sample`` for one stream: the decoder of each member name (or that it has
    none) is looked up once, not for every sample. ``kept``: a decoder of the table whose
    ``bytes`` values under ``kept_below`` bytes are left as they are (JSON that the main
    process decodes: ``stream.deferred``)."""

    __slots__ = ("table", "_by_name", "_kept", "_kept_below")

    def __init__(self, table: Mapping[str, Callable], kept: Callable | None = None,
                 kept_below: int = 0):
        self.table = table
        self._by_name: dict[str, Callable | None] = {}
        self._kept = _UNSEEN if kept is None else kept  # _UNSEEN: no decoder is kept
        self._kept_below = kept_below

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
                    decoder = partial(decode_member, table, name)
        if len(self._by_name) < _NAMES_KEPT:
            self._by_name[name] = decoder
        return decoder

    def __call__(self, sample: dict) -> dict:
        """``sample`` decoded in place (the reader's dict: nothing else holds it)."""
        by_name, kept, below = self._by_name, self._kept, self._kept_below
        for name, value in sample.items():  # values replaced, no key added: no resize
            decoder = by_name.get(name, _UNSEEN)
            if decoder is _UNSEEN:
                decoder = self._decoder(name)
            if decoder is None or (decoder is kept and type(value) is bytes
                                   and len(value) < below):
                continue
            try:
                sample[name] = decoder(value)
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
    """The error of a member that does not decode: its shard, sample and member."""
    return ShardError(f"{url}: sample {key!r}: cannot decode .{name}: {error}")
