"""The quick way through a buffer of small tar members: its blocks read as one array.

The members of a shard mostly have headers of one kind: regular files with the magic of a
header the reader has verified and no prefix, and, in shards that ``tarfile`` or webdataset
wrote, before each a PAX header of one record of a key the reader ignores (``mtime``).
``scan_members`` reads a buffer of such members as a two-dimensional array, one row per
512-byte block: it finds the blocks that could be headers, checks them all at once as the
general parser checks one (magic, size and checksum fields, the checksum, the PAX record's
length and key), and follows the chain of sizes from the buffer's first block. The members
it gives are those of an unbroken chain: each header is where the one before it says the
next begins, so a payload that merely looks like a header is never read as one. It stops
before anything else (another kind of header or record, a bad checksum, the end-of-archive
marker, a member the buffer does not hold whole) and leaves it to the general parser.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from wdstream.shards.tar_buffer import READ_SIZE
from wdstream.shards.tar_header import (
    BLOCK,
    CHECKSUM_AT,
    CHECKSUM_END,
    MAGIC_AT,
    NAME_END,
    PREFIX_AT,
    SIZE_AT,
    SIZE_END,
    TYPEFLAG_AT,
)

MIN_ROWS = 64  # fewer candidate headers than this in a buffer: the general parser is quicker
# members above this size: too few of them in a read of the reader's (1 MiB) for a scan
SCAN_SIZE_MAX = READ_SIZE // MIN_ROWS
_OCTAL_SIZE = 8 ** np.arange(10, -1, -1, dtype=np.int64)  # 11 digits, most significant first
# the checksum's 6 digits, each weighed once more: a checksum field of the usual form holds
# the digits + 48 each, a NUL and a space, so the header's byte sum with that field read as 8
# spaces (what the checksum is) is the whole byte sum - the digits' sum - 6 * 48 - 32 + 8 * 32
_OCTAL_SUM = 8 ** np.arange(5, -1, -1, dtype=np.int64) + 1
_FIELD_AS_SPACES = 6 * 48 + 32 - 8 * 32
_NOT_FIRST_BYTE = np.frombuffer(b"\0" + b"\xff" * 7, np.uint64)[0]  # a word's first byte masked


def _byte_sums(rows: np.ndarray) -> np.ndarray:
    """The sum of each row's bytes."""
    return np.add.reduce(rows, axis=1, dtype=np.uint32).astype(np.int64)


def _run_start(data: bytes, pos: int, magic: bytes, pax_keys: Collection[bytes],
               size_below: int | None) -> int | None:
    """A quick look at the header at ``pos``, before the arrays are built: None when it
    cannot start a run, else the bytes of its member (0 for a PAX header). A run's header is
    a regular file's without prefix, its payload of a size the scan takes, or a PAX header
    whose record is of a key in ``pax_keys``, with ``magic``."""
    if not data.startswith(magic, pos + MAGIC_AT):
        return None
    typeflag = data[pos + TYPEFLAG_AT]
    if typeflag != 48 and typeflag != 120 or typeflag == 48 and data[pos + PREFIX_AT]:
        return None
    try:
        size = int(data[pos + SIZE_AT : pos + SIZE_END - 1], 8)
    except ValueError:
        return None
    if typeflag == 48:
        return BLOCK + size if size_below is None or size < size_below else None
    if any(data.startswith(b"%d %s=" % (size, key), pos + BLOCK) for key in pax_keys):
        return 0
    return None


