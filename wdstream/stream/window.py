"""The shuffle window's bound in bytes: a sample count derived from the manifest, so that the
plan (and so resume) stays a function of the manifest and the options alone."""

from __future__ import annotations

from wdstream.errors import InputError
from wdstream.sizes import parse_size

DEFAULT_SHUFFLE_BYTES = 256 << 20


def bounded_window(window: int, shuffle_bytes, manifest) -> int:
    """``window`` samples, or fewer: at most ``shuffle_bytes`` over the manifest's mean sample
    size (at least 1). Without a manifest, or with ``shuffle_bytes=None``, ``window``."""
    if shuffle_bytes is None:
        return window
    limit = parse_size(shuffle_bytes)  # InputError naming the text
    if limit <= 0:
        raise InputError(f"shuffle_bytes must be positive, got {shuffle_bytes!r}")
    if manifest is None or not manifest.samples:
        return window
    mean = manifest.bytes / manifest.samples
    return max(1, min(window, int(limit // mean)))
