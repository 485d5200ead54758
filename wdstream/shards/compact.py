"""The shard list of a large manifest as arrays, not one Python object per shard.

``ShardArrays`` holds every column as a numpy array: the names and last keys as bytes joined by
newlines, samples and bytes as int64, the sha256 digests and heads as raw bytes (N x 32,
N x 16), each with a mask of the shards that have one. It is a read-only
``Sequence[ShardInfo]`` (an item is made when asked for), so ``Manifest.shards`` keeps its
meaning. A DataLoader worker inherits these few arrays from the main process and reads them
without touching their pages, so fork shares them instead of copying them page by page as
reference counts change; ``wdstream.shards.shared`` maps the same arrays from a node-local
file, so the ranks of a node share one copy.

``parse_manifest(text)`` reads the manifest layout ``Manifest.to_json`` writes (the head on the
first line, one shard per line) with the scanner of ``wdstream.shards.scan``. It takes only
plain names (letters, digits, ``._-/``, no ``..``) and returns None for anything else
(another layout, escapes, absolute URLs, a value of the wrong kind): the general parser then
reads it and reports what is wrong.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from wdstream.limits import json_loads
from wdstream.shards.scan import scan_shards
from wdstream.sources.urls import join


@dataclass(frozen=True)
class ShardInfo:
    url: str  # as stored: relative to the manifest's base, or absolute
    samples: int
    bytes: int
    sha256: str | None = None
    head: str | None = None  # wdstream.shards.identity: digest of the first bytes
    last_key: str | None = None  # the key of the shard's last sample


SMALL = 10_000  # manifests with fewer shards gain nothing from this path

_SHARDS_OPEN = b', "shards": [\n '
_NAME_BYTES = np.zeros(256, dtype=bool)
_NAME_BYTES[np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/\n",
                          dtype=np.uint8)] = True
# column -> (dtype, bytes per shard or None for a blob); what a ShardArrays is made of
COLUMNS = {
    "names": (np.uint8, None), "name_ends": (np.int64, 1),
    "samples": (np.int64, 1), "bytes": (np.int64, 1),
    "sha256": (np.uint8, 32), "has_sha256": (np.bool_, 1),
    "heads": (np.uint8, 16), "has_head": (np.bool_, 1),
    "keys": (np.uint8, None), "key_ends": (np.int64, 1), "has_key": (np.bool_, 1),
}


class ShardArrays(Sequence):
    """Shard names (as stored in the manifest), samples, bytes, sha256 digests, heads and last
    keys, as the arrays of ``columns`` (see ``COLUMNS``; made by ``from_columns``)."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns
        self._names, self._ends = columns["names"], columns["name_ends"]
        self.samples, self.bytes = columns["samples"], columns["bytes"]
        self._digests, self._has_digest = columns["sha256"], columns["has_sha256"]
        self._heads, self._has_head = columns["heads"], columns["has_head"]
        self._keys, self._key_ends, self._has_key = (columns["keys"], columns["key_ends"],
                                                     columns["has_key"])
        self._fingerprint: str | None = None
        self.mapped_from: str | None = None  # the node-local file of wdstream.shards.shared

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray]) -> ShardArrays | None:
        """The shards of ``columns`` (``scan.scan_shards``' or a shared copy's, with or
        without the ``*_ends``), or None unless every column has its dtype and length and
        every name is a plain relative name, spelled one way."""
        columns = dict(columns)
        for blob, ends in (("names", "name_ends"), ("keys", "key_ends")):
            if ends not in columns and isinstance(columns.get(blob), np.ndarray):
                columns[ends] = _ends(columns[blob])
        count = len(columns.get("samples", ()))
        if count == 0 or not _columns_fit(columns, count) or not _plain_names(columns):
            return None
        if columns["key_ends"][-1] != len(columns["keys"]):
            return None
        if (columns["samples"] < 0).any() or (columns["bytes"] < 0).any():
            return None
        columns["sha256"] = columns["sha256"].reshape(count, 32)
        columns["heads"] = columns["heads"].reshape(count, 16)
        return cls(columns)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("shard index out of range")
        return ShardInfo(self.name(index), int(self.samples[index]), int(self.bytes[index]),
                         self.digest(index), self.head(index), self.last_key(index))

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other,
                                                                           strict=True))
        return NotImplemented

    # __eq__ without __hash__: Python makes instances unhashable

    def name(self, index: int) -> str:
        begin = int(self._ends[index - 1]) + 1 if index else 0
        return self._names[begin:int(self._ends[index])].tobytes().decode("ascii")

    def digest(self, index: int) -> str | None:
        return self._digests[index].tobytes().hex() if self._has_digest[index] else None

    def head(self, index: int) -> str | None:
        return self._heads[index].tobytes().hex() if self._has_head[index] else None

    def last_key(self, index: int) -> str | None:
        if not self._has_key[index]:
            return None
        begin = int(self._key_ends[index - 1]) + 1 if index else 0
        return self._keys[begin:int(self._key_ends[index])].tobytes().decode("utf-8")

    def heads(self) -> Sequence[str | None] | None:
        return _Column(self, self.head) if self._has_head.any() else None

    def last_keys(self) -> Sequence[str | None] | None:
        return _Column(self, self.last_key) if self._has_key.any() else None

    def digests(self) -> Sequence[str | None]:
        return _Column(self, self.digest)

    def names(self) -> Sequence[str]:
        return _Column(self, self.name)

    def sizes(self) -> Ints:
        return Ints(self.bytes)

    def urls(self, base: str) -> Urls:
        """The URL of each shard, ``urls.join(base, name)``, made when asked for."""
        return Urls(self, base, join)

    def compressed_names(self) -> np.ndarray:
        """Per shard, whether its name is not a plain ``.tar`` (a compressed tar's)."""
        codes, ends = self._names, self._ends
        tail = np.frombuffer(b".tar", dtype=np.uint8)
        short = ends - np.concatenate(([0], ends[:-1] + 1)) < 4
        at = np.clip(ends[:, None] - 4 + np.arange(4), 0, max(len(codes) - 1, 0))
        return short | (codes[at] != tail).any(axis=1)

    def has_duplicate_names(self) -> bool:
        """Whether a name is given twice: a 64-bit hash of each name, and the names compared
        only where two hashes are equal."""
        ends = self._ends
        starts = np.concatenate(([0], ends[:-1] + 1))
        lengths = ends - starts
        hashes = lengths.astype(np.uint64)
        with np.errstate(over="ignore"):
            for place in range(int(lengths.max())):
                byte = self._names[np.minimum(starts + place, len(self._names) - 1)]
                hashes = hashes * np.uint64(1099511628211) + np.where(
                    place < lengths, byte, 0).astype(np.uint64)
        ordered = np.sort(hashes)
        if not (ordered[1:] == ordered[:-1]).any():
            return False
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        suspects = np.unique(np.concatenate((order[same], order[same + 1])))
        names = [self.name(int(i)) for i in suspects]
        return len(set(names)) != len(names)

    @property
    def total_samples(self) -> int:
        return int(self.samples.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.bytes.sum())

    def fingerprint(self) -> str:
        """``Manifest.fingerprint()``: the sha256 of ``json.dumps([[url, samples, bytes],
        ...], separators=(",", ":"))`` (plain names need no escaping), computed once."""
        if self._fingerprint is None:
            digest = hashlib.sha256(b"[")
            step = 1 << 16
            for first in range(0, len(self), step):
                last = min(len(self), first + step)
                begin = int(self._ends[first - 1]) + 1 if first else 0
                names = self._names[begin:int(self._ends[last - 1])].tobytes().decode("ascii")
                part = ",".join(f'["{n}",{s},{b}]' for n, s, b in zip(
                    names.split("\n"), self.samples[first:last].tolist(),
                    self.bytes[first:last].tolist(), strict=True))
                digest.update((b"," if first else b"") + part.encode("ascii"))
            digest.update(b"]")
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint


