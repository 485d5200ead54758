"""The dataset manifest, ``index.json`` under the dataset prefix.

Required keys (extra keys are kept in ``Manifest.extra``)::

    {"format": "wdstream", "version": 1, "samples": 5000, "bytes": 12345678,
     "extensions": ["json"],
     "shards": [{"url": "shard-000000.tar", "samples": 500, "bytes": 1234567, "sha256": "..."}]}

Optional per-shard keys ``head`` and ``last_key`` identify the shard's content cheaply (see
``wdstream.shards.identity``). Shard URLs are relative to the manifest's prefix, so a dataset can be copied to another bucket as
it is; a manifest read from storage may name shards elsewhere only when the reader opts in
(``allow_external_shards``, see ``wdstream.shards.names``). The top-level ``samples`` and
``bytes`` are the sums over the shards.

A manifest is read from storage, so it is checked as hostile input: duplicate keys, wrong
types, counts no tar can hold, the same shard twice or JSON nested deeper than a manifest
ever is are a ``ManifestError`` naming the manifest and the entry.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import re
from dataclasses import dataclass, field

import numpy as np

from wdstream.errors import ManifestError, StreamError
from wdstream.limits import MAX_DEPTH, NestingError, json_loads
from wdstream.printable import printable, short_repr
from wdstream.shards import compact, names
from wdstream.shards.compact import ShardArrays, ShardInfo
from wdstream.shards.compression import compression_of_name
from wdstream.shards.identity import HEAD_DIGITS, HEAD_PATTERN
from wdstream.sources import urls
from wdstream.sources.objects import exists, read_bytes, write_bytes

MANIFEST_NAME = "index.json"
FORMAT = "wdstream"
VERSION = 1

_REQUIRED = ("format", "version", "samples", "bytes", "extensions", "shards")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Every sample has at least one member, and every member a 512-byte header.
MIN_SAMPLE_BYTES = 512
# A compressed shard's stored bytes: its tar shrunk at most this many times (tar headers
# compress well, but not without bound).
MAX_COMPRESSION = 4096
# An empty tar: the end-of-archive marker, padded to tar's default 10 KiB record.
EMPTY_TAR_BYTES = 10240
# Larger than any shard anyone writes (16 TiB), and small enough that sums over millions of
# shards stay far inside int64 (the epoch plan's arithmetic).
MAX_SHARD_BYTES = 1 << 44


class ManifestNotFoundError(ManifestError):
    """There is no manifest at the given URL (callers may fall back to listing shards)."""


@dataclass
class Manifest:
    """A dataset's ``index.json``: its shards with their sample counts, bytes and digests.
    ``Manifest.from_json(text)`` reads one (every claim checked: docs/integrity.md),
    ``to_json()`` writes the stable text ``wdstream pack`` publishes.

    Args:
        shards (list[ShardInfo]): per shard: its URL (relative to ``base``), samples, bytes
            and sha256.
        extensions (list[str]): the member extensions the shards hold.
        extra (dict): keys beside the required ones (how it was packed, options).
        base (str | None): the prefix relative shard URLs resolve against.
        url (str | None): where it was read from; not written.
    """

    shards: list[ShardInfo]
    extensions: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    base: str | None = None  # the prefix relative shard URLs resolve against
    url: str | None = field(default=None, compare=False)  # where it was loaded from; not in JSON

    @property
    def samples(self) -> int:
        total = getattr(self.shards, "total_samples", None)  # compact.ShardArrays
        return total if total is not None else sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        total = getattr(self.shards, "total_bytes", None)
        return total if total is not None else sum(s.bytes for s in self.shards)

    def shard_url(self, i: int) -> str:
        """The URL to open shard ``i`` with."""
        # join() returns absolute URLs (s3://, pipe:, /path) unchanged
        return urls.join(self.base or "", self.shards[i].url)

    def to_json(self) -> str:
        """Stable text: required keys first, extra keys sorted, one line per shard last."""
        head = {
            "format": FORMAT,
            "version": VERSION,
            "samples": self.samples,
            "bytes": self.bytes,
            "extensions": sorted(self.extensions),
        }
        for key in sorted(self.extra):
            if key not in _REQUIRED:
                head[key] = self.extra[key]
        text = json.dumps(head, ensure_ascii=False)[:-1]  # without the closing brace
        shards = ",\n ".join(json.dumps(_shard_entry(s), ensure_ascii=False)
                              for s in self.shards)
        return f'{text}, "shards": [\n {shards}\n]}}\n' if shards else f'{text}, "shards": []}}\n'

    def fingerprint(self) -> str:
        """A short hash of the shard list (urls as stored, samples, bytes).

        Identifies the dataset for resume state; unchanged when the dataset is copied elsewhere.
        """
        if hasattr(self.shards, "fingerprint"):  # compact.ShardArrays: of the same text
            return self.shards.fingerprint()
        text = json.dumps([[s.url, s.samples, s.bytes] for s in self.shards],
                          separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @classmethod
    def from_json(
        cls, text: str | builtins.bytes, base: str | None = None, where: str = "manifest", *,
        allow_empty: bool = False,
    ) -> Manifest:
        """Parse and validate; ManifestError names ``where`` and the bad key. ``allow_empty``
        accepts a manifest without samples (a part of a run, to be merged)."""
        given, where = where, printable(where)
        fast = compact.parse_manifest(text)  # large manifests in to_json's layout, as arrays
        if fast is not None and _arrays_problem(fast[0], fast[1]):
            fast = None  # the general parser below names the entry
        if fast is not None:
            compact.release_free_memory()
        try:
            doc = (dict(fast[0], shards=fast[1]) if fast is not None
                   else json_loads(text, MAX_DEPTH, object_pairs_hook=_unique_keys))
        except _DuplicateKey as e:
            raise ManifestError(f"{where}: key {printable(repr(e.args[0]))} appears twice in "
                                "one object") from None
        except NestingError:
            raise ManifestError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; no "
                                "manifest is") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ManifestError(f"{where}: not valid JSON ({e})") from None
        return cls.from_doc(doc, base, given, allow_empty=allow_empty)

    @classmethod
    def from_doc(cls, doc, base: str | None = None, where: str = "manifest", *,
                 allow_empty: bool = False) -> Manifest:
        """``from_json`` of a parsed document (its ``shards`` a list of dicts, or
        ``compact.ShardArrays`` already checked)."""
        where = printable(where)
        _check_head(doc, where)
        shards = doc["shards"]
        if not isinstance(shards, list | ShardArrays):
            raise _bad(where, "shards", "a list", shards)
        if isinstance(shards, list):  # ShardArrays come checked (_arrays_problem)
            # written by ``pack --compress``; otherwise each shard's name says it
            shards = _shard_list(shards, where, isinstance(doc.get("compression"), dict))
        manifest = cls(shards=shards, extensions=list(doc["extensions"]),
                       extra={k: v for k, v in doc.items() if k not in _REQUIRED}, base=base)
        for key in ("samples", "bytes"):
            if doc[key] != getattr(manifest, key):
                raise _bad(where, key, f"the sum over the shards ({getattr(manifest, key)})",
                           doc[key])
        if manifest.samples < 1 and not allow_empty:
            raise _bad(where, "samples", "at least 1 (a dataset without samples cannot be read)",
                       doc["samples"])
        return manifest


def _bad(where: str, key: str, expected: str, value) -> ManifestError:
    got = "missing" if value is _MISSING else f"got {short_repr(value)}"
    return ManifestError(f"{where}: key {key!r}: expected {expected}, {got}")


def _check_head(doc, where: str) -> None:
    """ManifestError unless ``doc`` is an object with the required keys, of this format and
    version, its extensions a list of strings and its extra keys not nested too deep."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    extra = [v for k, v in doc.items() if k not in _REQUIRED]
    if _too_deep(extra, MAX_DEPTH):  # kept and shown; the shards' own keys are checked later
        raise ManifestError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; no "
                            "manifest is")
    for key in _REQUIRED:
        if key not in doc:
            raise _bad(where, key, "a value", _MISSING)
    if doc["format"] != FORMAT:
        raise _bad(where, "format", repr(FORMAT), doc["format"])
    if not _is_count(doc["version"]):
        raise _bad(where, "version", "an integer", doc["version"])
    if doc["version"] > VERSION:
        raise ManifestError(
            f"{where}: key 'version': {doc['version']} is newer than this wdstream reads "
            f"({VERSION}); upgrade wdstream"
        )
    extensions = doc["extensions"]
    if not isinstance(extensions, list) or not all(isinstance(e, str) for e in extensions):
        raise _bad(where, "extensions", "a list of strings", extensions)


