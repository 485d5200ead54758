"""Human sizes: ``1000000``, ``500kB``, ``256MB``, ``1GB`` (powers of 1000) and
``512KiB``, ``256MiB``, ``1GiB`` (powers of 1024); the unit is case-insensitive."""

from __future__ import annotations

import re

from wdstream.errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """A size in bytes; an ``InputError`` naming the text when it is not a size.

    Args:
        text (str | int): ``1000000``, ``500kB``, ``256MB``, ``1GB`` (powers of 1000) or
            ``512KiB``, ``256MiB``, ``1GiB`` (powers of 1024), the unit in any case.
    """
    if isinstance(text, int):
        if text < 0:
            raise InputError(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InputError(
            f"not a size: {text!r} (use e.g. 1000000, 500kB, 256MB, 1GB, 512KiB, 256MiB, 1GiB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(nbytes: float) -> str:
    """Bytes with powers of 1000, as tables show them: ``12.3 MB``.

    Args:
        nbytes (float): the size in bytes.
    """
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(nbytes) < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")
