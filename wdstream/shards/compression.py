"""Compressed shards: which names are shards, and reading ``.tar.gz``/``.tgz``, ``.tar.zst``,
``.tar.bz2`` and ``.tar.xz`` as the tar stream they hold.

``open_tar(stream, url)`` looks at a shard's first bytes: a plain tar is handed back as it is
(a local file keeps its seeks and mapped payloads); compressed data (recognised by its magic
bytes, whatever the name says) is wrapped in a ``DecompressingStream`` that decompresses while
the tar reader reads, in bounded pieces (a small stream that expands enormously never holds
more than a few MiB). ``stored_bytes`` counts the bytes read from storage, which is what a
manifest's ``bytes`` and ``sha256`` describe. A compressed stream that ends before its end
(gzip, bzip2 and xz end-of-stream markers, zstd's last block of the frame) is a ShardError,
never a short shard; so is data after the end that is not another compressed member.
"""

from __future__ import annotations

import bz2
import logging
import lzma
import zlib

from ..errors import ShardError

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


def open_tar(stream, url: str, *, source=None):
    """The tar stream of a shard opened as ``stream``: ``stream`` itself for a plain tar, else
    a ``DecompressingStream``. ``source`` is what the stored bytes are read through (e.g. a
    hashing wrapper of ``stream``; default ``stream``); closing the result closes ``stream``.

    Raises ShardError for a compression wdstream does not read, or a name that promises a
    compression the data does not have."""
    reader = stream if source is None else source
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
        seekable = getattr(stream, "seekable", None)
        if source is None and seekable is not None and seekable():
            stream.seek(0)
            return stream
        return _Prefixed(head, reader, stream)
    if named != kind:
        log.debug("%s: %s-compressed data (recognised by its first bytes)", url, kind)
    return DecompressingStream(reader, url, kind, head=head, owner=stream)


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


class DecompressingStream:
    """The decompressed bytes of a compressed shard, read through ``read``/``read1``/
    ``readinto``. ``stored_bytes``: compressed bytes read so far. ``close()`` closes the
    stream it was opened from; after a clean end it tells a cache filling from that stream
    that the end was checked (``end_verified``)."""

    def __init__(self, reader, url: str, kind: str, *, head: bytes = b"", owner=None):
        self.url = url
        self.kind = kind
        self._reader = reader
        self._read_stored = getattr(reader, "read1", None) or reader.read
        self._owner = owner if owner is not None else reader
        self._engine = _ENGINES[kind]()
        self.stored_bytes = len(head)
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
                raise self._error(f"corrupt {self.kind} data ({error})") from None
            except Exception as error:  # zstandard.ZstdError
                if type(error).__name__ != "ZstdError":
                    raise
                raise self._error(f"corrupt {self.kind} data ({error})") from None
            self._input = b""
            if out:
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
            self._input = chunk

    def _error(self, message: str) -> ShardError:
        return ShardError(f"{self.url}: {message} after {self.stored_bytes} stored bytes")

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


# --------------------------------------------------------------------------- engines
# An engine decompresses one stored stream that may hold several members or frames one after
# another (as ``cat a.gz b.gz`` and parallel compressors write): ``pull(data, limit)`` takes
# new input (b"" for none) and returns up to about ``limit`` decompressed bytes, b"" when it
# needs more input; ``complete`` says whether the input so far ends at a member's end.


