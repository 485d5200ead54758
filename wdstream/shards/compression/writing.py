"""Writing compressed shards (``wdstream pack --compress``): levels, the worst-case size bound
that keeps ``--max-size`` a bound on the stored bytes, and a deterministic compressor."""

from __future__ import annotations

import zlib
from typing import Protocol

from wdstream.errors import InputError
from wdstream.shards.compression import WRITE_SUFFIXES

DEFAULT_LEVELS = {"zstd": 3, "gzip": 6}
LEVELS = {"zstd": range(1, 23), "gzip": range(0, 10)}


def check_compression(kind: str | None, level: int | None) -> int | None:
    """The level to write ``kind`` with (its default when None); InputError for a kind or
    level that cannot be written."""
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


class _Compressing(Protocol):
    """zstandard's and zlib's compression objects, as used here."""

    def compress(self, data: bytes, /) -> bytes: ...

    def flush(self) -> bytes: ...


class ShardCompressor:
    """Compresses one shard as it is written: the same calls give the same bytes (zstd with
    one thread and a checksum, gzip without a file name or time)."""

    def __init__(self, kind: str, level: int):
        self._compressor: _Compressing
        if kind == "zstd":
            import zstandard  # only when writing zstd

            self._compressor = zstandard.ZstdCompressor(
                level=level, write_checksum=True, threads=0).compressobj()
        else:
            self._compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def compress(self, data: bytes) -> bytes:
        return self._compressor.compress(data)

    def flush(self) -> bytes:
        return self._compressor.flush()
