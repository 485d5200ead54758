"""Bounds on what data written by a stranger may make wdstream read, expand and parse.

- **Expansion** (``Limits``): shard bytes are bounded by the manifest or the listing; what they
  expand to is bounded here: a compressed shard's tar bytes, one sample's members and what
  decoding makes of them, the memory a decompressor may ask for, and images (their pixel
  count, the formats Pillow may read). Each limit is checked while decompressing or
  decoding, before the bytes it bounds are made; going past one is a ``LimitError`` naming the
  shard, the member and the limit.
- **Sizes**: a small object read whole (a manifest, a config, a tokenizer) is read up to its
  kind's limit and refused past it, while reading: an endless HTTP body, ``/dev/zero`` or a
  huge file costs at most the limit. ``SIZE_LIMITS`` are far above any real dataset's; the
  environment variable ``WDSTREAM_MAX_<KIND>_BYTES`` (``WDSTREAM_MAX_MANIFEST_BYTES=4GiB``),
  read when an object is read, raises or lowers one.
- **Nesting**: JSON and YAML documents nest at most ``MAX_DEPTH`` levels, checked before a
  recursive parser walks them (``json_loads``), so a deep document is an error naming the
  file, never a ``RecursionError``.

The defaults are far above what real datasets need (docs/security.md).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from wdstream.errors import InputError, OptionError, OptionTypeError
from wdstream.sizes import parse_size

# Image formats Pillow reads by default: its own decoders, in this process.
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM")
# Formats whose Pillow plugin runs another program on the data (EPS and PostScript: Ghostscript)
# or has no reader: never read, whatever the options say.
NEVER_IMAGE_FORMATS = ("EPS", "PS", "PDF")


@dataclass(frozen=True)
class Limits:
    """The bounds on what shards from storage may make the reader expand to; going past one is
    a ``LimitError`` naming the shard, member and limit. Sizes are numbers of bytes or strings
    such as ``"4GiB"``.

    Args:
        shard_bytes (int | str, default 64 GiB): the tar bytes one compressed shard may
            decompress to, and the lines (blank ones included) of a compressed JSON Lines
            file.
        sample_bytes (int | str, default 1 GiB): one sample's members as read (a member's
            size from its tar header, before it is read) plus what decoding makes of them
            (gunzipped bytes, an image's pixels, a JSON member's objects).
        decoder_memory (int | str, default 128 MiB): what a decompressor may allocate for its
            window (zstd's window, xz's dictionary; gzip and bzip2 need a few MiB at most).
        image_pixels (int, default 100 million): width x height of one image, checked from
            its header before its pixels are decoded.
        unit_bytes (int | str, default 2 GiB): what one unit of a raw file (a Parquet row
            group's columns, the Arrow record batches read together, a plain JSON Lines file's
            byte range) may take decoded, from what its page or message headers (or its
            plan) declare, checked before anything is read, decoded or decompressed.
        image_formats (tuple[str, ...]): the Pillow formats images are read as (JPEG, PNG,
            WebP, GIF, BMP, TIFF, PPM; add others by name, such as ``"JPEG2000"``); EPS, PS
            and PDF are refused.
    """

    shard_bytes: int = 64 << 30
    sample_bytes: int = 1 << 30
    decoder_memory: int = 128 << 20
    image_pixels: int = 100_000_000
    image_formats: tuple[str, ...] = IMAGE_FORMATS
    unit_bytes: int = 2 << 30

    if TYPE_CHECKING:  # sizes are given as numbers or strings, and read as numbers of bytes
        def __init__(self, shard_bytes: int | str = ..., sample_bytes: int | str = ...,
                     decoder_memory: int | str = ..., image_pixels: int = ...,
                     image_formats: tuple[str, ...] = ...,
                     unit_bytes: int | str = ...) -> None: ...

    def __post_init__(self):
        for field in fields(self):
            if field.name == "image_formats":
                object.__setattr__(self, field.name, _formats(self.image_formats))
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise OptionTypeError(f"Limits: {field.name} must be a number of bytes or a "
                                      f"size such as '4GiB', not {value!r:.80}")
            try:
                size = parse_size(value)
            except InputError as error:
                raise OptionError(f"Limits: {field.name}: {error}") from None
            if size < 1:
                raise OptionError(f"Limits: {field.name} must be at least 1, not {value!r}")
            object.__setattr__(self, field.name, size)


def _formats(value) -> tuple[str, ...]:
    """``image_formats`` as Pillow's upper-case names; OptionError for a format never read."""
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise OptionTypeError(f"Limits: image_formats must be a tuple of Pillow format names "
                              f"such as {IMAGE_FORMATS!r}, not {value!r:.80}")
    names = tuple(dict.fromkeys(item.upper() for item in value))
    refused = [name for name in names if name in NEVER_IMAGE_FORMATS]
    if refused:
        raise OptionError(f"Limits: image_formats: {', '.join(refused)} is never read (Pillow "
                          "runs Ghostscript on EPS and PostScript, and reads no PDF)")
    return names


