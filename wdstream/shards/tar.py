"""The shard format: a compact, reproducible tar writer and a fast streaming tar reader.

Writer: POSIX ustar headers only, every field that could vary between runs fixed (mtime 0, mode
0o644, uid/gid 0, empty user and group names), no PAX header per member. A member therefore costs
512 bytes of header plus its payload padded to 512, against ~2 KB of headers with webdataset's
ShardWriter. Names over 100 bytes use the ustar prefix field when they split at a "/", else a
GNU longname ('L') entry. Members are written in the order given.

Reader: ``iter_members`` parses 512-byte headers itself and slices payloads out of large reads,
which is several times faster than ``tarfile`` in streaming mode on small members. It reads what
GNU tar, ``tarfile`` and webdataset write: ustar, GNU longname/longlink, PAX extended headers;
what it cannot read as POSIX and GNU define it (sparse members, a global header that names
files, two long names for one member, an extended header with no member after it) is a
ShardError, never a payload under another member's name. Extended records are capped
(``LONG_NAME_MAX``, ``PAX_MAX``), and so is what is read after the end-of-archive marker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO
from zlib import adler32

from wdstream.errors import InputError, ShardError, ShardMismatchError

BLOCK = 512
END_SIZE = 2 * BLOCK  # the end-of-archive marker: two zero blocks
_ZERO_BLOCK = bytes(BLOCK)
_READ_SIZE = 1 << 20  # large reads: slicing from a buffer beats many small read() calls
_MAX_READ = 1 << 26  # one read's cap, however large the member (or a corrupt size field)
_EXACT_READ = 1 << 17  # payloads from this size on are read whole where the stream can seek
_READ_AFTER_EXACT = 1 << 13  # the read after one: mostly the next header (the rest is re-read)

_NAME_MAX = 100
_PREFIX_MAX = 155
_LONGLINK = b"././@LongLink"
_USTAR_MAGIC = b"ustar\x0000"  # magic + version of POSIX ustar
_GNU_MAGIC = b"ustar  \x00"  # magic + version of GNU tar, used around a longname entry
_OCTAL_SIZE_MAX = 8**11 - 1  # the largest size that fits 11 octal digits (8 GiB - 1)
LONG_NAME_MAX = 1 << 16  # a GNU long name or link: far above any file system's PATH_MAX
PAX_MAX = 1 << 20  # a PAX extended header: names, times and a few attributes
DRAIN_MAX = 1 << 20  # read after the end marker when the shard's length is unknown (GNU tar
# pads to 10 KiB records)


def _padding(n: int) -> int:
    return -n % BLOCK


def _size_field(size: int) -> bytes:
    if size <= _OCTAL_SIZE_MAX:
        return b"%011o\x00" % size
    # GNU base-256: a set high bit, then the number big-endian in the remaining 11 bytes.
    return b"\x80" + size.to_bytes(11, "big")


# A header is: name (100) | mode, uid, gid (24) | size (12) | mtime (12) | checksum (8) |
# typeflag (1), linkname (100), magic + version (8), uname + gname (64), devmajor + devminor
# (16) | prefix (155) | padding (12). Everything but the name, size and prefix is the same for
# every member of a kind, so those bytes are joined once here, and their share of the checksum
# (the unsigned sum of all 512 bytes, the checksum field counted as 8 spaces) summed once:
# a member's checksum is that constant plus the sums of its name, size and prefix bytes.
_MODE_UID_GID = b"0000644\x000000000\x000000000\x00"
_MTIME = b"00000000000\x00"
_PREFIX_PAD = bytes(12)


def _tail(typeflag: bytes, magic: bytes) -> bytes:
    """The header bytes after the checksum field and before the prefix."""
    return typeflag + bytes(_NAME_MAX) + magic + bytes(64) + b"0000000\x000000000\x00"


def _fixed_sum(tail: bytes) -> int:
    return sum(_MODE_UID_GID) + sum(_MTIME) + 8 * 32 + sum(tail) + sum(_PREFIX_PAD)


_REGULAR_TAIL = _tail(b"0", _USTAR_MAGIC)  # a regular file, POSIX ustar
_REGULAR_TAIL_EMPTY_PREFIX = _REGULAR_TAIL + bytes(_PREFIX_MAX) + _PREFIX_PAD
_REGULAR_SUM = _fixed_sum(_REGULAR_TAIL)
_TAILS = {
    (typeflag, magic): (_tail(typeflag, magic), _fixed_sum(_tail(typeflag, magic)))
    for typeflag in (b"0", b"L")
    for magic in (_USTAR_MAGIC, _GNU_MAGIC)
}
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


def _header(
    name: bytes, size: int, typeflag: bytes, prefix: bytes = b"", magic: bytes = _USTAR_MAGIC
) -> bytes:
    """A 512-byte header; ``name`` and ``prefix`` fit their fields (100 and 155 bytes)."""
    tail, fixed = _TAILS[typeflag, magic]
    size_field = _size_field(size)
    checksum = fixed + sum(name) + sum(size_field) + sum(prefix)
    return b"".join(
        (
            name.ljust(_NAME_MAX, b"\x00"),
            _MODE_UID_GID,
            size_field,
            _MTIME,
            b"%06o\x00 " % checksum,
            tail,
            prefix.ljust(_PREFIX_MAX, b"\x00"),
            _PREFIX_PAD,
        )
    )


def _split_name(name: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) for a ustar header, or None when a GNU longname entry is needed.

    Takes the shortest prefix that fits, as Python's tarfile does."""
    if len(name) <= _NAME_MAX:
        return b"", name
    parts = name.split(b"/")
    for i in range(1, len(parts)):
        prefix, rest = b"/".join(parts[:i]), b"/".join(parts[i:])
        if len(prefix) <= _PREFIX_MAX and 0 < len(rest) <= _NAME_MAX:
            return prefix, rest
    return None