def _columns_fit(columns: dict, count: int) -> bool:
    """Whether every column of ``COLUMNS`` is there, of its dtype and length."""
    for name, (dtype, width) in COLUMNS.items():
        column = columns.get(name)
        if not isinstance(column, np.ndarray) or column.dtype != dtype:
            return False
        if width is not None and column.size != count * width:
            return False
    return True


def _plain_names(columns: dict) -> bool:
    """Whether every name is a plain relative name (letters, digits, ``._-/``), spelled one
    way (no empty part, no ``.`` or ``..``), nothing above the base."""
    names = columns["names"]
    if not _NAME_BYTES[names].all():
        return False
    raw = names.tobytes()
    if b".." in raw:
        return False
    if b"/" in raw and (b"//" in raw or b"/\n" in raw or raw.endswith(b"/") or b"/./" in raw
                        or b"\n./" in raw or raw.startswith(b"./")):
        return False
    ends = columns["name_ends"]
    starts = np.concatenate(([0], ends[:-1] + 1))
    if ends[-1] != len(names) or (ends <= starts).any():
        return False
    return not (names[0] == ord("/") or (names[starts[1:]] == ord("/")).any())  # not absolute


def _ends(blob: np.ndarray) -> np.ndarray:
    return np.append(np.flatnonzero(blob == ord("\n")), len(blob)).astype(np.int64)


