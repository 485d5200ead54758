"""URL helpers: schemes, joining, parents, brace expansion.

A "URL" here is any of: a local path (``/data/x.tar``, ``data/x.tar``), ``file:///data/x.tar``,
``s3://bucket/key``, ``gs://bucket/key``, another fsspec URL (``memory://x``), or
``pipe:COMMAND`` (a shell command whose stdout is the data).

Pure string functions: nothing here touches the network or the disk.
"""

from __future__ import annotations

import os
import re
import string

from wdstream.errors import InputError

# Aliases folded into the names the rest of wdstream switches on.
_SCHEME_ALIASES = {"file": "file", "local": "file", "s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs"}


def scheme(url: str) -> str:
    """"file", "s3", "gs", "pipe", or the URL's own fsspec protocol ("memory", "https", ...)."""
    if url.startswith("pipe:"):
        return "pipe"
    if "://" not in url:
        return "file"
    protocol = url.split("://", 1)[0].lower()
    return _SCHEME_ALIASES.get(protocol, protocol)


def to_local_path(url: str) -> str | None:
    """The filesystem path of a local URL (plain path or ``file://``), else None."""
    if scheme(url) != "file":
        return None
    if "://" in url:
        return url.split("://", 1)[1]
    return url


def local_path(url: str) -> str:
    """The filesystem path of ``url``, which the caller knows is local; InputError if not."""
    path = to_local_path(url)
    if path is None:
        raise InputError(f"{url}: not a local path")
    return path


def is_absolute(name: str) -> bool:
    """True for names that do not resolve against a prefix: URLs, pipes, absolute paths."""
    return "://" in name or name.startswith("pipe:") or os.path.isabs(name)


def join(prefix: str, name: str) -> str:
    """``join("s3://b/p/", "x.tar") -> "s3://b/p/x.tar"``; an absolute ``name`` is returned as is.

    A missing trailing slash on the prefix is added (``"s3://b/p" + "x.tar"`` gives the same).
    """
    if is_absolute(name) or not prefix:
        return name
    if scheme(prefix) == "file" and "://" not in prefix:
        return os.path.join(prefix, name)
    return prefix.rstrip("/") + "/" + name


def child(prefix: str, name: str) -> str:
    """The URL of the object ``name``, as a listing returned it, directly under ``prefix``.

    Unlike ``join`` the name is never taken as a URL, a command or an absolute path of its own
    (listings are read from storage): a file named ``pipe:cmd.tar`` in the current folder is
    ``./pipe:cmd.tar``, under ``s3://b/p/`` it is ``s3://b/p/pipe:cmd.tar``."""
    if scheme(prefix) == "file" and "://" not in prefix:
        if not prefix:
            return "./" + name if is_absolute(name) else name
        return (prefix if prefix.endswith("/") else prefix + "/") + name
    return prefix.rstrip("/") + "/" + name


def parent(url: str) -> str:
    """The prefix, with its trailing slash, that names next to ``url`` resolve against:
    ``parent("s3://b/p/index.json") -> "s3://b/p/"``, ``parent("/d/index.json") -> "/d/"``,
    ``parent("index.json") -> ""`` (the current directory)."""
    if scheme(url) == "pipe":
        raise InputError(f"{url}: a pipe: source has no parent prefix")
    if "://" in url:
        protocol, rest = url.split("://", 1)
        head, sep, _ = rest.rpartition("/")
        return f"{protocol}://{head}/" if sep else f"{protocol}://"
    head, sep, _ = url.rpartition("/")
    return head + "/" if sep else ""


def relative_to(url: str, base: str) -> str:
    """``url`` relative to the prefix ``base`` when it lies under it; else a local path made
    absolute (a relative one would later resolve against the wrong prefix), or any other URL
    unchanged.

    So ``join(base, relative_to(url, base)) == url`` whenever both are written the same way;
    manifests use this to store shard names relative to the manifest's folder. Local paths
    (plain or ``file://``) are compared as absolute, normalised paths.
    """
    path, root = to_local_path(url), to_local_path(base)
    if path is not None and root is not None:
        path, root = os.path.abspath(path), os.path.abspath(root)
        if path != root and os.path.commonpath([path, root]) == root:
            return os.path.relpath(path, root).replace(os.sep, "/")
        return path
    if not base:
        return url
    folder = base.rstrip("/") + "/"
    if url.startswith(folder) and len(url) > len(folder):
        return url[len(folder):]
    return url


