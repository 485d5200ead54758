"""The 512-byte tar header of the shard format: its layout, building one, reading its fields.

A header is: name (100) | mode, uid, gid (24) | size (12) | mtime (12) | checksum (8) |
typeflag (1), linkname (100), magic + version (8), uname + gname (64), devmajor + devminor
(16) | prefix (155) | padding (12). The writer (``tar_writer``) fixes every field that could
vary between runs. What a valid header is, is said once, here: its checksum (``checksum_ok``),
its size (``header_size``) and its name (``header_name``), as GNU tar, ``tarfile`` and
webdataset write them; the reader (``tar_reader``) reads every header through them, and the
block scan (``tar_blocks``) checks a buffer's headers in the usual form these accept (the
size field eleven octal digits and a NUL or space, the checksum six octal digits, a NUL and a
space), at the offsets below.
"""

from __future__ import annotations

from zlib import adler32

from wdstream.errors import InputError

BLOCK = 512
END_SIZE = 2 * BLOCK  # the end-of-archive marker: two zero blocks

NAME_MAX = 100
PREFIX_MAX = 155
LONGLINK = b"././@LongLink"
USTAR_MAGIC = b"ustar\x0000"  # magic + version of POSIX ustar
GNU_MAGIC = b"ustar  \x00"  # magic + version of GNU tar, used around a longname entry
OCTAL_SIZE_MAX = 8**11 - 1  # the largest size that fits 11 octal digits (8 GiB - 1)

# Where the fields the reader reads are
NAME_END = 100
SIZE_AT, SIZE_END = 124, 136
CHECKSUM_AT, CHECKSUM_END = 148, 156
TYPEFLAG_AT = 156
MAGIC_AT = 257
PREFIX_AT, PREFIX_END = 345, 500

# Type flags. Regular files yield a member; links, devices, directories and FIFOs carry no
# payload whatever their size field says; extended headers (GNU long name/link, PAX per-file
# and global) describe the next member; sparse files are refused; any other type is skipped
# with its payload (as tarfile and GNU tar do), taking the pending extended headers with it.
REGULAR = frozenset(b"07\x00")
NO_PAYLOAD = frozenset(b"123456")
EXTENDED = frozenset(b"LKxXg")
SPARSE = 83  # 'S'
AREGTYPE = 0  # the old regular type; a name ending in "/" makes it a directory


def padding(n: int) -> int:
    """The zero bytes after a payload of ``n`` bytes, up to the next block."""
    return -n % BLOCK


def size_field(size: int) -> bytes:
    if size <= OCTAL_SIZE_MAX:
        return b"%011o\x00" % size
    # GNU base-256: a set high bit, then the number big-endian in the remaining 11 bytes.
    return b"\x80" + size.to_bytes(11, "big")


# Everything but the name, size and prefix is the same for every member of a kind, so those
# bytes are joined once here, and their share of the checksum (the unsigned sum of all 512
# bytes, the checksum field counted as 8 spaces) summed once: a member's checksum is that
# constant plus the sums of its name, size and prefix bytes.
MODE_UID_GID = b"0000644\x000000000\x000000000\x00"
MTIME = b"00000000000\x00"
PREFIX_PAD = bytes(12)


def _tail(typeflag: bytes, magic: bytes) -> bytes:
    """The header bytes after the checksum field and before the prefix."""
    return typeflag + bytes(NAME_MAX) + magic + bytes(64) + b"0000000\x000000000\x00"


def _fixed_sum(tail: bytes) -> int:
    return sum(MODE_UID_GID) + sum(MTIME) + 8 * 32 + sum(tail) + sum(PREFIX_PAD)


REGULAR_TAIL = _tail(b"0", USTAR_MAGIC)  # a regular file, POSIX ustar
REGULAR_TAIL_EMPTY_PREFIX = REGULAR_TAIL + bytes(PREFIX_MAX) + PREFIX_PAD
REGULAR_SUM = _fixed_sum(REGULAR_TAIL)
_TAILS = {
    (typeflag, magic): (_tail(typeflag, magic), _fixed_sum(_tail(typeflag, magic)))
    for typeflag in (b"0", b"L")
    for magic in (USTAR_MAGIC, GNU_MAGIC)
}


def build_header(
    name: bytes, size: int, typeflag: bytes, prefix: bytes = b"", magic: bytes = USTAR_MAGIC
) -> bytes:
    """A 512-byte header; ``name`` and ``prefix`` fit their fields (100 and 155 bytes)."""
    tail, fixed = _TAILS[typeflag, magic]
    field = size_field(size)
    checksum = fixed + sum(name) + sum(field) + sum(prefix)
    return b"".join(
        (
            name.ljust(NAME_MAX, b"\x00"),
            MODE_UID_GID,
            field,
            MTIME,
            b"%06o\x00 " % checksum,
            tail,
            prefix.ljust(PREFIX_MAX, b"\x00"),
            PREFIX_PAD,
        )
    )


