"""The shard format's streaming tar reader: ``iter_members``, the members of a tar stream.

It parses 512-byte headers itself from a ``TarBuffer`` (``tar_buffer``: large reads, payloads
sliced out of them), several times faster than ``tarfile`` in streaming mode on small members.
It reads what GNU tar,
``tarfile`` and webdataset write: ustar, GNU longname/longlink, PAX extended headers; what it
cannot read as POSIX and GNU define it (sparse members, a global header that names files, two
long names for one member, an extended header with no member after it) is a ShardError, never
a payload under another member's name. Extended records are capped (``LONG_NAME_MAX``,
``PAX_MAX``), and so is what is read after the end-of-archive marker; a member whose header
claims more than ``member_limit`` bytes is a ``LimitError`` before any of it is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from types import MappingProxyType
from typing import BinaryIO
from zlib import adler32

from wdstream.errors import LimitError
from wdstream.shards.tar_blocks import SCAN_SIZE_MAX, scan_members
from wdstream.shards.tar_buffer import MAX_READ, TARGET_READ, TarBuffer
from wdstream.shards.tar_header import (
    AREGTYPE,
    BLOCK,
    EXTENDED,
    NO_PAYLOAD,
    REGULAR,
    SPARSE,
    cstr,
    number,
    padding,
    parse_pax,
    signed_sum,
)
from wdstream.sources.hashing import HEAD_BYTES  # what ``on_head`` is given

_ZERO_BLOCK = bytes(BLOCK)
LONG_NAME_MAX = 1 << 16  # a GNU long name or link: far above any file system's PATH_MAX
PAX_MAX = 1 << 20  # a PAX extended header: names, times and a few attributes


class TarMembers(TarBuffer):
    """Iterator over the regular-file members of a tar stream, as ``(name, payload)`` pairs.

    ``offset`` is the number of bytes consumed from the stream so far. After the end-of-archive
    marker the rest of the stream is read (GNU tar pads to 10 KiB records) up to ``limit`` or
    ``DRAIN_MAX`` bytes, so once iteration is exhausted ``offset`` is the stream's total length
    and ``complete`` says whether the marker was seen (False: the stream ended cleanly at a
    member boundary without it).
    """

    def __init__(self, stream: BinaryIO, url: str, payload_target=None, *,
                 limit: int | None = None, on_head=None, member_limit: int | None = None):
        super().__init__(stream, url, limit)
        self._on_head = on_head
        self._member_limit = member_limit
        self._member: str | None = None  # the member whose payload is being read, if any
        # payload_target(name, size, region) -> (payload, memory) or None: where payloads of
        # TARGET_READ to MAX_READ bytes go (see iter_members)
        self._target = payload_target
        self.complete = False
        self._gen = None

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        if self._gen is None:  # one member per list: ``offset`` is after the member given
            self._gen = chain.from_iterable(self._parse(one=True))
        return self._gen

    def __next__(self) -> tuple[str, bytes]:
        return next(iter(self))

    def batches(self) -> Iterator[list[tuple[str, bytes]]]:
        """The members as lists: those parsed from the buffer before the parser reads the
        stream again (or raises, or ends), so a list holds no member the stream has not yet
        given; an error comes after the members before it, on the next request. ``offset``
        is then after the last member of the list given. Iterate either this or the
        members, not both."""
        return self._parse(one=False)

    def _pax(self, record: bytes, at: int) -> dict[bytes, bytes]:
        try:
            return parse_pax(record)
        except ValueError as exc:
            raise self._error(str(exc), at) from None

    def _parse(self, one: bool) -> Iterator[list[tuple[str, bytes]]]:
        pending: list[tuple[str, bytes]] = []  # parsed, not yet handed over
        try:
            yield from self._members(pending, one)
        except Exception as error:
            if getattr(error, "in_stream", False):  # a decompressed stream's limit: say where
                where = f"member {self._member!r}" if self._member is not None \
                    else f"the header at byte {self.offset}"
                error.args = (f"{error.args[0]}, reading {where}",)
                error.in_stream = False
            if pending:  # the members before the error first; it is raised when asked again
                batch = pending[:]
                pending.clear()
                yield batch
            raise
        if pending:
            yield pending

    def _members(self, pending: list, one: bool) -> Iterator[list[tuple[str, bytes]]]:
        """Parses members into ``pending``; yields a copy of it (and empties it) before each
        read of the stream, so that nothing is read before the members already parsed are
        used, and (``one``) after each member."""
        add = pending.append
        long_name: bytes | None = None  # from a GNU 'L' entry, for the next member
        pax: dict[bytes, bytes] | None = None  # from a PAX 'x' header, for the next member
        zero = _ZERO_BLOCK
        limit = self._limit
        most = self._member_limit or 1 << 62  # bytes a member may claim
        # per type flag: a verified header's bytes after its checksum field, and their sum
        tails: dict[int, tuple[bytes, int]] = {}
        plain: tuple[bytes, int] | None = None  # that of a regular file without prefix
        no_payload, regular_types, extended = NO_PAYLOAD, REGULAR, EXTENDED
        target = self._target
        # PAX headers whose payload was one record of a key that means nothing here, by
        # their size field: the header, payload size, size with padding, b"<length> <key>="
        repeats: dict[bytes, tuple[bytes, int, int, bytes]] = {}
        # the block scan (tar_blocks) of a buffer of members like those verified: the magic
        # of their headers, the keys of their PAX records, and where it is tried next (past
        # a position in this buffer, or in the next)
        magic: bytes | None = None
        pax_keys: set[bytes] = set()
        scanned, scan_at = None, 0
        last_size = 0  # of the last member read the general way: a scan's only after small ones
        if self._on_head is not None:
            self._fill(HEAD_BYTES if limit is None else min(HEAD_BYTES, limit))
            self._on_head(self._data[:HEAD_BYTES])
        while True:
            if len(self._data) - self._pos < BLOCK:
                if pending:
                    yield pending[:]
                    pending.clear()
                if not self._fill(BLOCK):
                    if self._pos == len(self._data):  # clean end at a member boundary
                        if long_name is not None or pax is not None:
                            raise self._error("stream ends after an extended header",
                                              self.offset)
                        return
                    raise self._error("truncated header", self.offset)
            data, pos = self._data, self._pos
            if magic is not None and last_size <= SCAN_SIZE_MAX and not one and pax is None \
                    and long_name is None and (data is not scanned or pos >= scan_at):
                found = scan_members(data, pos, magic, pax_keys,
                                     size_below=None if target is None else TARGET_READ)
                scanned = data
                if found is None:  # too few headers left in this buffer
                    scan_at = len(data)
                else:  # up to what it does not take, which the general way reads next
                    members, self._pos = found
                    scan_at = self._pos + 1
                    if members:
                        pending += members
                        continue
            if data[pos + 156] == 120 and pax is None and data[pos]:
                seen = repeats.get(data[pos + 124 : pos + 136])  # by its size field
                if seen is not None and data.startswith(seen[0], pos) \
                        and pos + seen[2] <= len(data) \
                        and (limit is None or self._base + pos + BLOCK + seen[1] <= limit) \
                        and data.startswith(seen[3], pos + BLOCK) \
                        and data[pos + BLOCK + seen[1] - 1] == 10:
                    # a PAX header like an earlier one, with one record of the same length
                    # and key, a key that means nothing for a regular file (an mtime...)
                    pax = _NO_RECORDS
                    self._pos = pos + seen[2]
                    continue
            header = data[pos : pos + BLOCK]
            if not header[0] and header == zero:  # a member's name never starts with NUL
                if long_name is not None or pax is not None:
                    raise self._error("end-of-archive marker after an extended header",
                                      self.offset)
                self._pos = pos + BLOCK
                self.complete = True
                if pending:
                    yield pending[:]
                    pending.clear()
                self._drain()
                return
            start = self._base + pos
            typeflag = header[156]
            if typeflag == 48 and plain is not None and long_name is None and (
                    pax is None or pax is _NO_RECORDS) and header[154] == 0 \
                    and header[155] == 32 and header.endswith(plain[0]):
                # A regular file whose header is one of the shard's usual ones (the same
                # bytes after the checksum as a verified one, no prefix, no extended header
                # that names it): the checks below, with the steps for other headers left out.
                # Anything it does not take (a bad checksum too) goes the general way.
                try:
                    stored = int(header[148:154], 8)
                    size = int(header[124:135], 8)
                except ValueError:
                    stored = size = -1
                end = pos + BLOCK + size
                padded = end + (-size % BLOCK)
                if 0 <= size <= most and header[135] in (0, 32) and padded <= len(data) \
                        and stored == (adler32(header[:148]) & 0xFFFF) + plain[1] \
                        and (limit is None or start + BLOCK + size <= limit) \
                        and (target is None or not TARGET_READ <= size <= MAX_READ):
                    pax = None
                    self._pos = padded
                    nul = header.find(0, 0, 100)
                    name = header[:nul] if nul >= 0 else header[:100]
                    last_size = size
                    if size or not name.endswith(b"/"):  # else a directory entry
                        add((name.decode("utf-8", "surrogateescape"), data[pos + BLOCK : end]))
                        if one:
                            yield pending[:]
                            pending.clear()
                    continue
            # The checksum: the unsigned sum of the header with its checksum field as spaces
            # (some old writers used signed bytes). Adler-32's low half is one plus the byte
            # sum modulo 65521, exact for up to 256 bytes (<= 65,280), ten times faster than
            # sum(). Headers of a shard mostly share their bytes after the checksum field
            # with an earlier header of their type, whose sum of those bytes is then known.
            known = tails.get(typeflag)
            if known is not None and header[154] == 0 and header[155] == 32 \
                    and header.endswith(known[0]):
                try:  # the usual field: six octal digits, NUL, space
                    stored = int(header[148:154], 8)
                except ValueError:
                    stored = -1
                if stored == (adler32(header[:148]) & 0xFFFF) + known[1]:
                    known = True
            if known is not True:
                field = header[148:156]
                try:  # digits then NULs or spaces, the usual case; else up to the first NUL
                    stored = int(field.replace(b"\x00", b" "), 8)
                except ValueError:
                    try:
                        stored = int(cstr(field).strip(), 8)
                    except ValueError:
                        stored = -1
                tail = header[156:]
                tail_sum = (adler32(tail[:178]) & 0xFFFF) + (adler32(tail[178:]) & 0xFFFF) - 2
                if stored == (adler32(header[:148]) & 0xFFFF) - 1 + tail_sum + 256:
                    tails[typeflag] = (tail, tail_sum + 255)  # + 8 spaces - Adler's 1
                    if typeflag == 48 and not tail[189]:  # no prefix: see the usual path
                        plain = tails[typeflag]
                        magic = header[257:264]
                elif stored != signed_sum(header):
                    raise self._error("bad header checksum", start)
            try:
                # the usual 11 octal digits and a terminator; else the general rules
                size = int(header[124:135], 8) if header[135] in (0, 32) \
                    else number(header[124:136])
            except ValueError:
                try:
                    size = number(header[124:136])
                except ValueError:
                    size = -1
            if size < 0:
                raise self._error("bad size field", start)
            if typeflag in extended:
                if pending and pos + BLOCK + size + padding(size) > len(data):  # it reads
                    yield pending[:]
                    pending.clear()
                record = self._extended(pos, start, size, typeflag)
                if typeflag == 76:  # 'L': the next member's name
                    if long_name is not None:
                        raise self._error("two GNU long names for one member", start)
                    if pax is not None and b"path" in pax:
                        raise self._error("a GNU long name and a PAX path for one member", start)
                    if 0 not in record:  # GNU tar counts the NUL; tarfile would read on
                        raise self._error("GNU long name without its NUL", start)
                    long_name = cstr(record)
                elif typeflag == 120 or typeflag == 88:  # 'x' (and Solaris 'X'): PAX, per file
                    if pax is not None:
                        raise self._error("two PAX headers for one member", start)
                    pax = self._pax(record, start)
                    if b"path" in pax and long_name is not None:
                        raise self._error("a GNU long name and a PAX path for one member", start)
                    if b"GNU.sparse." in record and any(
                            key.startswith(b"GNU.sparse.") for key in pax):
                        raise self._error("sparse member (not supported)", start)
                    if typeflag == 120 and len(repeats) < 16:
                        prefix = _ignored_record(size, record, pax)
                        if prefix is not None:
                            repeats[header[124:136]] = (header, size,
                                                        BLOCK + size + padding(size), prefix)
                            pax_keys.update(pax)  # its one key
                elif typeflag == 103:  # 'g': global PAX header
                    records = self._pax(record, start)
                    if b"path" in records or b"size" in records or \
                            any(key.startswith(b"GNU.sparse.") for key in records):
                        raise self._error("a global PAX header sets path, size or sparse "
                                          "records (not supported)", start)
                # 'K' (the next member's link target) means nothing for a regular file
                continue
            if pax is _NO_RECORDS:  # a PAX header of no record the reader acts on
                path = pax = None
            elif pax is not None:
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
            if typeflag in no_payload or (typeflag == AREGTYPE and header[:100].split(
                    b"\x00", 1)[0].endswith(b"/")):  # the last: an old-style directory
                self._pos = pos + BLOCK
                continue
            if typeflag == SPARSE:
                raise self._error("sparse member (not supported)", start)
            if size > most:
                raise self._claim_error(path or named or cstr(header[:100]), size, start)
            end = pos + BLOCK + size
            padded = end + (-size % BLOCK)
            if limit is not None and start + BLOCK + size > limit:
                raise self._error(f"member of {size} bytes runs past the {limit} bytes "
                                  f"recorded for the shard", start)
            regular = typeflag in regular_types
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
                        name = cstr(header[345:500]) + b"/" + name
                text = name.decode("utf-8", "surrogateescape")
                if target is not None and TARGET_READ <= size <= MAX_READ:
                    if self._region is not None and self._stream is not None:
                        region = self._region(self._base + pos + BLOCK)
                    into = self._target(text, size, region)
            if padded > len(data):
                if pending:  # the gather reads: the members parsed so far first
                    yield pending[:]
                    pending.clear()
                self._member = text if regular else None
                payload = self._gather(pos + BLOCK, size, padded - pos - BLOCK, into, region)
                self._member = None
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
                last_size = size
                add((text, payload))
                if one:
                    yield pending[:]
                    pending.clear()
            # else: an unknown type, skipped with its payload

    def _claim_error(self, name: bytes, size: int, start: int) -> LimitError:
        text = name.decode("utf-8", "surrogateescape")
        return LimitError(f"{self.url}: member {text!r} at byte {start} claims {size:,} bytes, "
                          f"more than a sample may hold ({self._member_limit:,} bytes, the "
                          "limit sample_bytes of wdstream.Limits)")

    def _extended(self, pos: int, start: int, size: int, typeflag: int) -> bytes:
        """The payload of an extended header at ``_data[pos:]``, within its cap."""
        cap = PAX_MAX if typeflag in (120, 88, 103) else LONG_NAME_MAX
        if size > cap:
            raise self._error(f"extended header of {size} bytes (more than {cap})", start)
        if self._limit is not None and start + BLOCK + size > self._limit:
            raise self._error(f"member of {size} bytes runs past the {self._limit} bytes "
                              f"recorded for the shard", start)
        end = pos + BLOCK + size
        padded = end + padding(size)
        if padded <= len(self._data):
            self._pos = padded
            return self._data[pos + BLOCK : end]
        payload = self._gather(pos + BLOCK, size, padded - pos - BLOCK)
        if payload is None:
            raise self._error(f"truncated member ({size} bytes expected)", start)
        return payload

_NO_RECORDS = MappingProxyType({})
_MEANINGFUL = (b"path", b"size")  # with GNU.sparse.*: the PAX keys the reader acts on


def _ignored_record(size: int, record: bytes, pax: dict[bytes, bytes]) -> bytes | None:
    """``b"<length> <key>="`` when the PAX ``record`` of ``size`` bytes is a single record of
    a key the reader ignores, else None. A later payload of the same size that starts with
    this prefix and ends with a newline is one record of that key: it parses to nothing the
    reader acts on."""
    if len(pax) == 1:
        key = next(iter(pax))
        prefix = b"%d %s=" % (size, key)
        if key not in _MEANINGFUL and not key.startswith(b"GNU.sparse.") \
                and record.startswith(prefix):
            return prefix
    return None


def iter_members(stream: BinaryIO, url: str, payload_target=None, *, limit: int | None = None,
                 on_head=None, member_limit: int | None = None) -> TarMembers:
    """Iterate ``(name, payload)`` over the regular files of a tar read from ``stream``.

    ``stream`` needs only ``read(n)``. Raises ShardError naming ``url`` and the byte offset on a
    bad checksum or a stream that ends inside a member. The returned iterator's ``offset`` is the
    number of bytes consumed, ``complete`` whether the end-of-archive marker was seen.

    Payloads are ``bytes``. ``payload_target(name, size, region)`` is asked about each regular
    file's payload from 32 KiB to 64 MiB, with ``region`` the ``(path, offset, file size,
    st_dev, st_ino)`` of the payload when ``stream`` is a local file (else None). When it
    returns ``(payload, memory)``, the payload is read into ``memory`` (a writable memoryview
    of that size) and ``payload`` yielded instead; ``(payload, None)``: the payload is left in
    the file, unread (the reader seeks past it), and ``payload`` yielded.

    ``limit``: the stream's length when known (a manifest's byte count): a member that runs past
    it, or a byte beyond it, is a ShardError (``ShardMismatchError`` for the byte), so a stream
    that goes on is never read further. ``on_head(first)`` is called with the first
    ``HEAD_BYTES`` bytes (fewer if the stream is shorter) before any member is parsed.
    ``member_limit``: the most bytes a member may claim (``Limits.sample_bytes``): a member
    claiming more is a ``LimitError`` before its payload is read.
    """
    return TarMembers(stream, url, payload_target, limit=limit, on_head=on_head,
                      member_limit=member_limit)
