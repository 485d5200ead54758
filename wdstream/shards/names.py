"""What a shard name read from storage may be.

A manifest, a listing or a config is written by someone else, so what it names is data, never
an instruction: by default a shard named in a manifest is a relative name that stays under the
manifest's prefix. ``allow_external_shards=True`` (``--allow-external-shards`` on the command
line) also lets a manifest name shards elsewhere -- other buckets, prefixes or hosts, absolute
local paths -- for one manifest over several buckets. A ``pipe:`` command is never taken from
anything read from storage; ``pipe:`` works where the user writes it, in code or on the
command line. See docs/security.md.
"""

from __future__ import annotations

import posixpath
import re

from wdstream.sources.stores import store_for

# "pipe:", "s3:", "file:", "http:", "C:" ...: the start of a URL, a command or a drive
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_ENCODED_DOT_OR_SLASH = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def outside_prefix(name: str, prefix: str = "the manifest's prefix") -> str | None:
    """Why ``name`` is not a relative name under a prefix, or None if it is one."""
    if store_for(name).runs_command:
        return "a pipe: command"
    if "://" in name or _SCHEME.match(name):
        return f"a URL, not a name under {prefix}"
    if name.startswith(("/", "\\", "~")):
        return f"an absolute path, not a name under {prefix}"
    if ".." in name.replace("\\", "/").split("/"):
        return f"'..' would leave {prefix}"
    if "::" in name:
        return "'::' would chain another fsspec URL"
    if _ENCODED_DOT_OR_SLASH.search(name):  # an HTTP server decodes them: '%2e%2e' is '..'
        return f"a percent-encoded '.', '/' or '\\' could leave {prefix}"
    return None


def shard_name_problem(name: str, *, allow_external: bool = False) -> str | None:
    """Why a shard name from a manifest is refused, or None if it may be read.

    ``allow_external`` lets through URLs and paths outside the manifest's prefix; a ``pipe:``
    command is refused whatever it says."""
    if store_for(name).runs_command:
        return "a pipe: command; commands are never taken from a manifest"
    if allow_external:
        return None
    problem = outside_prefix(name)
    if problem is None:
        return None
    return f"{problem} (pass allow_external_shards=True, or --allow-external-shards, to read " \
           "shards outside the manifest's prefix)"


def same_shard_key(name: str) -> str:
    """A spelling of a shard name under which two names for the same object compare equal
    (``a.tar`` and ``./a.tar``)."""
    if "/" not in name or "://" in name or store_for(name).runs_command:
        return name
    return posixpath.normpath(name)
