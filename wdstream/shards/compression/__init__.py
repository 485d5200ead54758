"""Compressed shards: which names are shards, and reading ``.tar.gz``/``.tgz``, ``.tar.zst``,
``.tar.bz2`` and ``.tar.xz`` as the tar stream they hold (the decompressors: ``engines``;
writing compressed shards: ``writing``).

``open_tar(body, url)`` looks at a shard's first bytes: a plain tar is handed back as it is
(a local file keeps its seeks and mapped payloads); compressed data (recognised by its magic
bytes, whatever the name says) is wrapped in a ``DecompressingBody`` that decompresses while
the tar reader reads, in bounded pieces (a small stream that expands enormously never holds
more than a few MiB), up to ``Limits.shard_bytes`` decompressed bytes, with its decompressor's
memory bounded by ``Limits.decoder_memory``. ``stored_bytes`` counts the bytes read from storage, which is what a
manifest's ``bytes`` and ``sha256`` describe. A compressed stream that ends before its end
(gzip, bzip2 and xz end-of-stream markers, zstd's last block of the frame) is a ShardError,
never a short shard; so is data after the end that is not another compressed member.
"""

from __future__ import annotations

import logging
import lzma
import zlib

from wdstream.errors import LimitError, ShardError, ShardMismatchError
from wdstream.limits import Limits
from wdstream.shards.compression.engines import ENGINES

log = logging.getLogger(__name__)

# The kinds read, by name suffix; the writer (``wdstream pack --compress``) writes the first.
SUFFIXES = {
    "gzip": (".tar.gz", ".tgz"),
    "zstd": (".tar.zst", ".tar.zstd"),
    "bzip2": (".tar.bz2", ".tbz2"),
    "xz": (".tar.xz", ".txz"),
}
WRITE_SUFFIXES = {"gzip": ".tar.gz", "zstd": ".tar.zst"}
SHARD_SUFFIXES = (".tar", *(s for names in SUFFIXES.values() for s in names))

_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
)
# Formats recognised only to say so, instead of a tar checksum error at byte 0.
_UNREAD_MAGIC = (
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"LZIP", "lzip"),
    (b"\x1f\x9d", "compress (.Z)"),
    (b"PK\x03\x04", "zip"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
)
_HEAD = 6  # enough bytes for every magic above

_READ = 1 << 18  # stored bytes read at a time
_PIECE = 1 << 20  # decompressed bytes produced at a time (bounds memory per read)


def is_shard_name(name: str) -> bool:
    """Whether a file name is one of the shard kinds wdstream reads."""
    return name.lower().endswith(SHARD_SUFFIXES)


def not_shard_kinds(names) -> dict[str, int]:
    """How many of the listed file ``names`` there are of each kind (``".tar.lz4"``,
    ``".zip"``, ``"no extension"``), leaving out the dataset's own files: manifests
    (``index*.json``) and hidden names."""
    kinds: dict[str, int] = {}
    for name in names:
        base = name.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(".") or (base.startswith("index") and base.endswith(".json")):
            continue
        lower = base.lower()
        at = lower.find(".tar.")
        if at > 0:
            kind = lower[at:]
        elif "." in lower.lstrip("."):
            kind = "." + lower.rsplit(".", 1)[1]
        else:
            kind = "no extension"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def not_shards_note(not_shards: dict[str, int]) -> str:
    """``"2 listed file(s) are not shards wdstream reads and were left out: 1 .tar.lz4,
    1 .zip"``."""
    total = sum(not_shards.values())
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(not_shards.items()))
    return f"{total} listed file(s) are not shards wdstream reads and were left out: {kinds}"


def compression_of_name(name: str) -> str | None:
    """``"gzip"``, ``"zstd"``, ``"bzip2"``, ``"xz"`` from a shard's name; None for ``.tar``."""
    lower = name.lower()
    for kind, suffixes in SUFFIXES.items():
        if lower.endswith(suffixes):
            return kind
    return None