def _shard_list(entries: list, where: str, compressed: bool) -> list[ShardInfo]:
    """The shards of a manifest's list, each checked (``_shard_info``), none listed twice."""
    seen: dict[str, int] = {}
    shards = []
    for i, entry in enumerate(entries):
        shard = _shard_info(entry, f"shards[{i}]", where, compressed)
        url = shard.url
        key = names.same_shard_key(url) if "/" in url else url
        if key in seen:
            raise _bad(where, f"shards[{i}].url", f"a shard not already listed "
                       f"(shards[{seen[key]}] is the same)", url)
        seen[key] = i
        shards.append(shard)
    return shards


def _shard_info(entry, name: str, where: str, compressed: bool) -> ShardInfo:
    """The shard of one entry of a manifest's list; ManifestError naming it and the key."""
    if not isinstance(entry, dict):
        raise _bad(where, name, "an object", entry)
    url = entry.get("url", _MISSING)
    if not isinstance(url, str) or not url:
        raise _bad(where, f"{name}.url", "a non-empty string", url)
    if not url.isprintable():
        raise _bad(where, f"{name}.url", "a name without control characters", url)
    for key in ("samples", "bytes"):
        if not _is_count(entry.get(key, _MISSING)):
            raise _bad(where, f"{name}.{key}", "a non-negative integer", entry.get(key, _MISSING))
    samples, nbytes = entry["samples"], entry["bytes"]
    problem = count_problem(samples, nbytes, compressed or compression_of_name(url) is not None)
    if problem is not None:
        raise _bad(where, f"{name}.bytes", problem, nbytes)
    sha256 = entry.get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise _bad(where, f"{name}.sha256", "64 lowercase hex digits or null", sha256)
    head, last_key = entry.get("head"), entry.get("last_key")
    if head is not None and not (isinstance(head, str) and HEAD_PATTERN.fullmatch(head)):
        raise _bad(where, f"{name}.head", f"{HEAD_DIGITS} lowercase hex digits or null", head)
    if last_key is not None and not isinstance(last_key, str):
        raise _bad(where, f"{name}.last_key", "a string or null", last_key)
    return ShardInfo(url, samples, nbytes, sha256, head, last_key)