def scan_members(data: bytes, pos: int, magic: bytes, pax_keys: Collection[bytes],
                 *, size_below: int | None) -> tuple[list, int] | None:
    """The regular members at ``data[pos:]`` with ``magic`` in their headers (bytes 257 to 263),
    each after a PAX header of one record of a key in ``pax_keys`` or after none, as a list
    of ``(name, payload)`` and the position after the last. The list is empty when a quick
    look at the header at ``pos`` tells it does not start such a run (one may start further
    on); None when the rest of ``data`` is not worth another scan: too few headers, or a
    first header that the scan found is not one of a run.

    Only members ``data`` holds whole are given, so none runs past a shard's recorded
    length (the buffer never holds a byte beyond it). ``size_below``: payloads of this size
    or more are left to the general parser (which hands them to a payload target)."""
    first = _run_start(data, pos, magic, pax_keys, size_below)
    if first is None:
        return [], pos
    rows_total = (len(data) - pos) // BLOCK
    # too few headers, or of members like the first, in the rest of the buffer
    if rows_total < MIN_ROWS or first * MIN_ROWS > len(data) - pos:
        return None
    blocks = np.frombuffer(data, np.uint8, rows_total * BLOCK, pos).reshape(rows_total, BLOCK)
    # bytes 256 to 263 of each block as one word: the link name's last (masked), then the
    # magic
    words = np.frombuffer(data, np.uint64, rows_total * BLOCK // 8, pos)[MAGIC_AT // 8 :: 64]
    word = np.frombuffer(bytes(1) + magic, np.uint64)[0]
    rows = np.flatnonzero(words & _NOT_FIRST_BYTE == word)
    if len(rows) < MIN_ROWS:
        return None
    heads = blocks[rows]
    # tar_header's checks (checksum_ok, header_size), every row at once: the size and
    # checksum fields in their usual form, the unsigned checksum
    size_digits = heads[:, SIZE_AT : SIZE_END - 1] - np.uint8(48)  # wraps below '0': > 7
    sum_digits = heads[:, CHECKSUM_AT : CHECKSUM_END - 2] - np.uint8(48)
    sizes = size_digits @ _OCTAL_SIZE
    terminator = heads[:, SIZE_END - 1]
    valid = (size_digits <= 7).all(1) & ((terminator == 0) | (terminator == 32)) \
        & (sum_digits <= 7).all(1) & (heads[:, CHECKSUM_END - 2] == 0) \
        & (heads[:, CHECKSUM_END - 1] == 32) \
        & (sum_digits @ _OCTAL_SUM == _byte_sums(heads) - _FIELD_AS_SPACES)
    kept = np.flatnonzero(valid)
    if not len(kept) or kept[0] != 0:
        return None
    rows, sizes = rows[kept], sizes[kept]
    typeflags = heads[kept, TYPEFLAG_AT]
    # a regular file without prefix (its name is its first field)
    is_regular = (typeflags == ord("0")) & (heads[kept, PREFIX_AT] == 0)
    if size_below is not None:
        is_regular &= sizes < size_below
    steps = 1 + (sizes + (BLOCK - 1)) // BLOCK

    # PAX headers of one record of a key met before (whose value means nothing here)
    is_pax = np.zeros(len(rows), bool)
    maybe_pax = np.flatnonzero(typeflags == ord("x"))
    if pax_keys and len(maybe_pax):
        flat = blocks.reshape(-1)
        pax_sizes = sizes[maybe_pax]
        for size in set(pax_sizes.tolist()):
            same = maybe_pax[pax_sizes == size]
            record_at = (rows[same] + 1) * BLOCK
            last = record_at + size - 1
            inside = last < len(flat)
            same, record_at, last = same[inside], record_at[inside], last[inside]
            ends_line = flat[last] == 10
            for key in pax_keys:
                prefix = np.frombuffer(b"%d %s=" % (size, key), np.uint8)
                if len(prefix) >= size:
                    continue
                starts = flat[record_at[:, None] + np.arange(len(prefix))]
                is_pax[same[ends_line & (starts == prefix).all(1)]] = True

    # the chain: each header where the one before it ends, a PAX header before a regular one
    ends = rows + steps
    good = is_regular | is_pax
    good[:-1] &= (ends[:-1] == rows[1:]) & (~is_pax[:-1] | is_regular[1:])
    good[-1] &= (ends[-1] <= rows_total) & ~is_pax[-1]
    broken = np.flatnonzero(~good)
    count = int(broken[0]) if len(broken) else len(rows)
    if count and is_pax[count - 1]:  # its member is not given: leave both
        count -= 1
    if count == 0:
        return None
    taken = np.flatnonzero(is_regular[:count])
    names = heads[kept[taken], :NAME_END]
    sizes = sizes[taken]
    files = _not_directories(names, sizes)
    if files is not None:
        taken, names, sizes = taken[files], names[files], sizes[files]
    payload_starts = pos + rows[taken] * BLOCK + BLOCK
    payload_ends = (payload_starts + sizes).tolist()
    payloads = [data[begin:end]
                for begin, end in zip(payload_starts.tolist(), payload_ends, strict=True)]
    members = list(zip(_decoded_names(names), payloads, strict=True))
    return members, pos + int(ends[count - 1]) * BLOCK


def _not_directories(names: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """Which members are files (a mask), or None when all are: a directory entry is an empty
    member whose name ends in "/". Only empty members' names are looked at."""
    empty = np.flatnonzero(sizes == 0)
    if not len(empty):
        return None
    names_at = names[empty] == 0
    name_lengths = np.where(names_at.any(1), names_at.argmax(1), NAME_END)
    files = np.ones(len(sizes), bool)
    files[empty] = names[empty, np.maximum(name_lengths - 1, 0)] != 47
    return files


def _decoded_names(fields: np.ndarray) -> list[str]:
    """Tar name fields (rows of 100 bytes, each a name up to its first NUL) as ``str``,
    decoded as the general parser decodes one (UTF-8, undecodable bytes escaped), in one
    call rather than one per name."""
    listed = fields.view(f"S{fields.shape[1]}").ravel().tolist()  # trailing NULs dropped
    text = b"\n".join(listed).decode("utf-8", "surrogateescape")
    names = text.split("\n")
    if len(names) == len(listed) and "\0" not in text:
        return names
    # a name holding a newline, or bytes after its first NUL: name by name
    return [name.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") for name in listed]
