"""Decompressors of a compressed shard's stored stream, one per kind, with bounded output and
a clear answer to "did the data end where the compressed stream ends?" (see
``wdstream.shards.compression``).

An engine decompresses one stored stream that may hold several members or frames one after
another (as ``cat a.gz b.gz`` and parallel compressors write): ``pull(data, limit)`` takes new
input (b"" for none) and returns up to about ``limit`` decompressed bytes, b"" when it needs
more input; ``complete`` says whether the input so far ends at a member's end, ``ended_once``
whether a member ended at all. Each engine is made with ``memory``, the most its decompressor may
allocate for its window: zstd's window and xz's dictionary are set by the data, up to 2 GiB and
4 GiB; gzip's is 32 KiB and bzip2's 900 kB blocks take under 4 MB, bounded by the formats.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from typing import TYPE_CHECKING

from wdstream.errors import ShardError

if TYPE_CHECKING:
    import zstandard


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


def _gzip(memory: int):
    return _StdlibEngine(lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), zeros_after_end=True)


def _bzip2(memory: int):
    return _StdlibEngine(bz2.BZ2Decompressor)


def _xz(memory: int):
    return _StdlibEngine(lambda: lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=memory))


class _ZstdEngine:
    """zstd through the ``zstandard`` package, whose streaming API neither bounds one call's
    output nor reports a cut frame: the frames' block headers are followed here, input is fed
    a few blocks at a time (a block decompresses to at most 128 KiB), and the input is
    complete only after a frame's last block (and checksum)."""

    _BLOCKS = 8  # blocks per decompressor call: at most 1 MiB out

    def __init__(self, memory: int):
        try:
            import zstandard  # optional
        except ImportError:
            raise ShardError("zstd-compressed shards need the zstandard package "
                             "(pip install 'wdstream[zstd]')") from None
        self._zstd = zstandard.ZstdDecompressor(max_window_size=memory)
        self._frames = _ZstdFrames()
        self._decompressor: zstandard.ZstdDecompressionObj | None = None
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
            decompressor = self._decompressor
            if decompressor is None:
                decompressor = self._decompressor = self._zstd.decompressobj()
            out = decompressor.decompress(piece)
            if frame_end:
                self._decompressor = None
            if out:
                self._pending = pending
                return out
        self._pending = b""
        return b""


def _zstd(memory: int):
    return _ZstdEngine(memory)


ENGINES = {"gzip": _gzip, "zstd": _zstd, "bzip2": _bzip2, "xz": _xz}

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
