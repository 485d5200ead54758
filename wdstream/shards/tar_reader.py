"""The shard format's streaming tar reader: ``iter_members``, the members of a tar stream.

It parses 512-byte headers itself from a ``TarBuffer`` (``tar_buffer``: large reads, payloads
sliced out of them), several times faster than ``tarfile`` in streaming mode on small members:
one general parser, every header checked by the rules of ``tar_header``, and one fast path,
runs of small members read as one array of blocks (``tar_blocks``). It reads what GNU tar,
``tarfile`` and webdataset write: ustar, GNU longname/longlink, PAX extended headers; what it
cannot read as POSIX and GNU define it (sparse members, a global header that names files, two
long names for one member, an extended header with no member after it) is a ShardError, never
a payload under another member's name. Extended records are capped (``LONG_NAME_MAX``,
``PAX_MAX``), and so is what is read after the end-of-archive marker; a member whose header
claims more than ``member_limit`` bytes is a ``LimitError`` before any of it is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain
from types import MappingProxyType
from typing import BinaryIO, TypeGuard, cast

from wdstream.errors import LimitError
from wdstream.shards.tar_blocks import SCAN_SIZE_MAX, scan_members
from wdstream.shards.tar_buffer import MAX_READ, TARGET_READ, TarBuffer
from wdstream.shards.tar_header import (
    AREGTYPE,
    BLOCK,
    EXTENDED,
    MAGIC_AT,
    NAME_END,
    NO_PAYLOAD,
    PREFIX_AT,
    REGULAR,
    SPARSE,
    TYPEFLAG_AT,
    checksum_ok,
    cstr,
    header_name,
    header_size,
    parse_pax,
)
from wdstream.sources.hashing import HEAD_BYTES  # what ``on_head`` is given

_ZERO_BLOCK = bytes(BLOCK)
LONG_NAME_MAX = 1 << 16  # a GNU long name or link: far above any file system's PATH_MAX
PAX_MAX = 1 << 20  # a PAX extended header: names, times and a few attributes
_PAX_TYPES = frozenset(b"xXg")  # PAX headers: per file ('x', Solaris 'X') and global ('g')


class TarMembers(TarBuffer):
    """Iterator over the regular-file members of a tar stream, as ``(name, payload)`` pairs.

    ``offset`` is the number of bytes consumed from the stream so far. After the end-of-archive
    marker the rest of the stream is read (GNU tar pads to 10 KiB records) up to ``limit`` or
    ``DRAIN_MAX`` bytes, so once iteration is exhausted ``offset`` is the stream's total length
    and ``complete`` says whether the marker was seen (False: the stream ended cleanly at a
    member boundary without it).

    One general parser reads every header (``_members``); runs of small members are read by
    the block scan (``_Runs``, ``tar_blocks``) when members are parsed a list at a time.
    """

    def __init__(self, stream: BinaryIO, url: str, payload_target=None, *,
                 limit: int | None = None, on_head=None, member_limit: int | None = None):
        super().__init__(stream, url, limit)
        self._on_head = on_head
        self._member_limit = member_limit
        self._most = member_limit or 1 << 62  # bytes a member may claim
        self._member: str | None = None  # the member whose payload is being read, if any
        # payload_target(name, size, region) -> (payload, memory) or None: where payloads of
        # TARGET_READ to MAX_READ bytes go (see iter_members)
        self._target = payload_target
        self._long_name: bytes | None = None  # from a GNU 'L' entry, for the next member
        self._pax: Mapping[bytes, bytes] | None = None  # from a PAX 'x' header, for the next member
        self._runs = _Runs(None if payload_target is None else TARGET_READ)
        self._tails: dict[int, tuple[bytes, int]] = {}  # checksum_ok's memo
        self._ignored: dict[int, bytes] = {}  # PAX records of one ignored key, by length
        self.complete = False
        self._gen: Iterator[tuple[str, bytes]] | None = None

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

    def _parse(self, one: bool) -> Iterator[list[tuple[str, bytes]]]:
        pending: list[tuple[str, bytes]] = []  # parsed, not yet handed over
        try:
            yield from self._members(pending, one)
        except Exception as error:
            # a decompressed stream's limit (only a LimitError says in_stream): say where
            if isinstance(error, LimitError) and error.in_stream:
                where = f"member {self._member!r}" if self._member is not None \
                    else f"the header at byte {self.offset}"
                error.args = (f"{error.args[0]}, reading {where}",)
                error.in_stream = False
            if pending:  # the members before the error first; it is raised when asked again
                yield _handed(pending)
            raise
        if pending:
            yield pending

    def _members(self, pending: list, one: bool) -> Iterator[list[tuple[str, bytes]]]:
        """Parses members into ``pending``; hands its members over (``_handed``) before each
        read of the stream, so that nothing is read before the members already parsed are
        used, and (``one``) after each member."""
        runs = None if one else self._runs
        self._give_head()
        while True:
            if len(self._data) - self._pos < BLOCK:
                if pending:
                    yield _handed(pending)
                if not self._fill(BLOCK):
                    self._check_end()
                    return
            if self._run_ahead(runs):
                self._pos, members = runs.take(self._data, self._pos)
                if members:
                    pending += members
                    continue
            header = self._header()
            if header is None:  # the end-of-archive marker
                if pending:
                    yield _handed(pending)
                self._drain()
                return
            block, start, size = header
            if block[TYPEFLAG_AT] in EXTENDED:
                if pending and self._reads_stream(size):
                    yield _handed(pending)
                self._read_extended(block[TYPEFLAG_AT], size, start)
                continue
            entry = self._entry(block, start, size)
            if entry is None:  # an entry without payload, passed
                continue
            if pending and self._reads_stream(entry[1]):
                yield _handed(pending)
            payload = self._payload(*entry)
            if entry[0] is not None:  # else an unknown type, skipped with its payload
                self._runs.last_size = entry[1]
                pending.append((entry[0], payload))
                if one:
                    yield _handed(pending)

    def _run_ahead(self, runs: _Runs | None) -> TypeGuard[_Runs]:
        """Whether the block scan is to be tried at ``_pos`` (lists only, no extended header
        pending)."""
        return runs is not None and self._long_name is None and self._pax is None \
            and runs.ready(self._data, self._pos)

    def _give_head(self) -> None:
        """``on_head`` with the shard's first bytes, before any member is parsed."""
        if self._on_head is not None:
            limit = self._limit
            self._fill(HEAD_BYTES if limit is None else min(HEAD_BYTES, limit))
            self._on_head(self._data[:HEAD_BYTES])

    def _check_end(self) -> None:
        """At the stream's end without the end-of-archive marker: a clean end at a member
        boundary, or an error."""
        if self._pos != len(self._data):
            raise self._error("truncated header", self.offset)
        if self._long_name is not None or self._pax is not None:
            raise self._error("stream ends after an extended header", self.offset)

    def _header(self) -> tuple[bytes, int, int] | None:
        """The header at ``_pos`` checked (``tar_header``): ``(header, its stream offset, its
        size field)``; None for the end-of-archive marker, which is then consumed."""
        pos = self._pos
        header = self._data[pos : pos + BLOCK]
        start = self._base + pos
        if not header[0] and header == _ZERO_BLOCK:  # a member's name never starts with NUL
            if self._long_name is not None or self._pax is not None:
                raise self._error("end-of-archive marker after an extended header", start)
            self._pos = pos + BLOCK
            self.complete = True
            return None
        if not checksum_ok(header, self._tails):
            raise self._error("bad header checksum", start)
        size = header_size(header)
        if size < 0:
            raise self._error("bad size field", start)
        return header, start, size

    def _reads_stream(self, size: int) -> bool:
        """Whether the entry at ``_pos`` with a payload of ``size`` bytes runs past the buffer."""
        return self._pos + BLOCK + size + (-size % BLOCK) > len(self._data)

    def _entry(self, block: bytes, start: int, size: int):
        """The member whose header ``block`` is at ``_pos``, with the extended headers read
        before it applied: ``(name or None for a type skipped with its payload, size, stream
        offset, payload target's answer, region)``; None for an entry without a payload,
        whose header is then consumed."""
        typeflag = block[TYPEFLAG_AT]
        path = named = None
        if self._pax is not None or self._long_name is not None:
            path, named, size = self._take_extended(size, start)
        if typeflag in NO_PAYLOAD or (typeflag == AREGTYPE and cstr(block[:NAME_END])
                                       .endswith(b"/")):  # the last: an old-style directory
            self._pos += BLOCK
            return None
        if typeflag == SPARSE:
            raise self._error("sparse member (not supported)", start)
        if size > self._most:
            raise self._claim_error(path or named or cstr(block[:NAME_END]), size, start)
        self._check_inside(size, start)
        if typeflag not in REGULAR:
            return None, size, start, None, None
        if typeflag == 48 and not block[PREFIX_AT]:  # what the block scan looks for
            self._runs.magic = block[MAGIC_AT : MAGIC_AT + 7]
        name = path if path is not None else named if named is not None else \
            self._header_name(block, start)
        if not size and name.endswith(b"/"):  # a directory entry another way
            self._pos += BLOCK
            return None
        return self._offer(name.decode("utf-8", "surrogateescape"), size, start)

    def _header_name(self, block: bytes, start: int) -> bytes:
        try:
            return header_name(block)
        except ValueError as error:
            raise self._error(str(error), start) from None

    def _offer(self, text: str, size: int, start: int):
        """``_entry``'s answer for a regular member, its payload offered to the payload
        target when it is of a size the target takes."""
        into = region = None  # (payload, memory) from the payload target; see _skip
        if self._target is not None and TARGET_READ <= size <= MAX_READ:
            if self._region is not None and self._stream is not None:
                region = self._region(self._base + self._pos + BLOCK)
            into = self._target(text, size, region)
        return text, size, start, into, region

    def _take_extended(self, size: int, start: int) -> tuple[bytes | None, bytes | None, int]:
        """``(PAX path, GNU long name, size)`` for the member at ``start``, whose size field
        says ``size``; the extended headers describe the next member only, whatever it is."""
        pax, named = self._pax, self._long_name
        self._pax = self._long_name = None
        if pax is None:
            return None, named, size
        if b"size" in pax:
            value = pax[b"size"]
            if not value.isdigit():
                raise self._error("bad PAX size record", start)
            size = int(value)
        path = pax.get(b"path")
        return (None if path is None else path.rstrip(b"/")), named, size  # as tarfile does

    def _read_extended(self, typeflag: int, size: int, start: int) -> None:
        """Read the extended header at ``_pos``, for the next member."""
        cap = PAX_MAX if typeflag in _PAX_TYPES else LONG_NAME_MAX
        if size > cap:
            raise self._error(f"extended header of {size} bytes (more than {cap})", start)
        self._check_inside(size, start)
        record = self._payload(None, size, start, None, None)
        if typeflag == 76:  # 'L': the next member's name
            self._long_name_record(record, start)
        elif typeflag == 103:  # 'g': global PAX header
            self._global_pax(record, start)
        elif typeflag != 75:  # 'x' (and Solaris 'X'): PAX, per file
            self._pax_record(record, start, typeflag == 120)
        # 'K' (the next member's link target) means nothing for a regular file

    def _long_name_record(self, record: bytes, start: int) -> None:
        if self._long_name is not None:
            raise self._error("two GNU long names for one member", start)
        if self._pax is not None and b"path" in self._pax:
            raise self._error("a GNU long name and a PAX path for one member", start)
        if 0 not in record:  # GNU tar counts the NUL; tarfile would read on
            raise self._error("GNU long name without its NUL", start)
        self._long_name = cstr(record)

    def _pax_record(self, record: bytes, start: int, per_file: bool) -> None:
        if self._pax is not None:
            raise self._error("two PAX headers for one member", start)
        prefix = self._ignored.get(len(record))
        if prefix is not None and record.startswith(prefix) and record[-1] == 10:
            self._pax = _NO_RECORDS  # one record like an earlier one, of a key ignored here
            return
        pax = self._pax = self._records(record, start)
        if b"path" in pax and self._long_name is not None:
            raise self._error("a GNU long name and a PAX path for one member", start)
        if b"GNU.sparse." in record and any(key.startswith(b"GNU.sparse.") for key in pax):
            raise self._error("sparse member (not supported)", start)
        if per_file and len(self._ignored) < _IGNORED_MAX:
            self._note_ignored(record, pax)

    def _note_ignored(self, record: bytes, pax: dict[bytes, bytes]) -> None:
        """Remember ``record`` (b"<length> <key>=") when it is one record of a key the reader
        ignores, spelled as usual (its length without leading zeros): a later record of that
        length that starts so and ends with a newline is one record of that key too (what
        ``parse_pax`` would read), which the block scan (``_Runs``) reads as well."""
        if len(pax) != 1:
            return
        key = next(iter(pax))
        prefix = b"%d %s=" % (len(record), key)
        if key not in _MEANINGFUL and not key.startswith(b"GNU.sparse.") \
                and record.startswith(prefix):
            self._ignored[len(record)] = prefix
            self._runs.pax_keys.add(key)

    def _global_pax(self, record: bytes, start: int) -> None:
        records = self._records(record, start)
        if b"path" in records or b"size" in records or \
                any(key.startswith(b"GNU.sparse.") for key in records):
            raise self._error("a global PAX header sets path, size or sparse records (not "
                              "supported)", start)

    def _records(self, record: bytes, start: int) -> dict[bytes, bytes]:
        try:
            return parse_pax(record)
        except ValueError as exc:
            raise self._error(str(exc), start) from None

    def _check_inside(self, size: int, start: int) -> None:
        """A ShardError for an entry at ``start`` whose payload runs past the shard's
        recorded length."""
        limit = self._limit
        if limit is not None and start + BLOCK + size > limit:
            raise self._error(f"member of {size} bytes runs past the {limit} bytes recorded "
                              f"for the shard", start)

    def _payload(self, text: str | None, size: int, start: int, into, region):
        """The payload of the entry at ``_pos`` (its header's), consumed with its padding:
        sliced from the buffer, or gathered from the stream (``TarBuffer._gather``); into
        the payload target's memory when it took it (``into``)."""
        pos = self._pos
        end = pos + BLOCK + size
        padded = end + (-size % BLOCK)
        data = self._data
        if padded > len(data):
            self._member = text
            payload = self._gather(pos + BLOCK, size, padded - pos - BLOCK, into, region)
            self._member = None
            if payload is None:
                raise self._error(f"truncated member ({size} bytes expected)", start)
            return payload
        self._pos = padded
        if into is None:
            return data[pos + BLOCK : end]
        payload, memory = into
        if memory is not None:
            memory[:] = memoryview(data)[pos + BLOCK : end]
        return payload

    def _claim_error(self, name: bytes, size: int, start: int) -> LimitError:
        text = name.decode("utf-8", "surrogateescape")
        return LimitError(f"{self.url}: member {text!r} at byte {start} claims {size:,} bytes, "
                          f"more than a sample may hold ({self._member_limit:,} bytes, the "
                          "limit sample_bytes of wdstream.Limits)")