class _StdlibEngine:
    """gzip (zlib), bzip2 and xz, which bound their output themselves."""

    def __init__(self, make, zeros_after_end: bool = False):
        self._make = make
        self._decompressor = make()
        self._pending = b""  # input not yet given to the decompressor
        self._zeros_after_end = zeros_after_end  # gzip files may be padded with zeros
        self._members = 0
        self._started = False

    @property
    def complete(self) -> bool:
        return self._members > 0 and not self._started and not self._pending

    @property
    def ended_once(self) -> bool:
        return self._members > 0

    def pull(self, data: bytes, limit: int) -> bytes:
        pending = self._pending + data if self._pending else data
        self._pending = b""
        while True:
            decompressor = self._decompressor
            if decompressor.eof:
                rest = decompressor.unused_data + pending
                self._members += 1
                self._started = False
                if self._zeros_after_end and rest and not rest.strip(b"\x00"):
                    rest = b""
                if not rest:
                    self._decompressor = self._make()
                    return b""
                self._decompressor = decompressor = self._make()
                pending = rest
            if pending:
                self._started = True
            tail = getattr(decompressor, "unconsumed_tail", None)
            if tail is not None:  # zlib: leftover input comes back in unconsumed_tail
                out = decompressor.decompress(pending, limit)
                # (at the end, what follows is in unused_data, and may be in the tail too)
                pending = b"" if decompressor.eof else decompressor.unconsumed_tail
            else:  # bz2, lzma: they keep leftover input themselves
                out = decompressor.decompress(pending, limit)
                pending = b""
            if out or decompressor.eof:
                self._pending = pending
                if out:
                    return out
                continue
            if not pending and (tail is not None or decompressor.needs_input):
                return b""


def _gzip():
    return _StdlibEngine(lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), zeros_after_end=True)


def _bzip2():
    return _StdlibEngine(bz2.BZ2Decompressor)


def _xz():
    return _StdlibEngine(lambda: lzma.LZMADecompressor(format=lzma.FORMAT_XZ))


class _ZstdEngine:
    """zstd through the ``zstandard`` package, whose streaming API neither bounds one call's
    output nor reports a cut frame: the frames' block headers are followed here, input is fed
    a few blocks at a time (a block decompresses to at most 128 KiB), and the input is
    complete only after a frame's last block (and checksum)."""

    _BLOCKS = 8  # blocks per decompressor call: at most 1 MiB out

    def __init__(self):
        try:
            import zstandard  # noqa: PLC0415 - optional
        except ImportError:
            raise ShardError("zstd-compressed shards need the zstandard package "
                             "(pip install 'wdstream[zstd]')") from None
        self._zstd = zstandard.ZstdDecompressor()
        self._frames = _ZstdFrames()
        self._decompressor = None
        self._pending = b""

    @property
    def complete(self) -> bool:
        return self._frames.at_boundary and not self._pending

    @property
    def ended_once(self) -> bool:
        return self._frames.frames > 0

    def pull(self, data: bytes, limit: int) -> bytes:
        pending = self._pending + data if self._pending else data
        while pending:
            count, frame_end = self._frames.advance(pending, self._BLOCKS)
            piece, pending = pending[:count], pending[count:]
            if self._decompressor is None:
                self._decompressor = self._zstd.decompressobj()
            out = self._decompressor.decompress(piece)
            if frame_end:
                self._decompressor = None
            if out:
                self._pending = pending
                return out
        self._pending = b""
        return b""


def _zstd():
    return _ZstdEngine()


_ENGINES = {"gzip": _gzip, "zstd": _zstd, "bzip2": _bzip2, "xz": _xz}

_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = 0x184D2A50  # ... to 0x184D2A5F
_DICT_ID_BYTES = (0, 1, 2, 4)


