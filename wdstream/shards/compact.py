"""The shard list of a large manifest as arrays, not one Python object per shard.

``ShardArrays`` holds the names in one ``bytes`` blob with offsets, and samples, bytes and
digests as numpy arrays; it is a read-only ``Sequence[ShardInfo]`` (an item is made when asked
for), so ``Manifest.shards`` keeps its meaning. A DataLoader worker inherits these few large
objects from the main process and reads them without touching their pages, so fork shares
them instead of copying them page by page as reference counts change.

``parse_manifest(text)`` reads the manifest layout ``Manifest.to_json`` writes (the head on the
first line, one shard per line) in blocks of shards parsed with orjson, filling the arrays as
it goes: a block's dicts are dropped before the next block is parsed, so memory stays near the
size of the arrays. It handles only plain names (letters, digits, ``._-/``, no ``..``) and
returns None for anything else (another layout, escapes, absolute URLs, a value of the wrong
kind): the general parser then reads it and reports what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from operator import itemgetter

import numpy as np

from wdstream.shards.identity import HEAD_DIGITS
from wdstream.shards.manifest import ShardInfo

BLOCK = 20_000  # shards parsed at a time
SMALL = 10_000  # manifests with fewer shards gain nothing from this path

_SHARDS_OPEN = b', "shards": [\n '


class ShardArrays(Sequence):
    """Shard names (as stored in the manifest), samples, bytes and sha256 digests."""

    def __init__(self, names: bytes, ends: np.ndarray, samples: np.ndarray, sizes: np.ndarray,
                 digests: bytes, has_digest: np.ndarray, identity: _Identity | None = None):
        # the names joined by newlines; name i ends at ends[i], one byte after ends[i-1]
        self._names, self._ends = names, ends
        self.samples, self.bytes = samples, sizes
        self._digests, self._has_digest = digests, has_digest  # 32 bytes per shard
        self._identity = identity  # the shards' head and last_key, where the manifest has them

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

    __hash__ = None

    def name(self, index: int) -> str:
        begin = int(self._ends[index - 1]) + 1 if index else 0
        return self._names[begin:int(self._ends[index])].decode("ascii")

    def head(self, index: int) -> str | None:
        return None if self._identity is None else self._identity.head(index)

    def last_key(self, index: int) -> str | None:
        return None if self._identity is None else self._identity.last_key(index)

    def heads(self) -> Sequence[str | None]:
        return _Column(self, self.head)

    def last_keys(self) -> Sequence[str | None]:
        return _Column(self, self.last_key)

    def compressed_names(self) -> np.ndarray:
        """Per shard, whether its name is not a plain ``.tar`` (a compressed tar's)."""
        codes = np.frombuffer(self._names, dtype=np.uint8)
        tail = np.frombuffer(b".tar", dtype=np.uint8)
        ends = self._ends
        short = ends - np.concatenate(([0], ends[:-1] + 1)) < 4
        at = np.clip(ends[:, None] - 4 + np.arange(4), 0, max(len(codes) - 1, 0))
        return short | (codes[at] != tail).any(axis=1)

    def has_duplicate_names(self) -> bool:
        names = self._names.split(b"\n")
        return len(set(names)) != len(names)

    def digest(self, index: int) -> str | None:
        if not self._has_digest[index]:
            return None
        return self._digests[32 * index:32 * index + 32].hex()

    def urls(self, base: str) -> Urls:
        """The URL of each shard, ``urls.join(base, name)``, made when asked for."""
        from wdstream.sources.urls import join

        return Urls(self, base, join)

    def digests(self) -> Sequence[str | None]:
        return _Column(self, self.digest)

    def names(self) -> Sequence[str]:
        return _Column(self, self.name)

    def sizes(self) -> Ints:
        return Ints(self.bytes)

    @property
    def total_samples(self) -> int:
        return int(self.samples.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.bytes.sum())

    def fingerprint_text(self) -> str:
        """``json.dumps([[url, samples, bytes], ...], separators=(",", ":"))`` of the shards
        (plain names need no escaping)."""
        names = self._names.decode("ascii").split("\n")
        return "[" + ",".join(f'["{n}",{s},{b}]' for n, s, b in zip(
            names, self.samples.tolist(), self.bytes.tolist(), strict=True)) + "]"


class _Identity:
    """Heads (``HEAD_DIGITS`` hex digits, stored as bytes) and last keys (joined by newlines,
    which no JSON string in the fast layout holds), each with a mask of the shards that have
    one."""

    def __init__(self, heads: bytes, has_head: np.ndarray, keys: bytes, key_ends: np.ndarray,
                 has_key: np.ndarray):
        self._heads, self._has_head = heads, has_head
        self._keys, self._key_ends, self._has_key = keys, key_ends, has_key

    def head(self, index: int) -> str | None:
        if not self._has_head[index]:
            return None
        width = HEAD_DIGITS // 2
        return self._heads[width * index:width * index + width].hex()

    def last_key(self, index: int) -> str | None:
        if not self._has_key[index]:
            return None
        begin = int(self._key_ends[index - 1]) + 1 if index else 0
        return self._keys[begin:int(self._key_ends[index])].decode("utf-8")


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
    try:
        import orjson
    except ImportError:
        return None
    if isinstance(text, str):
        text = text.encode("utf-8")
    head_end = text.find(_SHARDS_OPEN)
    if head_end < 0 or text.count(b"\n", 0, head_end):
        return None
    try:  # the head is small: the standard parser, which can see a key given twice
        head = json.loads(text[:head_end] + b"}", object_pairs_hook=_unique_pairs)
    except (ValueError, RecursionError):
        return None
    if not isinstance(head, dict) or "shards" in head:
        return None
    body_start = head_end + len(_SHARDS_OPEN)
    end = len(text)
    while end > body_start and text[end - 1] in b" \t\r\n":
        end -= 1
    if text[end - 3:end] != b"\n]}":
        return None
    return _parse_body(orjson, memoryview(text)[body_start:end - 3], head)


def _unique_pairs(pairs):
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("a key given twice")
    return doc


def _keys_spelled(body: memoryview) -> int | None:
    """How many keys the shard lines name, each spelled ``"key": ``, or None when the body
    holds a backslash. Without one no string can hold a quote, so each ``": `` ends a key: a
    key given twice in one line (which a dict keeps once) makes this more than the dicts'
    keys."""
    raw = bytes(body)
    return None if b"\\" in raw else raw.count(b'": ')


def _parse_body(orjson, body: memoryview, head: dict) -> tuple[dict, ShardArrays] | None:
    newlines = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == ord("\n"))
    count = len(newlines) + 1
    spelled = _keys_spelled(body) if count >= SMALL else None
    if spelled is None:
        return None
    keys = 0
    cuts = [*newlines[BLOCK - 1::BLOCK].tolist(), len(body)]
    names: list[bytes] = []
    digests: list[bytes] = []
    identities: list[tuple] = []
    samples = np.empty(count, dtype=np.int64)
    sizes = np.empty(count, dtype=np.int64)
    has_digest = np.empty(count, dtype=bool)
    done = position = 0
    for cut in cuts:
        if cut <= position:
            continue
        try:
            # a line ends with "," but the last: the block is its lines without the final ","
            last = cut - 1 if cut < len(body) else cut
            block = orjson.loads(b"[" + body[position:last] + b"]")
        except orjson.JSONDecodeError:
            return None
        position = cut + 1
        keys += sum(map(len, block)) if _only(block, dict) else 0
        parsed = _block(block)
        if parsed is None or done + len(block) > count:
            return None
        end = done + len(block)
        block_names, samples[done:end], sizes[done:end], block_digests, has_digest[done:end], \
            identity = parsed
        names.append(block_names)
        digests.append(block_digests)
        identities.append(identity)
        done = end
    if done != count or keys != spelled:
        return None
    blob = b"\n".join(names)
    codes = np.frombuffer(blob, dtype=np.uint8)
    if not _NAME_BYTES[codes].all() or b".." in blob or b"//" in blob:
        return None
    separators = np.flatnonzero(codes == ord("\n"))
    ends = np.append(separators, len(blob)).astype(np.int64)
    starts = np.concatenate(([0], separators + 1))
    if len(ends) != count or (ends == starts).any():
        return None
    if (codes[starts[starts < len(codes)]] == ord("/")).any():  # no absolute paths
        return None
    if b"/./" in blob or b"\n./" in blob or blob.startswith(b"./"):  # one spelling per name
        return None
    return head, ShardArrays(blob, ends, samples, sizes, b"".join(digests), has_digest,
                             _join_identities(identities))