def _encode_name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if not raw or b"\x00" in raw:
        raise InputError(f"tar member name {name!r}: empty or contains a NUL character")
    return raw


def member_size(name: str, nbytes: int) -> int:
    """The exact number of bytes ``TarWriter.add(name, data)`` writes for ``len(data) == nbytes``."""
    raw = _encode_name(name)
    size = BLOCK + nbytes + _padding(nbytes)
    if _split_name(raw) is None:
        size += BLOCK + len(raw) + 1 + _padding(len(raw) + 1)
    return size


class TarWriter:
    """Writes a deterministic tar to a binary file object; the same calls give the same bytes."""

    def __init__(self, fileobj: BinaryIO):
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
        if 0 < len(raw) <= _NAME_MAX and size <= _OCTAL_SIZE_MAX and "\x00" not in name:
            # The common case, inlined: a name that fits the name field, an octal size.
            size_field, size_sum = _SIZE_FIELDS.get(size) or _octal_size(size)
            write(
                b"".join(
                    (
                        raw.ljust(_NAME_MAX, b"\x00"),
                        _MODE_UID_GID,
                        size_field,
                        _MTIME,
                        b"%06o\x00 " % (_REGULAR_SUM + sum(raw) + size_sum),
                        _REGULAR_TAIL_EMPTY_PREFIX,
                    )
                )
            )
            written = BLOCK
        else:
            raw = _encode_name(name)
            split = _split_name(raw)
            written = 0
            if split is None:
                # GNU longname: a pseudo-member holding the NUL-terminated name, then the real
                # header with the name truncated (readers that know 'L' ignore it).
                long_name = raw + b"\x00"
                write(_header(_LONGLINK, len(long_name), b"L", magic=_GNU_MAGIC))
                write(long_name + bytes(_padding(len(long_name))))
                written += BLOCK + len(long_name) + _padding(len(long_name))
                header = _header(raw[:_NAME_MAX], size, b"0", magic=_GNU_MAGIC)
            else:
                header = _header(split[1], size, b"0", prefix=split[0])
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


# --- reading ---------------------------------------------------------------------------------

# Type flags. Regular files yield a member; links, devices, directories and FIFOs carry no
# payload whatever their size field says; extended headers (GNU long name/link, PAX per-file
# and global) describe the next member; sparse files are refused; any other type is skipped
# with its payload (as tarfile and GNU tar do), taking the pending extended headers with it.
_REGULAR = frozenset(b"07\x00")
_NO_PAYLOAD = frozenset(b"123456")
_EXTENDED = frozenset(b"LKxXg")
_SPARSE = 83  # 'S'
_AREGTYPE = 0  # the old regular type; a name ending in "/" makes it a directory
HEAD_BYTES = 4096  # what ``on_head`` is given: the shard's first header(s) and payload bytes


def _cstr(field: bytes) -> bytes:
    end = field.find(b"\x00")
    return field if end < 0 else field[:end]


