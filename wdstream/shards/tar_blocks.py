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

from wdstream.shards.tar_header import BLOCK

MIN_ROWS = 16  # fewer candidate headers than this: the general parser is as quick
_OCTAL_SIZE = 8 ** np.arange(10, -1, -1, dtype=np.int64)  # 11 digits, most significant first
_OCTAL_SUM = 8 ** np.arange(5, -1, -1, dtype=np.int64)  # the checksum's 6 digits
_MAGIC_AT = 257  # magic + version: where a header says what it is
_NOT_FIRST_BYTE = np.frombuffer(b"\0" + b"\xff" * 7, np.uint64)[0]  # a word's first byte masked


def _byte_sums(rows: np.ndarray) -> np.ndarray:
    """The sum of each row's bytes."""
    return np.add.reduce(rows, axis=1, dtype=np.uint32).astype(np.int64)


def scan_members(data: bytes, pos: int, magic: bytes, pax_keys: Collection[bytes],
                 *, size_below: int | None) -> tuple[list, int] | None:
    """The regular members at ``data[pos:]`` with headers of ``magic`` (bytes 257 to 264),
    each after a PAX header of one record of a key in ``pax_keys`` or after none, as a list
    of ``(name, payload)`` and the position after the last; None when there are none to
    give this way.

    Only members ``data`` holds whole are given, so none runs past a shard's recorded
    length (the buffer never holds a byte beyond it). ``size_below``: payloads of this size
    or more are left to the general parser (which hands them to a payload target)."""
    rows_total = (len(data) - pos) // BLOCK
    if rows_total < MIN_ROWS:
        return None
    blocks = np.frombuffer(data, np.uint8, rows_total * BLOCK, pos).reshape(rows_total, BLOCK)
    # bytes 256 to 263 of each block as one word: the magic but its last byte, after the
    # link name's last (masked)
    words = np.frombuffer(data, np.uint64, rows_total * BLOCK // 8, pos)[_MAGIC_AT // 8 :: 64]
    word = np.frombuffer(bytes(1) + magic[:7], np.uint64)[0]
    rows = np.flatnonzero(words & _NOT_FIRST_BYTE == word)
    if len(rows) < MIN_ROWS or rows[0] != 0:
        return None
    heads = blocks[rows]
    # the general parser's checks, every row at once: the magic, the size and checksum
    # fields as the usual writers fill them, the unsigned checksum
    size_digits = heads[:, 124:135] - np.uint8(48)  # wraps below '0': fails the <= 7
    sum_digits = heads[:, 148:154] - np.uint8(48)
    sizes = size_digits @ _OCTAL_SIZE
    valid = (heads[:, _MAGIC_AT + 7] == magic[7]) & (size_digits <= 7).all(1) \
        & ((heads[:, 135] == 0) | (heads[:, 135] == 32)) & (sum_digits <= 7).all(1) \
        & (heads[:, 154] == 0) & (heads[:, 155] == 32) \
        & (sum_digits @ _OCTAL_SUM == _byte_sums(heads) - _byte_sums(heads[:, 148:156])
           + 8 * 32)
    kept = np.flatnonzero(valid)
    if len(kept) < MIN_ROWS or kept[0] != 0:
        return None
    rows, sizes = rows[kept], sizes[kept]
    typeflags = heads[kept, 156]
    # a regular file without prefix (its name is its first field)
    is_regular = (typeflags == ord("0")) & (heads[kept, 345] == 0)
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
    names_at = heads[kept[taken], :100] == 0
    name_lengths = np.where(names_at.any(1), names_at.argmax(1), 100)
    starts = pos + rows[taken] * BLOCK
    members = []
    add = members.append
    for start, length, size in zip(starts.tolist(), name_lengths.tolist(),
                                   sizes[taken].tolist(), strict=True):
        name = data[start : start + length]
        if size or not name.endswith(b"/"):  # else a directory entry
            add((name.decode("utf-8", "surrogateescape"),
                 data[start + BLOCK : start + BLOCK + size]))
    return members, pos + int(ends[count - 1]) * BLOCK
