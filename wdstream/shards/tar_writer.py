"""The shard format's tar writer: compact and reproducible.

POSIX ustar headers only, every field that could vary between runs fixed (mtime 0, mode
0o644, uid/gid 0, empty user and group names), no PAX header per member. A member therefore costs
512 bytes of header plus its payload padded to 512, against ~2 KB of headers with webdataset's
ShardWriter. Names over 100 bytes use the ustar prefix field when they split at a "/", else a
GNU longname ('L') entry. Members are written in the order given.
"""

from __future__ import annotations

from typing import Protocol

from wdstream.shards.tar_header import (
    BLOCK,
    END_SIZE,
    GNU_MAGIC,
    LONGLINK,
    MODE_UID_GID,
    MTIME,
    NAME_MAX,
    OCTAL_SIZE_MAX,
    REGULAR_SUM,
    REGULAR_TAIL_EMPTY_PREFIX,
    build_header,
    encode_name,
    padding,
    ustar_split,
)

_PADDINGS = tuple(bytes(n) for n in range(BLOCK))  # the zeros after a payload, by length
_SIZE_FIELDS: dict[int, tuple[bytes, int]] = {}  # size -> (octal size field, sum of its bytes)
_SIZE_FIELDS_MAX = 1 << 16  # entries kept; members of a dataset mostly have a few sizes


def _octal_size(size: int) -> tuple[bytes, int]:
    """The size field of a size up to 8 GiB - 1 and the sum of its bytes, cached."""
    field = b"%011o\x00" % size
    entry = (field, sum(field))
    if len(_SIZE_FIELDS) < _SIZE_FIELDS_MAX:
        _SIZE_FIELDS[size] = entry
    return entry


def member_size(name: str, nbytes: int) -> int:
    """The exact number of bytes ``TarWriter.add(name, data)`` writes for ``len(data) == nbytes``."""
    raw = encode_name(name)
    size = BLOCK + nbytes + padding(nbytes)
    if ustar_split(raw) is None:
        size += BLOCK + len(raw) + 1 + padding(len(raw) + 1)
    return size


class Writable(Protocol):
    """What TarWriter writes to: a binary file object, or anything with its ``write``."""

    def write(self, data: bytes, /) -> object: ...


class TarWriter:
    """Writes a deterministic tar to a binary file object; the same calls give the same bytes."""

    def __init__(self, fileobj: Writable):
        self._out = fileobj
        self._written = 0
        self._closed = False

    @property
    def bytes_written(self) -> int:
        return self._written

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._written += len(data)

    def add(self, name: str, data: bytes) -> None:
        """Append one regular-file member."""
        if self._closed:
            raise ValueError("TarWriter is closed")
        raw = name.encode("utf-8")
        size = len(data)
        write = self._out.write
        # (a str NUL test: as exact as one on the UTF-8 bytes, and several times faster)
        if 0 < len(raw) <= NAME_MAX and size <= OCTAL_SIZE_MAX and "\x00" not in name:
            # The common case, inlined: a name that fits the name field, an octal size.
            size_field, size_sum = _SIZE_FIELDS.get(size) or _octal_size(size)
            write(
                b"".join(
                    (
                        raw.ljust(NAME_MAX, b"\x00"),
                        MODE_UID_GID,
                        size_field,
                        MTIME,
                        b"%06o\x00 " % (REGULAR_SUM + sum(raw) + size_sum),
                        REGULAR_TAIL_EMPTY_PREFIX,
                    )
                )
            )
            written = BLOCK
        else:
            raw = encode_name(name)
            split = ustar_split(raw)
            written = 0
            if split is None:
                # GNU longname: a pseudo-member holding the NUL-terminated name, then the real
                # header with the name truncated (readers that know 'L' ignore it).
                long_name = raw + b"\x00"
                write(build_header(LONGLINK, len(long_name), b"L", magic=GNU_MAGIC))
                write(long_name + bytes(padding(len(long_name))))
                written += BLOCK + len(long_name) + padding(len(long_name))
                header = build_header(raw[:NAME_MAX], size, b"0", magic=GNU_MAGIC)
            else:
                header = build_header(split[1], size, b"0", prefix=split[0])
            write(header)
            written += BLOCK
        write(data)
        pad = -size % BLOCK
        if pad:
            write(_PADDINGS[pad])
        self._written += written + size + pad

    def close(self) -> None:
        """Write the end-of-archive marker. Does not close the file object."""
        if not self._closed:
            self._write(bytes(END_SIZE))
            self._closed = True