class TarMembers:
    """Iterator over the regular-file members of a tar stream, as ``(name, payload)`` pairs.

    ``offset`` is the number of bytes consumed from the stream so far. After the end-of-archive
    marker the rest of the stream is read (GNU tar pads to 10 KiB records) up to ``limit`` or
    ``DRAIN_MAX`` bytes, so once iteration is exhausted ``offset`` is the stream's total length
    and ``complete`` says whether the marker was seen (False: the stream ended cleanly at a
    member boundary without it).
    """

    def __init__(self, stream: BinaryIO, url: str, payload_target=None, *,
                 limit: int | None = None, on_head=None):
        self.url = url
        self._limit = limit  # the stream's length when known: a byte beyond it is an error
        self._on_head = on_head
        # payload_target(name, size, region) -> (payload, memory) or None: where payloads of
        # _EXACT_READ to _MAX_READ bytes go (see iter_members)
        self._target = payload_target
        self._readinto = getattr(stream, "readinto", None)
        self._region = getattr(stream, "region", None)  # a local file's: see _skip
        self.complete = False
        # read1 where there is one: it hands over a stream's chunk as it is, without copying
        # or waiting for more (read(n) of a ByteStream joins chunks to give exactly n bytes).
        self._read = getattr(stream, "read1", None) or stream.read
        self._end = 0  # stream position after the last byte read
        if limit is not None:
            self._raw_read, self._read = self._read, self._bounded_read
        # A seekable stream (a local file) gives a large payload in one exact read.
        seekable = getattr(stream, "seekable", None)
        self._stream = stream if seekable is not None and seekable() else None
        self._data = b""  # buffered bytes; _data[_pos:] not yet parsed
        self._pos = 0
        self._base = 0  # stream offset of _data[0]
        self._read_size = _READ_SIZE  # of the next fill; small after an exact payload read
        self._gen = self._members()

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        return self._gen  # a for loop then runs the generator itself: no call per member

    def __next__(self) -> tuple[str, bytes]:
        return next(self._gen)

    def _bounded_read(self, n: int) -> bytes:
        """``read`` when the stream's length is known: never asks beyond one byte past it."""
        chunk = self._raw_read(max(1, min(n, self._limit + 1 - self._end)))
        self._end += len(chunk)
        if self._end > self._limit:
            raise ShardMismatchError(f"{self.url}: the stream goes on past the {self._limit} "
                                     f"bytes recorded for it")
        return chunk

    def _fill(self, need: int) -> bool:
        """Make at least ``need`` unparsed bytes available; False if the stream ends first."""
        rest = len(self._data) - self._pos
        read = self._read
        read_size = self._read_size
        if read_size < _READ_SIZE:  # grows back while members are small
            self._read_size = read_size * 2
        if rest == 0:  # the common case: nothing left over, no join
            chunk = read(min(max(read_size, need), _MAX_READ))
            if type(chunk) is not bytes:
                chunk = bytes(chunk)  # payloads are bytes, whatever the stream returns
            self._base += self._pos
            self._data, self._pos = chunk, 0
            if len(chunk) >= need or not chunk:
                return len(chunk) >= need
            rest = len(chunk)
        parts = [memoryview(self._data)[self._pos :]]
        have = rest
        while have < need:
            chunk = read(min(max(read_size, need - have), _MAX_READ))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        self._base += self._pos
        self._data = b"".join(parts)
        self._pos = 0
        return have >= need

    def _gather(self, start: int, size: int, padded: int, into=None, region=None):
        """The payload of ``size`` bytes at ``_data[start:]``, which the buffer holds only
        part of, with its padding (``padded`` bytes in all) consumed; None if the stream ends
        first. The payload is joined once from the pieces as read (no join of the buffer with
        each new read, no slicing afterwards), and the last piece becomes the buffer; or read
        into the memory of ``into``, ``(payload, memory)`` from the payload target, or left
        in the file (``memory`` None)."""
        if into is not None:
            if into[1] is None:
                return self._skip(start, padded, into[0], region)
            return self._read_into(start, size, padded, *into)
        if self._stream is not None and _EXACT_READ <= size <= _MAX_READ:
            return self._read_exact(start, size, padded)
        data = self._data
        read = self._read
        parts = [memoryview(data)[start:]] if start < len(data) else []
        have = len(data) - start
        base = self._base + len(data)  # stream offset of the next piece read
        chunk = data
        while have < padded:
            chunk = read(min(max(_READ_SIZE, padded - have), _MAX_READ))
            if not chunk:
                self._base, self._data, self._pos = base, b"", 0  # offset: all that was read
                return None
            if type(chunk) is not bytes:
                chunk = bytes(chunk)  # it may become the buffer, sliced into payloads
            parts.append(chunk)
            have += len(chunk)
            base += len(chunk)
        self._base = base - len(chunk)
        self._data, self._pos = chunk, len(chunk) - (have - padded)
        excess = have - size  # bytes of padding and beyond, at the end of the parts
        while excess:
            last = parts[-1]
            if len(last) <= excess:
                parts.pop()
                excess -= len(last)
            else:
                parts[-1] = memoryview(last)[: len(last) - excess]
                excess = 0
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]  # a read that was exactly the payload
        return b"".join(parts)

    def _read_exact(self, start: int, size: int, padded: int) -> bytes | None:
        """``_gather`` on a seekable stream: seek back to the payload and read it whole. The
        next fill is then small: a large read would mostly fetch the next payload twice."""
        offset = self._base + start  # the payload's stream offset
        self._read_size = _READ_AFTER_EXACT
        stream = self._stream
        stream.seek(offset)
        payload = stream.read(size)
        if len(payload) == size and padded > size:
            padding = stream.read(padded - size)
            end = offset + size + len(padding)
        else:
            end = offset + len(payload)
        self._base, self._data, self._pos = end, b"", 0
        self._end = end
        return payload if end == offset + padded else None

    def _skip(self, start: int, padded: int, payload, region):
        """A payload the target takes where it lies in a local file (``region``, from the
        stream's ``region``): seek past it and its padding; None when the file ends first."""
        offset = self._base + start
        end = offset + min(padded, region[2] - region[1])  # not past the end of the file
        self._stream.seek(end)
        self._base, self._data, self._pos = end, b"", 0
        self._end = end
        self._read_size = _READ_AFTER_EXACT
        return payload if end == offset + padded else None

    def _read_into(self, start: int, size: int, padded: int, payload, memory: memoryview):
        """``_gather`` into ``memory``: the part already buffered is copied, the rest read
        straight into it, then the padding is consumed; ``payload`` or None."""
        data = self._data
        have = min(max(len(data) - start, 0), size)
        memory[:have] = memoryview(data)[start : start + have]
        offset = self._base + start + have  # stream offset of the next byte to read
        read, readinto = self._read, self._readinto
        while have < size:
            if readinto is not None:
                count = readinto(memory[have:])
            else:
                chunk = read(min(size - have, _MAX_READ))
                count = len(chunk)
                memory[have : have + count] = chunk
            if not count:
                break
            have += count
            offset += count
        padding = padded - max(size, len(data) - start)  # still to read
        self._end = max(self._end, offset)
        while have == size and padding > 0:
            count = len(read(padding))
            if not count:
                break
            padding -= count
            offset += count
        self._base, self._data, self._pos = offset, b"", 0
        self._read_size = _READ_AFTER_EXACT
        return payload if have == size and padding <= 0 else None

    def _error(self, message: str, at: int) -> ShardError:
        return ShardError(f"{self.url}: {message} at byte {at}")

    def _members(self) -> Iterator[tuple[str, bytes]]:
        long_name: bytes | None = None  # from a GNU 'L' entry, for the next member
        pax: dict[bytes, bytes] | None = None  # from a PAX 'x' header, for the next member
        zero = _ZERO_BLOCK
        limit = self._limit
        if self._on_head is not None:
            self._fill(HEAD_BYTES if limit is None else min(HEAD_BYTES, limit))
            self._on_head(self._data[:HEAD_BYTES])
        while True:
            if len(self._data) - self._pos < BLOCK and not self._fill(BLOCK):
                if self._pos == len(self._data):  # clean end at a member boundary
                    if long_name is not None or pax is not None:
                        raise self._error("stream ends after an extended header", self.offset)
                    return
                raise self._error("truncated header", self.offset)
            data, pos = self._data, self._pos
            header = data[pos : pos + BLOCK]
            if not header[0] and header == zero:  # a member's name never starts with NUL
                if long_name is not None or pax is not None:
                    raise self._error("end-of-archive marker after an extended header",
                                      self.offset)
                self._pos = pos + BLOCK
                self.complete = True
                self._drain()
                return
            start = self._base + pos
            # Unsigned sum with the checksum field as spaces; some old writers used signed bytes.
            field = header[148:156]
            try:  # digits then NULs or spaces, the usual case; else up to the first NUL
                stored = int(field.replace(b"\x00", b" "), 8)
            except ValueError:
                try:
                    stored = int(_cstr(field).strip(), 8)
                except ValueError:
                    stored = -1
            # sum(header) - sum(field) + 8 spaces, ten times faster than sum(): Adler-32's low
            # half is one plus the byte sum modulo 65521, exact for 256 bytes (<= 65,280)
            if stored != (adler32(header[:256]) & 0xFFFF) + (adler32(header[256:]) & 0xFFFF) \
                    - (adler32(field) & 0xFFFF) + 255 and stored != _signed_sum(header):
                raise self._error("bad header checksum", start)
            try:
                # the usual 11 octal digits and a terminator; else the general rules
                size = int(header[124:135], 8) if header[135] in (0, 32) \
                    else _number(header[124:136])
            except ValueError:
                try:
                    size = _number(header[124:136])
                except ValueError:
                    size = -1
            if size < 0:
                raise self._error("bad size field", start)
            typeflag = header[156]
            if typeflag in _EXTENDED:
                record = self._extended(pos, start, size, typeflag)
                if typeflag == 76:  # 'L': the next member's name
                    if long_name is not None:
                        raise self._error("two GNU long names for one member", start)
                    if pax is not None and b"path" in pax:
                        raise self._error("a GNU long name and a PAX path for one member", start)
                    if 0 not in record:  # GNU tar counts the NUL; tarfile would read on
                        raise self._error("GNU long name without its NUL", start)
                    long_name = _cstr(record)
                elif typeflag == 120 or typeflag == 88:  # 'x' (and Solaris 'X'): PAX, per file
                    if pax is not None:
                        raise self._error("two PAX headers for one member", start)
                    pax = _parse_pax(record, self, start)
                    if b"path" in pax and long_name is not None:
                        raise self._error("a GNU long name and a PAX path for one member", start)
                    if any(key.startswith(b"GNU.sparse.") for key in pax):
                        raise self._error("sparse member (not supported)", start)
                elif typeflag == 103:  # 'g': global PAX header
                    records = _parse_pax(record, self, start)
                    if b"path" in records or b"size" in records or \
                            any(key.startswith(b"GNU.sparse.") for key in records):
                        raise self._error("a global PAX header sets path, size or sparse "
                                          "records (not supported)", start)
                # 'K' (the next member's link target) means nothing for a regular file
                continue
            if pax is not None:
                if b"size" in pax:
                    value = pax[b"size"]
                    if not value.isdigit():
                        raise self._error("bad PAX size record", start)
                    size = int(value)
                path = pax.get(b"path")
                if path is not None:
                    path = path.rstrip(b"/")  # as tarfile does
                pax = None
            else:
                path = None
            named = long_name
            long_name = None  # extended headers describe the next member only, whatever it is
            if typeflag in _NO_PAYLOAD or (typeflag == _AREGTYPE and header[:100].split(
                    b"\x00", 1)[0].endswith(b"/")):  # the last: an old-style directory
                self._pos = pos + BLOCK
                continue
            if typeflag == _SPARSE:
                raise self._error("sparse member (not supported)", start)
            end = pos + BLOCK + size
            padded = end + _padding(size)
            if limit is not None and start + BLOCK + size > limit:
                raise self._error(f"member of {size} bytes runs past the {limit} bytes "
                                  f"recorded for the shard", start)
            regular = typeflag in _REGULAR
            into = region = None  # (payload, memory) from the payload target; see _skip
            if regular:
                if path is not None:
                    name = path
                elif named is not None:
                    name = named
                else:
                    name = header[:100]
                    nul = name.find(0)
                    if nul >= 0:
                        name = name[:nul]
                    if header[345]:
                        if header[257:263] != b"ustar\x00":
                            raise self._error("prefix field set in a non-POSIX header", start)
                        name = _cstr(header[345:500]) + b"/" + name
                text = name.decode("utf-8", "surrogateescape")
                if self._target is not None and _EXACT_READ <= size <= _MAX_READ:
                    if self._region is not None and self._stream is not None:
                        region = self._region(self._base + pos + BLOCK)
                    into = self._target(text, size, region)
            if padded > len(data):
                payload = self._gather(pos + BLOCK, size, padded - pos - BLOCK, into, region)
                if payload is None:
                    raise self._error(f"truncated member ({size} bytes expected)", start)
            else:
                self._pos = padded
                payload = None
            if regular:
                if not size and name.endswith(b"/"):  # a directory entry another way
                    continue
                if payload is None:
                    if into is not None:
                        payload, memory = into
                        if memory is not None:
                            memory[:] = memoryview(data)[pos + BLOCK : end]
                    else:
                        payload = data[pos + BLOCK : end]
                yield text, payload
            # else: an unknown type, skipped with its payload

    def _extended(self, pos: int, start: int, size: int, typeflag: int) -> bytes:
        """The payload of an extended header at ``_data[pos:]``, within its cap."""
        cap = PAX_MAX if typeflag in (120, 88, 103) else LONG_NAME_MAX
        if size > cap:
            raise self._error(f"extended header of {size} bytes (more than {cap})", start)
        if self._limit is not None and start + BLOCK + size > self._limit:
            raise self._error(f"member of {size} bytes runs past the {self._limit} bytes "
                              f"recorded for the shard", start)
        end = pos + BLOCK + size
        padded = end + _padding(size)
        if padded <= len(self._data):
            self._pos = padded
            return self._data[pos + BLOCK : end]
        payload = self._gather(pos + BLOCK, size, padded - pos - BLOCK)
        if payload is None:
            raise self._error(f"truncated member ({size} bytes expected)", start)
        return payload

    def _drain(self) -> None:
        """Read the rest of the stream so that ``offset`` counts every byte: up to the known
        length (a byte more is an error), else at most ``DRAIN_MAX`` bytes."""
        self._base += len(self._data)
        self._data, self._pos = b"", 0
        read = self._read
        budget = DRAIN_MAX if self._limit is None else None
        while chunk := read(_READ_SIZE if budget is None else min(_READ_SIZE, budget + 1)):
            self._base += len(chunk)
            if budget is not None:
                budget -= len(chunk)
                if budget < 0:
                    raise ShardMismatchError(f"{self.url}: the stream goes on for more than "
                                             f"{DRAIN_MAX} bytes after the end-of-archive marker")