def _handed(pending: list) -> list:
    """The members of ``pending`` as a list of their own, ``pending`` emptied."""
    batch = pending[:]
    pending.clear()
    return batch


_MEANINGFUL = (b"path", b"size")  # with GNU.sparse.*: the PAX keys the reader acts on
_IGNORED_MAX = 16  # lengths of PAX records of an ignored key remembered
_NO_RECORDS: Mapping[bytes, bytes] = MappingProxyType({})  # a PAX header of no record the reader acts on


class _Runs:
    """The fast path: runs of small members read by the block scan (``tar_blocks``), with
    what the general parser has learnt of the shard's usual headers: the magic of a regular
    member's header without prefix, and the keys of PAX headers of one record that means
    nothing to the reader (``mtime``...). It is tried after members up to ``SCAN_SIZE_MAX``
    bytes, once per position of a buffer (past where it stopped last, or in the next)."""

    def __init__(self, size_below: int | None):
        self._size_below = size_below  # payloads from this size on go to the payload target
        self.magic: bytes | None = None
        self.pax_keys: set[bytes] = set()
        self.last_size = 0  # of the last member the general parser read
        self._scanned: bytes | None = None  # the buffer scanned last
        self._scan_at = 0  # where the scan is tried next in that buffer

    def ready(self, data: bytes, pos: int) -> bool:
        return self.magic is not None and self.last_size <= SCAN_SIZE_MAX and (
            data is not self._scanned or pos >= self._scan_at)

    def take(self, data: bytes, pos: int) -> tuple[int, list[tuple[str, bytes]]]:
        """``(position after them, members)`` of the run at ``data[pos:]`` (none: the general
        parser reads what is there)."""
        magic = cast(bytes, self.magic)  # ready() said it is known
        found = scan_members(data, pos, magic, self.pax_keys, size_below=self._size_below)
        self._scanned = data
        if found is None:  # too few headers left in this buffer
            self._scan_at = len(data)
            return pos, []
        members, pos = found
        self._scan_at = pos + 1
        return pos, members


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