def ustar_split(name: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) for a ustar header, or None when a GNU longname entry is needed.

    Takes the shortest prefix that fits, as Python's tarfile does."""
    if len(name) <= NAME_MAX:
        return b"", name
    parts = name.split(b"/")
    for i in range(1, len(parts)):
        prefix, rest = b"/".join(parts[:i]), b"/".join(parts[i:])
        if len(prefix) <= PREFIX_MAX and 0 < len(rest) <= NAME_MAX:
            return prefix, rest
    return None


def encode_name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if not raw or b"\x00" in raw:
        raise InputError(f"tar member name {name!r}: empty or contains a NUL character")
    return raw


def cstr(field: bytes) -> bytes:
    """A NUL-terminated field's text."""
    end = field.find(b"\x00")
    return field if end < 0 else field[:end]


def signed_sum(header: bytes) -> int:
    chk = header[148:156]
    return (
        sum(b - 256 if b > 127 else b for b in header)
        - sum(b - 256 if b > 127 else b for b in chk)
        + 256
    )


def numeric_field(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 when the high bit is set."""
    if field[0] == 0x80 or field[0] == 0xFF:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] == 0xFF else value
    return int(cstr(field).strip() or b"0", 8)


def checksum_ok(header: bytes, tails: dict[int, tuple[bytes, int]] | None = None) -> bool:
    """Whether the checksum field holds the sum of the header's bytes, the field itself
    counted as eight spaces: unsigned as POSIX says, or signed as some old writers summed.

    ``tails``: a reader's memo, by type flag, of the bytes after the checksum field of a
    header found right and their sum; the headers of a shard mostly share those bytes, and
    one that does needs only its first 148 bytes summed."""
    stored = _stored_checksum(header[CHECKSUM_AT:CHECKSUM_END])
    known = None if tails is None else tails.get(header[TYPEFLAG_AT])
    if known is not None and header.endswith(known[0]) \
            and stored == (adler32(header[:CHECKSUM_AT]) & 0xFFFF) - 1 + known[1]:
        return True
    total = unsigned_sum(header)
    if stored == total:
        if tails is not None:
            tails[header[TYPEFLAG_AT]] = (header[CHECKSUM_END:],
                                          total - (adler32(header[:CHECKSUM_AT]) & 0xFFFF) + 1)
        return True
    return stored == signed_sum(header)


def unsigned_sum(header: bytes) -> int:
    """The unsigned sum of the header's bytes, the checksum field as spaces. Adler-32's low
    half is one plus the byte sum modulo 65,521: exact for up to 256 bytes (at most 65,280),
    and one C call instead of a Python loop."""
    return ((adler32(header[:CHECKSUM_AT]) & 0xFFFF) + (adler32(header[CHECKSUM_END:334]) & 0xFFFF)
            + (adler32(header[334:]) & 0xFFFF) - 3 + 8 * 32)


def _stored_checksum(field: bytes) -> int:
    """The checksum field's octal digits then NULs or spaces (the usual form), else its text
    up to the first NUL; -1 when neither is a number."""
    try:
        return int(field.replace(b"\x00", b" "), 8)
    except ValueError:
        try:
            return int(cstr(field).strip(), 8)
        except ValueError:
            return -1


def header_size(header: bytes) -> int:
    """The size field: eleven octal digits and a NUL or space (the usual form), else as
    ``numeric_field`` reads it; -1 when it is no number."""
    try:
        if header[SIZE_END - 1] in (0, 32):
            return int(header[SIZE_AT : SIZE_END - 1], 8)
        return numeric_field(header[SIZE_AT:SIZE_END])
    except ValueError:
        try:
            return numeric_field(header[SIZE_AT:SIZE_END])
        except ValueError:
            return -1


def header_name(header: bytes) -> bytes:
    """The name field up to its first NUL, after the prefix field and a "/" when a POSIX
    header has one; ValueError for a prefix in another kind of header."""
    name = header[:NAME_END]
    nul = name.find(0)
    if nul >= 0:
        name = name[:nul]
    if header[PREFIX_AT]:
        if header[MAGIC_AT : MAGIC_AT + 6] != b"ustar\x00":
            raise ValueError("prefix field set in a non-POSIX header")
        name = cstr(header[PREFIX_AT:PREFIX_END]) + b"/" + name
    return name


def parse_pax(payload: bytes) -> dict[bytes, bytes]:
    """Records of the form b"<length> <key>=<value>\\n"; ValueError when they are malformed."""
    # the usual payload: one record, such as b"28 mtime=1796160775.6660953\n"
    space = payload.find(b" ", 0, 21)
    if space > 0:
        digits = payload[:space]
        if digits.isdigit() and int(digits) == len(payload) and payload[-1] == 10:
            equals = payload.find(b"=", space + 1)
            if equals > space + 1:
                return {payload[space + 1 : equals]: payload[equals + 1 : -1]}
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(payload) and payload[pos]:
        space = payload.find(b" ", pos, pos + 21)
        digits = payload[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        record = payload[space + 1 : pos + length]
        if length <= space + 1 - pos or pos + length > len(payload) \
                or not record.endswith(b"\n") or record.find(b"=") <= 0:
            raise ValueError("bad PAX header")
        key, value = record[:-1].split(b"=", 1)
        records[key] = value
        pos += length
    return records