def checked_limits(owner: str, value) -> Limits:
    """``value`` (a ``Limits``, or None for the defaults) as a ``Limits``."""
    if value is None:
        return Limits()
    if not isinstance(value, Limits):
        raise OptionTypeError(f"{owner}: limits must be a wdstream.Limits or None, not "
                              f"{value!r:.80}")
    return value


SIZE_LIMITS = {
    "manifest": 1 << 30,  # index.json, part manifests, merged manifests
    "config": 16 << 20,  # from_config's YAML or JSON files
    "tokenizer": 256 << 20,  # tokenizer.json
    "object": 1 << 30,  # any other object read whole (read_bytes' default)
}
# Deeper than any manifest's or config's structure (a config's deepest value is a few levels
# down); the recursive parsers of JSON and YAML overflow the stack near 1000.
MAX_DEPTH = 32


def size_variable(kind: str) -> str:
    """The environment variable that sets the limit of ``kind``."""
    return f"WDSTREAM_MAX_{kind.upper()}_BYTES"


def size_limit(kind: str) -> int:
    """The most bytes an object of ``kind`` (a key of ``SIZE_LIMITS``) may have: its
    environment variable's size if set, else the default."""
    variable = size_variable(kind)
    setting = os.environ.get(variable, "").strip()
    if not setting:
        return SIZE_LIMITS[kind]
    try:
        return parse_size(setting)
    except InputError:
        raise InputError(f"{variable}={setting!r}: not a size (use e.g. 64MiB, 2GiB, "
                         "1000000)") from None


class NestingError(ValueError):
    """A JSON document nested deeper than the limit (a ``ValueError``, as the JSON parser's
    own errors, so that a caller's handling of invalid JSON names the file)."""


# A JSON string, or a quote that opens one never closed (to the end of the text): possessive,
# so that each match is found on its first attempt and stripping stays linear in the text.
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\Z)', re.DOTALL)
_STEP = 1 << 22  # bytes looked at a time


def json_depth(text: bytes | str, limit: int = MAX_DEPTH) -> int:
    """How deep the arrays and objects of a JSON text nest (no parse: brackets counted outside
    strings); past ``limit``, a number above it, counting stopped there. Without a backslash
    in the text every quote opens or closes a string; with one, strings are stripped first."""
    import numpy as np

    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if b"\\" in data:
        data = _STRING.sub(b"", data)
    codes = np.frombuffer(data, dtype=np.uint8)
    depth = deepest = quoted = 0
    for at in range(0, len(codes), _STEP):
        chunk = codes[at:at + _STEP]
        outside = (np.cumsum(chunk == ord('"'), dtype=np.int32) + quoted) % 2 == 0
        opens = ((chunk == ord("[")) | (chunk == ord("{"))) & outside
        brackets = np.flatnonzero(opens | ((chunk == ord("]")) | (chunk == ord("}"))) & outside)
        quoted = (quoted + int(np.count_nonzero(chunk == ord('"')))) % 2
        if not len(brackets):
            continue
        levels = depth + np.cumsum(np.where(opens[brackets], 1, -1))
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        if deepest > limit:
            break
    return deepest


def json_loads(text: bytes | str, limit: int = MAX_DEPTH, **options):
    """``json.loads(text, **options)`` of a document that nests at most ``limit`` levels;
    ``NestingError`` (a ``ValueError``) for a deeper one, before it is parsed."""
    if json_depth(text, limit) > limit:
        raise NestingError(f"nested deeper than {limit} levels")
    return json.loads(text, **options)