class _Column(Sequence):
    """One value of each shard (``get(index)``), made when asked for."""

    def __init__(self, shards: ShardArrays, get):
        self._shards, self._get = shards, get

    def __len__(self) -> int:
        return len(self._shards)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._get(index)


class Urls(Sequence):
    """The URL to open each shard with: ``join(base, name)``, made when asked for."""

    def __init__(self, shards: ShardArrays, base: str, join):
        self._shards, self._base, self._join = shards, base, join

    def __len__(self) -> int:
        return len(self._shards)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._join(self._base, self._shards.name(index))

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def one_per_store(self) -> list[str]:
        """A URL of each store among these: plain relative names all take the base's."""
        return [self[0]] if len(self) else []


class Ints(Sequence):
    """An integer array seen as a sequence of Python ints."""

    def __init__(self, values: np.ndarray):
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._values[index].tolist()
        return int(self._values[index])


def parse_manifest(text: bytes | str) -> tuple[dict, ShardArrays] | None:
    """(the head's keys, the shards) of a manifest in ``to_json``'s layout with plain names,
    else None (see the module docstring)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    head_end = text.find(_SHARDS_OPEN)
    if head_end < 0 or text.count(b"\n", 0, head_end):
        return None
    body_start = head_end + len(_SHARDS_OPEN)
    end = len(text)
    while end > body_start and text[end - 1] in b" \t\r\n":
        end -= 1
    if text[end - 3:end] != b"\n]}":
        return None
    if end - body_start < SMALL * 50:
        return None  # small (no shard line is under 50 bytes): the general parser is as quick
    try:  # the head is small: the standard parser, which can see a key given twice
        head = json_loads(text[:head_end] + b"}", object_pairs_hook=_unique_pairs)
    except ValueError:  # a deep head too (NestingError): the general parser names it
        return None
    if not isinstance(head, dict) or "shards" in head:
        return None
    columns = scan_shards(text, body_start, end - 3, min_lines=SMALL)
    if columns is None:
        return None
    shards = ShardArrays.from_columns(columns)
    return None if shards is None else (head, shards)


def _unique_pairs(pairs):
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("a key given twice")
    return doc


def release_free_memory() -> None:
    """Hand back to the system the heap pages a large parse's temporaries freed (glibc keeps
    them: some 80 MB after a million shards); a no-op elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