def sniff(head: bytes) -> str | None:
    """The compression named by a stream's first bytes; None: not compressed (a tar)."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    return None


def _unread_kind(head: bytes) -> str | None:
    for magic, kind in _UNREAD_MAGIC:
        if head.startswith(magic):
            return kind
    return None


def open_tar(body, url: str, *, source=None, stored_limit: int | None = None,
             limits: Limits | None = None):
    """The tar stream of a shard opened as ``body``: ``body`` itself for a plain tar, else
    a ``DecompressingBody``. ``source`` is what the stored bytes are read through (e.g. a
    hashing wrapper of ``body``; default ``body``); closing the result closes ``body``.
    ``stored_limit``: the stored bytes recorded for the shard (manifest or listing), past
    which a compressed stream is an error (a plain tar is bounded by the tar reader).
    ``limits``: what a compressed stream may expand to (default ``Limits()``).

    Raises ShardError for a compression wdstream does not read, or a name that promises a
    compression the data does not have."""
    reader = body if source is None else source
    head = b""
    while len(head) < _HEAD and (more := reader.read(_HEAD - len(head))):
        head += bytes(more)
    kind = sniff(head)
    named = compression_of_name(url)
    if kind is None:
        other = _unread_kind(head)
        if other is not None:
            raise ShardError(f"{url}: {other}-compressed data, which wdstream does not read "
                             "(use gzip, zstd, bzip2 or xz, or a plain .tar)")
        if named is not None and head:
            raise ShardError(f"{url}: the name says {named}-compressed, but the data does not "
                             "start with its magic bytes (a plain tar renamed?)")
        seekable = getattr(body, "seekable", None)
        if source is None and seekable is not None and seekable():
            body.seek(0)
            return body
        return _Prefixed(head, reader, body)
    if named != kind:
        log.debug("%s: %s-compressed data (recognised by its first bytes)", url, kind)
    return DecompressingBody(reader, url, kind, head=head, owner=body,
                               stored_limit=stored_limit, limits=limits)


def stored_bytes(tar_stream, members) -> int:
    """Bytes read from storage for a shard read through ``open_tar``'s result, once the tar
    reader ``members`` is exhausted."""
    counted = getattr(tar_stream, "stored_bytes", None)
    return members.offset if counted is None else counted


class _Prefixed:
    """A plain tar stream whose first bytes were already read to look at them."""

    def __init__(self, head: bytes, reader, owner):
        self._head = head
        self._reader = reader
        self._read_more = getattr(reader, "read1", None) or reader.read
        self._readinto = getattr(reader, "readinto", None)
        self._owner = owner

    def read(self, n: int = -1) -> bytes:
        head = self._take_head(n)
        if head is None:
            return self._reader.read(n)
        if n is None or n < 0:
            return head + self._reader.read()
        if len(head) < n:
            return head + self._reader.read(n - len(head))
        return head

    def read1(self, n: int = -1) -> bytes:
        head = self._take_head(n)
        return self._read_more(n) if head is None else head

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        head = self._take_head(len(view))
        if head is not None:
            view[: len(head)] = head
            return len(head)
        if self._readinto is not None:
            return self._readinto(view)
        data = self._reader.read(len(view))
        view[: len(data)] = data
        return len(data)

    def _take_head(self, n) -> bytes | None:
        if not self._head:
            return None
        if n is None or n < 0 or n >= len(self._head):
            head, self._head = self._head, b""
        else:
            head, self._head = self._head[:n], self._head[n:]
        return head

    def close(self) -> None:
        self._owner.close()


class DecompressingBody:
    """The decompressed bytes of a compressed shard, read through ``read``/``read1``/
    ``readinto``. ``stored_bytes``: compressed bytes read so far; ``expanded_bytes``:
    decompressed bytes made so far, at most ``limits.shard_bytes`` (a ``LimitError`` past
    them). ``close()`` closes the body it was opened from; after a clean end it tells a
    cache filling from that body that the end was checked (``end_verified``)."""

    def __init__(self, reader, url: str, kind: str, *, head: bytes = b"", owner=None,
                 stored_limit: int | None = None, limits: Limits | None = None):
        self.url = url
        self._stored_limit = stored_limit
        self.kind = kind
        self._reader = reader
        self._read_stored = getattr(reader, "read1", None) or reader.read
        self._owner = owner if owner is not None else reader
        self._limits = limits = Limits() if limits is None else limits
        self._engine = ENGINES[kind](limits.decoder_memory)
        self.stored_bytes = len(head)
        self.expanded_bytes = 0
        self._input = head
        self._at_end = False  # the stored stream ended
        self._done = False  # ... and everything it held was decompressed, cleanly
        self._data = b""  # decompressed, not yet handed out, from _pos on
        self._pos = 0

    def _fill(self, limit: int) -> bool:
        """Make decompressed bytes available; False at the clean end of the data."""
        while True:
            try:
                out = self._engine.pull(self._input, limit)
            except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as error:
                raise self._corrupt(error) from None
            except Exception as error:  # zstandard.ZstdError
                if type(error).__name__ != "ZstdError":
                    raise
                raise self._corrupt(error) from None
            self._input = b""
            if out:
                self.expanded_bytes += len(out)
                if self.expanded_bytes > self._limits.shard_bytes:
                    too_large = LimitError(f"{self.url}: decompresses to more than "
                                           f"{self._limits.shard_bytes:,} bytes (the limit "
                                           "shard_bytes of wdstream.Limits)")
                    too_large.in_stream = True  # the tar reader adds the member it was reading
                    raise too_large
                self._data, self._pos = out, 0
                return True
            if self._at_end:
                if not self._engine.complete:
                    after = " or other data after its end" if self._engine.ended_once else ""
                    raise self._error(f"{self.kind} stream ends before its end "
                                      f"(truncated{after})")
                self._done = True
                return False
            chunk = self._read_stored(_READ)
            if not chunk:
                self._at_end = True
                continue
            if type(chunk) is not bytes:
                chunk = bytes(chunk)
            self.stored_bytes += len(chunk)
            if self._stored_limit is not None and self.stored_bytes > self._stored_limit:
                raise ShardMismatchError(f"{self.url}: goes on past the {self._stored_limit:,} "
                                         "stored bytes recorded for it (manifest or listing)")
            self._input = chunk

    def _error(self, message: str) -> ShardError:
        return ShardError(f"{self.url}: {message} after {self.stored_bytes} stored bytes")

    def _corrupt(self, error: Exception) -> ShardError:
        """The error of data the decompressor refused: corrupt, or asking for more memory
        than ``decoder_memory`` (the decompressors' messages say "memory")."""
        if "memory" in str(error).lower():
            return LimitError(f"{self.url}: the {self.kind} data asks for more than "
                              f"{self._limits.decoder_memory:,} bytes of decompressor memory "
                              f"(the limit decoder_memory of wdstream.Limits; {error})")
        return self._error(f"corrupt {self.kind} data ({error})")

    def read1(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        if self._pos >= len(self._data):
            if self._done or not self._fill(_PIECE if n is None or n < 0 else max(n, _READ)):
                return b""
        data, pos = self._data, self._pos
        if n is None or n < 0 or pos + n >= len(data):
            piece = data[pos:] if pos else data
            self._data, self._pos = b"", 0
            return piece
        self._pos = pos + n
        return data[pos : pos + n]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while piece := self.read1(-1):
                parts.append(piece)
            return b"".join(parts)
        first = self.read1(n)
        if len(first) == n or not first:
            return first
        parts, have = [first], len(first)
        while have < n and (piece := self.read1(n - have)):
            parts.append(piece)
            have += len(piece)
        return b"".join(parts)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and (piece := self.read1(len(view) - filled)):
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        return filled

    def close(self) -> None:
        if self._done:
            verified = getattr(self._owner, "end_verified", None)
            if verified is not None:
                verified()
        self._owner.close()