_MISSING = object()


def _shard_entry(shard: ShardInfo) -> dict:
    entry = {"url": shard.url, "samples": shard.samples, "bytes": shard.bytes,
             "sha256": shard.sha256}
    if shard.head is not None:  # identity keys: only where known (older manifests have none)
        entry["head"] = shard.head
    if shard.last_key is not None:
        entry["last_key"] = shard.last_key
    return entry


def count_problem(samples: int, nbytes: int, compressed: bool = False) -> str | None:
    """What is impossible about a shard of ``samples`` samples in ``nbytes`` bytes (stored
    bytes, for a ``compressed`` shard), or None."""
    if compressed:
        if nbytes * MAX_COMPRESSION < samples * MIN_SAMPLE_BYTES:
            return (f"at least {MIN_SAMPLE_BYTES}/{MAX_COMPRESSION} per sample of a compressed "
                    f"shard ({samples:,} samples)")
        return None if nbytes <= MAX_SHARD_BYTES else f"at most {MAX_SHARD_BYTES:,} (16 TiB)"
    if nbytes > MAX_SHARD_BYTES:
        return f"at most {MAX_SHARD_BYTES:,} (16 TiB)"
    if samples == 0 and nbytes > EMPTY_TAR_BYTES:
        return (f"at most {EMPTY_TAR_BYTES:,} for a shard without samples (an empty tar); "
                "'samples' is 0")
    if nbytes < samples * MIN_SAMPLE_BYTES:
        return (f"at least {MIN_SAMPLE_BYTES} per sample ({samples:,} samples need "
                f"{samples * MIN_SAMPLE_BYTES:,})")
    return None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' object_pairs_hook: a key twice in one object is an error (JSON parsers
    disagree on which value wins)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return doc