def bucket_key(url: str) -> tuple[str, str]:
    """``"s3://bucket/a/b.tar" -> ("bucket", "a/b.tar")`` for s3:// and gs:// URLs."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    bucket, _, key = rest.partition("/")
    if scheme(url) not in ("s3", "gs") or not bucket:
        raise InputError(f"{url}: not an s3:// or gs:// URL with a bucket")
    return bucket, key


def object_key(url: str) -> tuple[str, str] | None:
    """``bucket_key`` of an object URL; None for a bucket or a "folder" (``.../``)."""
    bucket, key = bucket_key(url)
    return None if not key or key.endswith("/") else (bucket, key)


def expand(source: str | os.PathLike | list | tuple) -> list[str]:
    """A URL, a brace pattern or a list of them -> the list of URLs, in order.

    ``"s3://b/shard-{000000..000099}.tar"`` gives 100 URLs (the ``braceexpand`` rules that
    webdataset uses); a list has each of its items expanded.
    """
    from braceexpand import braceexpand

    if isinstance(source, str | os.PathLike):
        items = [os.fspath(source)]
    elif isinstance(source, list | tuple):
        items = [os.fspath(item) if isinstance(item, os.PathLike) else item for item in source]
    else:
        raise InputError(f"expected a URL, a brace pattern or a list of URLs, got {source!r}")
    urls: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise InputError(f"expected a non-empty URL string, got {item!r}")
        urls.extend(braceexpand(item))
    if not urls:
        raise InputError("no URLs given")
    return urls


# How deeply braces may nest in a pattern whose names are counted (braceexpand recurses once
# per level); far deeper than any real pattern.
MAX_BRACE_DEPTH = 32
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase  # braceexpand's letters


def expansion_count(pattern: str, most: int) -> int:
    """How many names ``expand(pattern)`` gives, counted without making them, by the rules of
    ``braceexpand`` (0.1.x, which ``expand`` uses): ``most + 1`` when more (or braces nested
    deeper than ``MAX_BRACE_DEPTH``), so a pattern such as ``{1..10000000000000}`` can be
    refused before ``braceexpand`` makes every name of it."""
    return min(_pattern_count(pattern, most, 0), most + 1)


def _pattern_count(pattern: str, most: int, depth: int) -> int:
    """braceexpand's ``parse_pattern``, counting: the product of its parts."""
    if depth > MAX_BRACE_DEPTH:
        return most + 1
    total, start, level, pos = 1, 0, 0, 0
    while pos < len(pattern):
        if pattern[pos] == "\\":
            pos += 2
            continue
        if pattern[pos] == "{":
            start = pos if level == 0 else start
            level += 1
        elif pattern[pos] == "}":
            level -= 1
            if level == 0:
                inner = _expression_count(pattern[start + 1:pos], most, depth + 1)
                total = min(total * inner, most + 1)
        pos += 1
    return total if level == 0 else 1  # unbalanced: braceexpand raises before any name


def _expression_count(expr: str, most: int, depth: int) -> int:
    """braceexpand's ``parse_expression``: a range, a sequence, or braces kept as text."""
    numbers = _INT_RANGE.match(expr)
    if numbers:
        first, last, step = int(numbers[1]), int(numbers[2]), int(numbers[3] or 1) or 1
        return abs(last - first) // step + 1
    letters = _CHAR_RANGE.match(expr)
    if letters:
        step = int(letters[3] or 1) or 1
        first, last = _ALPHABET.index(letters[1]), _ALPHABET.index(letters[2])
        return min(abs(last - first) // step + 1, len(_ALPHABET))
    counts, start, level, pos = [], 0, 0, 0
    while pos < len(expr):
        if expr[pos] == "\\":
            pos += 2
            continue
        level += {"{": 1, "}": -1}.get(expr[pos], 0)
        if expr[pos] == "," and level == 0:
            counts.append(_pattern_count(expr[start:pos], most, depth))
            start = pos + 1
        pos += 1
    if level != 0 or not counts:
        return _pattern_count(expr, most, depth)  # not a sequence: "{" + its text + "}"
    return min(sum(counts) + _pattern_count(expr[start:], most, depth), most + 1)
