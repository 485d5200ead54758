"""``Limits``: how much hostile data may make the reader expand, decompress and decode.

Shard bytes are bounded by the manifest or the listing; what they expand to is bounded here:
a compressed shard's tar bytes, one sample's members and what decoding makes of them, the
memory a decompressor may ask for, and images (their pixel count, the formats Pillow may
read). Each limit is checked while decompressing or decoding, before the bytes it bounds are
made, and going past one is a ``ShardError`` naming the shard, the member and the limit. The
defaults are far above what real datasets need; raise one for a dataset that does need more
(docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from wdstream.errors import InputError, OptionError, OptionTypeError
from wdstream.sizes import parse_size

# Image formats Pillow reads by default: its own decoders, in this process.
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM")
# Formats whose Pillow plugin runs another program on the data (EPS and PostScript: Ghostscript)
# or has no reader: never read, whatever the options say.
NEVER_IMAGE_FORMATS = ("EPS", "PS", "PDF")


@dataclass(frozen=True)
class Limits:
    """``shard_bytes``: the tar bytes one compressed shard may decompress to (64 GiB).
    ``sample_bytes``: one sample's members as read (a member's size as its tar header gives
    it, before it is read) plus what decoding makes of them (gunzipped bytes, an image's
    pixels, a JSON member's objects: 1 GiB). ``decoder_memory``: what a decompressor may
    allocate for its window (zstd's window, xz's dictionary: 128 MiB; gzip and bzip2 need a
    few MiB at most). ``image_pixels``: width x height of one image (100 million), checked
    from its header before its pixels are decoded. ``image_formats``: the Pillow formats
    images are read as (JPEG, PNG, WebP, GIF, BMP, TIFF, PPM; add others by name, such as
    ``"JPEG2000"``); EPS, PS and PDF are refused. Sizes are numbers of bytes or strings such
    as ``"4GiB"``."""

    shard_bytes: int | str = 64 << 30
    sample_bytes: int | str = 1 << 30
    decoder_memory: int | str = 128 << 20
    image_pixels: int = 100_000_000
    image_formats: tuple[str, ...] = IMAGE_FORMATS

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
