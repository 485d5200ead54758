"""Bounds on what wdstream reads whole from storage, where a stranger writes it.

- **Sizes**: a small object read whole (a manifest, a config, a tokenizer) is read up to its
  kind's limit and refused past it, while reading: an endless HTTP body, ``/dev/zero`` or a
  huge file costs at most the limit. ``SIZE_LIMITS`` are far above any real dataset's (see
  docs/security.md); the environment variable
  ``WDSTREAM_MAX_<KIND>_BYTES`` (``WDSTREAM_MAX_MANIFEST_BYTES=4GiB``), read when an object is
  read, raises or lowers one.
- **Nesting**: JSON and YAML documents nest at most ``MAX_DEPTH`` levels, checked before a
  recursive parser walks them (``json_loads``), so a deep document is an error naming the
  file, never a ``RecursionError``.
"""

from __future__ import annotations

import json
import os
import re

from wdstream.errors import InputError
from wdstream.sizes import parse_size

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
    data = np.frombuffer(data, dtype=np.uint8)
    depth = deepest = quoted = 0
    for at in range(0, len(data), _STEP):
        chunk = data[at:at + _STEP]
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