def _signed_sum(header: bytes) -> int:
    chk = header[148:156]
    return (
        sum(b - 256 if b > 127 else b for b in header)
        - sum(b - 256 if b > 127 else b for b in chk)
        + 256
    )


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 when the high bit is set."""
    if field[0] == 0x80 or field[0] == 0xFF:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] == 0xFF else value
    return int(_cstr(field).strip() or b"0", 8)


def _parse_pax(payload: bytes, members: TarMembers, at: int) -> dict[bytes, bytes]:
    """Records of the form b"<length> <key>=<value>\\n"."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(payload) and payload[pos]:
        space = payload.find(b" ", pos, pos + 21)
        digits = payload[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        record = payload[space + 1 : pos + length]
        if length <= space + 1 - pos or pos + length > len(payload) \
                or not record.endswith(b"\n") or record.find(b"=") <= 0:
            raise members._error("bad PAX header", at)
        key, value = record[:-1].split(b"=", 1)
        records[key] = value
        pos += length
    return records


def iter_members(stream: BinaryIO, url: str, payload_target=None, *, limit: int | None = None,
                 on_head=None) -> TarMembers:
    """Iterate ``(name, payload)`` over the regular files of a tar read from ``stream``.

    ``stream`` needs only ``read(n)``. Raises ShardError naming ``url`` and the byte offset on a
    bad checksum or a stream that ends inside a member. The returned iterator's ``offset`` is the
    number of bytes consumed, ``complete`` whether the end-of-archive marker was seen.

    Payloads are ``bytes``. ``payload_target(name, size, region)`` is asked about each regular
    file's payload from 128 KiB to 64 MiB, with ``region`` the ``(path, offset, file size,
    st_dev, st_ino)`` of the payload when ``stream`` is a local file (else None). When it
    returns ``(payload, memory)``, the payload is read into ``memory`` (a writable memoryview
    of that size) and ``payload`` yielded instead; ``(payload, None)``: the payload is left in
    the file, unread (the reader seeks past it), and ``payload`` yielded.

    ``limit``: the stream's length when known (a manifest's byte count): a member that runs past
    it, or a byte beyond it, is a ShardError (``ShardMismatchError`` for the byte), so a stream
    that goes on is never read further. ``on_head(first)`` is called with the first
    ``HEAD_BYTES`` bytes (fewer if the stream is shorter) before any member is parsed.
    """
    return TarMembers(stream, url, payload_target, limit=limit, on_head=on_head)