class _ZstdFrames:
    """Follows zstd frame and block headers through the input (RFC 8878, section 3.1)."""

    def __init__(self):
        self._need = 4  # bytes wanted for the next header
        self._state = "magic"
        self._header = b""  # header bytes gathered so far
        self._skip = 0  # payload bytes to pass before the next header
        self._checksum = False
        self._frames = 0

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def at_boundary(self) -> bool:
        return (self._frames > 0 and self._state == "magic" and not self._header
                and not self._skip)

    def advance(self, data: bytes, blocks: int) -> tuple[int, bool]:
        """Follow ``data``; return (bytes followed, whether a frame ended there), stopping
        after ``blocks`` blocks or a frame's end."""
        pos, size = 0, len(data)
        while pos < size:
            if self._skip:
                step = min(self._skip, size - pos)
                self._skip -= step
                pos += step
                if self._skip:
                    break
                if self._state == "end":  # a skippable frame's content, or the checksum
                    self._end_frame()
                    return pos, True
                continue
            take = min(self._need - len(self._header), size - pos)
            self._header += data[pos : pos + take]
            pos += take
            if len(self._header) < self._need:
                break
            header, self._header = self._header, b""
            frames = self._frames
            is_block = self._on_header(header)
            if self._frames > frames:  # a frame with nothing after its last header
                return pos, True
            if is_block:
                blocks -= 1
                if blocks <= 0:
                    break
        return pos, False

    def _on_header(self, header: bytes) -> bool:
        """Act on a complete header; True when it was a block header."""
        state = self._state
        if state == "magic":
            magic = int.from_bytes(header, "little")
            if magic == _ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            elif magic & 0xFFFFFFF0 == _ZSTD_SKIPPABLE:
                self._state, self._need = "skippable", 4
            else:
                raise ValueError("data after the end of the zstd stream is not zstd")
            return False
        if state == "skippable":
            self._skip = int.from_bytes(header, "little")
            self._state = "end"
            if not self._skip:
                self._end_frame()
            return False
        if state == "descriptor":
            descriptor = header[0]
            if descriptor & 0x08:
                raise ValueError("reserved bit set in a zstd frame header")
            single_segment = descriptor >> 5 & 1
            content_size = (single_segment, 2, 4, 8)[descriptor >> 6]
            self._checksum = bool(descriptor & 0x04)
            self._skip = (1 - single_segment) + _DICT_ID_BYTES[descriptor & 3] + content_size
            self._state, self._need = "block", 3
            return False
        # a block header: last-block bit, type (raw, RLE, compressed), size
        value = int.from_bytes(header, "little")
        kind, block_size = value >> 1 & 3, value >> 3
        if kind == 3:
            raise ValueError("reserved zstd block type")
        self._skip = 1 if kind == 1 else block_size
        if value & 1:  # the frame's last block
            if self._checksum:
                self._skip += 4
            self._state = "end"
            if not self._skip:
                self._end_frame()
        return True

    def _end_frame(self) -> None:
        self._frames += 1
        self._state, self._need = "magic", 4


# --------------------------------------------------------------------------- writing

DEFAULT_LEVELS = {"zstd": 3, "gzip": 6}
LEVELS = {"zstd": range(1, 23), "gzip": range(0, 10)}


def check_compression(kind: str | None, level: int | None) -> int | None:
    """The level to write ``kind`` with (its default when None); InputError for a kind or
    level that cannot be written."""
    from ..errors import InputError

    if kind is None:
        if level is not None:
            raise InputError("--level needs --compress zstd|gzip")
        return None
    if kind not in WRITE_SUFFIXES:
        raise InputError(f"--compress {kind!r}: choose {' or '.join(WRITE_SUFFIXES)}")
    if level is None:
        return DEFAULT_LEVELS[kind]
    allowed = LEVELS[kind]
    if level not in allowed:
        raise InputError(f"--level {level}: {kind} levels are {allowed.start} to "
                         f"{allowed.stop - 1}")
    return level


def compress_bound(kind: str, size: int) -> int:
    """The most bytes ``size`` bytes can take once compressed (zstd's ZSTD_COMPRESSBOUND and
    zlib's deflateBound, plus headers, trailers and a margin)."""
    if kind == "zstd":
        small = (128 * 1024 - size) >> 11 if size < 128 * 1024 else 0
        return size + (size >> 8) + small + 64
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 64


def tar_limit(kind: str, max_size: int) -> int:
    """The largest tar whose compressed form surely fits ``max_size`` stored bytes."""
    low, high = 0, max_size
    while low < high:
        middle = (low + high + 1) // 2
        if compress_bound(kind, middle) <= max_size:
            low = middle
        else:
            high = middle - 1
    return low


class ShardCompressor:
    """Compresses one shard as it is written: the same calls give the same bytes (zstd with
    one thread and a checksum, gzip without a file name or time)."""

    def __init__(self, kind: str, level: int):
        if kind == "zstd":
            import zstandard  # noqa: PLC0415 - only when writing zstd

            self._compressor = zstandard.ZstdCompressor(
                level=level, write_checksum=True, threads=0).compressobj()
        else:
            self._compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def compress(self, data: bytes) -> bytes:
        return self._compressor.compress(data)

    def flush(self) -> bytes:
        return self._compressor.flush()
