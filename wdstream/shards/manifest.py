"""The dataset manifest, ``index.json`` under the dataset prefix.

Required keys (extra keys are kept in ``Manifest.extra``)::

    {"format": "wdstream", "version": 1, "samples": 5000, "bytes": 12345678,
     "extensions": ["json"],
     "shards": [{"url": "shard-000000.tar", "samples": 500, "bytes": 1234567, "sha256": "..."}]}

Shard URLs are relative to the manifest's prefix unless absolute, so a dataset can be copied to
another bucket as it is. The top-level ``samples`` and ``bytes`` are the sums over the shards.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from ..errors import ManifestError, StreamError
from ..sources import urls

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


@dataclass
class Manifest:
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
        shards = ",\n ".join(
            json.dumps(
                {"url": s.url, "samples": s.samples, "bytes": s.bytes, "sha256": s.sha256},
                ensure_ascii=False,
            )
            for s in self.shards
        )
        return f'{text}, "shards": [\n {shards}\n]}}\n' if shards else f'{text}, "shards": []}}\n'

    def fingerprint(self) -> str:
        """A short hash of the shard list (urls as stored, samples, bytes).

        Identifies the dataset for resume state; unchanged when the dataset is copied elsewhere.
        """
        if hasattr(self.shards, "fingerprint_text"):  # compact.ShardArrays: the same text
            text = self.shards.fingerprint_text()
        else:
            text = json.dumps([[s.url, s.samples, s.bytes] for s in self.shards],
                              separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @classmethod
    def from_json(
        cls, text: str | bytes, base: str | None = None, where: str = "manifest"
    ) -> Manifest:
        """Parse and validate; ManifestError names ``where`` and the bad key."""
        from .compact import ShardArrays, parse_manifest

        fast = parse_manifest(text)  # large manifests in to_json's layout, as arrays
        try:
            doc = dict(fast[0], shards=fast[1]) if fast is not None else json.loads(text)
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
        if not isinstance(doc["shards"], list | ShardArrays):
            raise bad("shards", "a list", doc["shards"])

        # ShardArrays come checked (plain names, counts, digests); a list is checked here
        shards = doc["shards"] if isinstance(doc["shards"], ShardArrays) else []
        for i, entry in enumerate(doc["shards"] if isinstance(shards, list) else ()):
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
            shards.append(ShardInfo(url, entry["samples"], entry["bytes"], sha256))

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