def _join_identities(blocks: list[tuple]) -> _Identity | None:
    """One ``_Identity`` from the blocks' (heads, has_head, keys, has_key), or None when no
    shard has either key."""
    if not any(has_head.any() or has_key.any() for _, has_head, _, has_key in blocks):
        return None
    keys = b"\n".join(block[2] for block in blocks)
    key_ends = np.append(np.flatnonzero(np.frombuffer(keys, dtype=np.uint8) == ord("\n")),
                         len(keys)).astype(np.int64)
    return _Identity(b"".join(block[0] for block in blocks),
                     np.concatenate([block[1] for block in blocks]), keys, key_ends,
                     np.concatenate([block[3] for block in blocks]))


_NAME_BYTES = np.zeros(256, dtype=bool)
_NAME_BYTES[np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/\n",
                          dtype=np.uint8)] = True
_HEX_BYTES = np.zeros(256, dtype=bool)
_HEX_BYTES[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = True
_NO_DIGEST = "0" * 64


def _only(values, kind) -> bool:
    return set(map(type, values)) <= {kind}


def _block(block: list) -> tuple | None:
    """One block of shard dicts as (names, samples, bytes, digests, has_digest), or None when
    an entry is not a plain, well-formed shard."""
    if not _only(block, dict) or set(map(len, block)) - {4, 5, 6}:
        return None
    identity = _block_identity(block)
    if identity is None:
        return None
    try:
        urls = list(map(itemgetter("url"), block))
        counts = list(map(itemgetter("samples"), block))
        lengths = list(map(itemgetter("bytes"), block))
        shas = list(map(itemgetter("sha256"), block))
    except KeyError:
        return None
    if not (_only(urls, str) and _only(counts, int) and _only(lengths, int)):
        return None
    samples = np.array(counts, dtype=np.int64)
    sizes = np.array(lengths, dtype=np.int64)
    if len(block) and (samples.min() < 0 or sizes.min() < 0):
        return None
    missing = shas.count(None)
    if missing:
        has = np.array([s is not None for s in shas], dtype=bool)
        shas = [_NO_DIGEST if s is None else s for s in shas]
    else:
        has = np.ones(len(shas), dtype=bool)
    if not _only(shas, str):
        return None
    hexes = "".join(shas).encode("ascii", "replace")
    if len(hexes) != 64 * len(shas) or not _HEX_BYTES[np.frombuffer(hexes, np.uint8)].all():
        return None
    if "" in urls:
        return None
    try:
        names = "\n".join(urls).encode("ascii")
    except UnicodeEncodeError:
        return None
    return names, samples, sizes, bytes.fromhex(hexes.decode("ascii")), has, identity


_SHARD_KEYS = frozenset(("url", "samples", "bytes", "sha256", "head", "last_key"))
_NO_HEAD = "0" * HEAD_DIGITS


def _block_identity(block: list) -> tuple | None:
    """(heads as bytes, has_head, last keys joined by newlines, has_key) of a block, or None
    when an entry has a key of another name or a value of the wrong kind."""
    if any(len(entry) > 4 and not entry.keys() <= _SHARD_KEYS for entry in block):
        return None
    heads = [entry.get("head") for entry in block]
    keys = [entry.get("last_key") for entry in block]
    if not set(map(type, heads)) <= {str, type(None)} or \
            not set(map(type, keys)) <= {str, type(None)}:
        return None
    has_head = np.array([h is not None for h in heads], dtype=bool)
    has_key = np.array([k is not None for k in keys], dtype=bool)
    hexes = "".join(_NO_HEAD if h is None else h for h in heads).encode("ascii", "replace")
    if len(hexes) != HEAD_DIGITS * len(heads) or \
            not _HEX_BYTES[np.frombuffer(hexes, np.uint8)].all():
        return None
    return (bytes.fromhex(hexes.decode("ascii")), has_head,
            "\n".join("" if k is None else k for k in keys).encode("utf-8"), has_key)
