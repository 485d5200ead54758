"""The dataset manifest, ``index.json`` under the dataset prefix.

Required keys (extra keys are kept in ``Manifest.extra``)::

    {"format": "wdstream", "version": 1, "samples": 5000, "bytes": 12345678,
     "extensions": ["json"],
     "shards": [{"url": "shard-000000.tar", "samples": 500, "bytes": 1234567, "sha256": "..."}]}

Optional per-shard keys ``head`` and ``last_key`` identify the shard's content cheaply (see
``wdstream.shards.identity``). Shard URLs are relative to the manifest's prefix unless absolute, so a dataset can be copied to
another bucket as it is. The top-level ``samples`` and ``bytes`` are the sums over the shards.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from ..errors import ManifestError, StreamError
from ..sources import urls
from .identity import HEAD_DIGITS, HEAD_PATTERN

MANIFEST_NAME = "index.json"
FORMAT = "wdstream"
VERSION = 1

_REQUIRED = ("format", "version", "samples", "bytes", "extensions", "shards")
_SHARD_KEYS = ("url", "samples", "bytes", "sha256")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestNotFoundError(ManifestError):
    """There is no manifest at the given URL (callers may fall back to listing shards)."""


@dataclass(frozen=True)
class ShardInfo:
    url: str  # as stored: relative to the manifest's base, or absolute
    samples: int
    bytes: int
    sha256: str | None = None
    head: str | None = None  # wdstream.shards.identity: digest of the first bytes
    last_key: str | None = None  # the key of the shard's last sample


@dataclass
class Manifest:
    shards: list[ShardInfo]
    extensions: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    base: str | None = None  # the prefix relative shard URLs resolve against
    url: str | None = field(default=None, compare=False)  # where it was loaded from; not in JSON

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

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
        text = json.dumps([[s.url, s.samples, s.bytes] for s in self.shards], separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @classmethod
    def from_json(
        cls, text: str | bytes, base: str | None = None, where: str = "manifest"
    ) -> Manifest:
        """Parse and validate; ManifestError names ``where`` and the bad key."""
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ManifestError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(doc).__name__}")

        def bad(key: str, expected: str, value=None) -> ManifestError:
            got = "missing" if value is _MISSING else f"got {value!r}"
            return ManifestError(f"{where}: key {key!r}: expected {expected}, {got}")

        for key in _REQUIRED:
            if key not in doc:
                raise bad(key, "a value", _MISSING)
        if doc["format"] != FORMAT:
            raise bad("format", repr(FORMAT), doc["format"])
        if not _is_count(doc["version"]):
            raise bad("version", "an integer", doc["version"])
        if doc["version"] > VERSION:
            raise ManifestError(
                f"{where}: key 'version': {doc['version']} is newer than this wdstream reads "
                f"({VERSION}); upgrade wdstream"
            )
        extensions = doc["extensions"]
        if not isinstance(extensions, list) or not all(isinstance(e, str) for e in extensions):
            raise bad("extensions", "a list of strings", extensions)
        if not isinstance(doc["shards"], list):
            raise bad("shards", "a list", doc["shards"])

        shards = []
        for i, entry in enumerate(doc["shards"]):
            name = f"shards[{i}]"
            if not isinstance(entry, dict):
                raise bad(name, "an object", entry)
            url = entry.get("url", _MISSING)
            if not isinstance(url, str) or not url:
                raise bad(f"{name}.url", "a non-empty string", url)
            for key in ("samples", "bytes"):
                if not _is_count(entry.get(key, _MISSING)):
                    raise bad(f"{name}.{key}", "a non-negative integer", entry.get(key, _MISSING))
            sha256 = entry.get("sha256")
            if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
                raise bad(f"{name}.sha256", "64 lowercase hex digits or null", sha256)
            head, last_key = entry.get("head"), entry.get("last_key")
            if head is not None and not (isinstance(head, str) and HEAD_PATTERN.fullmatch(head)):
                raise bad(f"{name}.head", f"{HEAD_DIGITS} lowercase hex digits or null", head)
            if last_key is not None and not isinstance(last_key, str):
                raise bad(f"{name}.last_key", "a string or null", last_key)
            shards.append(ShardInfo(url, entry["samples"], entry["bytes"], sha256, head,
                                    last_key))

        manifest = cls(
            shards=shards,
            extensions=list(extensions),
            extra={k: v for k, v in doc.items() if k not in _REQUIRED},
            base=base,
        )
        for key in ("samples", "bytes"):
            if doc[key] != getattr(manifest, key):
                raise bad(key, f"the sum over the shards ({getattr(manifest, key)})", doc[key])
        return manifest


_MISSING = object()


def _shard_entry(shard: ShardInfo) -> dict:
    entry = {"url": shard.url, "samples": shard.samples, "bytes": shard.bytes,
             "sha256": shard.sha256}
    if shard.head is not None:  # identity keys: only where known (older manifests have none)
        entry["head"] = shard.head
    if shard.last_key is not None:
        entry["last_key"] = shard.last_key
    return entry


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def manifest_location(source: str) -> tuple[str, str]:
    """(manifest URL, base) for a manifest URL ending in .json or a dataset prefix."""
    if source.endswith(".json"):
        return source, urls.parent(source)
    return urls.join(source, MANIFEST_NAME), source


def load_manifest(source: str) -> Manifest:
    """Read a manifest from a URL ending in .json, or ``prefix/index.json`` for a prefix.

    Raises ManifestNotFoundError (a ManifestError) when there is none, ManifestError when it is
    invalid; other read failures propagate as StreamError.
    """
    from ..sources.writers import exists, read_bytes

    url, base = manifest_location(source)
    try:
        text = read_bytes(url)
    except StreamError as e:
        # Ask again rather than parse the error text: the back-ends word "not found" differently.
        if e.transient or exists(url):
            raise
        raise ManifestNotFoundError(f"{url}: no manifest found") from None
    manifest = Manifest.from_json(text, base=base, where=url)
    manifest.url = url
    return manifest


def write_manifest(
    manifest: Manifest, prefix: str, via: str = "auto", name: str = MANIFEST_NAME
) -> str:
    """Write ``prefix/index.json`` (atomically for local files) and return its URL.

    ``name``: another file name under ``prefix``, e.g. a part manifest
    ``index.part-002-of-008.json`` of ``wdstream pack --part``."""
    from ..sources.writers import write_bytes

    url = urls.join(prefix, name)
    write_bytes(url, manifest.to_json().encode("utf-8"), via=via)
    return url