def _arrays_problem(head: dict, shards) -> bool:
    """Whether the shards the fast parser read as arrays (``compact.ShardArrays``: plain
    relative names, counts, digests) break a rule ``from_json`` checks entry by entry: a count
    no shard can hold, or the same name twice. The general parser then names the entry."""
    samples, sizes = shards.samples, shards.bytes
    compressed = shards.compressed_names() | isinstance(head.get("compression"), dict)
    plain = ~compressed
    if (sizes > MAX_SHARD_BYTES).any():
        return True
    if (plain & (samples == 0) & (sizes > EMPTY_TAR_BYTES)).any():
        return True
    low = np.where(plain, sizes, sizes * MAX_COMPRESSION) < samples * MIN_SAMPLE_BYTES
    return bool(low.any()) or shards.has_duplicate_names()


def _too_deep(doc, limit: int) -> bool:
    """Whether containers nest more than ``limit`` deep (without recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def manifest_location(source: str) -> tuple[str, str]:
    """(manifest URL, base) for a manifest URL ending in .json or a dataset prefix."""
    if source.endswith(".json"):
        return source, urls.parent(source)
    return urls.join(source, MANIFEST_NAME), source


def load_manifest(source: str, *, allow_external_shards: bool = False,
                  allow_empty: bool = False, share=False) -> Manifest:
    """Read a manifest from a URL ending in .json, or ``prefix/index.json`` for a prefix
    (``allow_empty``: one without samples, such as a part of a run to merge).

    ``share``: True or a directory: a large manifest is parsed once per node and the
    processes of the node map its arrays from there (``wdstream.shards.shared``); False:
    this process reads and parses its own copy.

    Raises ManifestNotFoundError (a ManifestError) when there is none, ManifestError when it is
    invalid or names a shard it may not (``check_shard_names``); other read failures propagate
    as StreamError.
    """
    url, base = manifest_location(source)

    def parse(text: bytes) -> Manifest:
        return Manifest.from_json(text, base=base, where=url, allow_empty=allow_empty)

    manifest = None
    if share:
        # shared builds the Manifest this module defines: imported here, a real cycle
        from wdstream.shards.shared import shared_manifest

        manifest = shared_manifest(url, base, lambda: _read_manifest(url), parse,
                                   None if share is True else share)
    if manifest is None:
        manifest = parse(_read_manifest(url))
    manifest.url = url
    check_shard_names(manifest, allow_external=allow_external_shards)
    return manifest


def _read_manifest(url: str) -> bytes:
    try:
        return read_bytes(url, limit="manifest", error=ManifestError)
    except StreamError as e:
        # Ask again rather than parse the error text: the back-ends word "not found" differently.
        if e.transient or exists(url):
            raise
        raise ManifestNotFoundError(f"{url}: no manifest found") from None


def check_shard_names(manifest: Manifest, *, allow_external: bool = False) -> None:
    """ManifestError naming the manifest and the entry if a shard URL is not a name under the
    manifest's prefix (unless ``allow_external``) or is a ``pipe:`` command (always)."""
    if hasattr(manifest.shards, "columns"):  # compact.ShardArrays: plain relative names only
        return
    where = manifest.url or manifest.base or "manifest"
    for i, shard in enumerate(manifest.shards):
        problem = names.shard_name_problem(shard.url, allow_external=allow_external)
        if problem is not None:
            raise ManifestError(f"{where}: shards[{i}].url {short_repr(shard.url)}: {problem}")


def write_manifest(
    manifest: Manifest, prefix: str, via: str = "auto", name: str = MANIFEST_NAME
) -> str:
    """Write ``prefix/index.json`` (atomically for local files) and return its URL.

    ``name``: another file name under ``prefix``, e.g. a part manifest
    ``index.part-002-of-008.json`` of ``wdstream pack --part``."""
    url = urls.join(prefix, name)
    write_bytes(url, manifest.to_json().encode("utf-8"), via=via)
    return url
