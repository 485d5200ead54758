"""The pages of a Parquet column chunk as their headers declare them: each page's
uncompressed size is what decoding it allocates, whatever the footer says of the chunk, so a
reader refuses a page or a row too large from these sizes, never from the decoded values
(``parquet.py`` when streaming; ``wdstream pack`` sizes its batches from them too).

A page header is a Thrift struct in the compact protocol (parquet-format's ``PageHeader``):
field 2 is the uncompressed size, 3 the compressed size, and the data page headers (5 and 8)
start with the number of values; v2's (8) also holds the number of rows (field 3).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

_HEADER_READ = 1 << 16  # bytes read for a page header, more only if it is longer
_HEADER_MAX = 16 << 20  # the longest page header read (its statistics included)
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = \
    range(13)
_DATA_PAGES = (5, 8)  # the fields of DataPageHeader and DataPageHeaderV2
_DICTIONARY_PAGE = 7  # the field of DictionaryPageHeader
_DATA_KINDS = (0, 3)  # PageType DATA_PAGE, DATA_PAGE_V2
_DICTIONARY_KIND = 2  # PageType DICTIONARY_PAGE
DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY: indices into the dictionary
_DELTA_BYTE_ARRAY = 7  # each value a prefix of the one before and a suffix
_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
_VALUE_OVERHEAD = 8  # decoded bytes a value takes besides its own: offsets, levels
_LENGTH = struct.Struct("<I")  # a PLAIN byte array's length


class Page(NamedTuple):
    """One page: whether it holds data (not a dictionary or an index), its uncompressed
    size, the values (levels) it holds (a dictionary page: its entries), its rows (v2 pages;
    None for others), its values' encoding, whether it is a dictionary, and where its
    (compressed) bytes lie after its header."""

    data: bool
    size: int
    values: int
    rows: int | None
    encoding: int = 0
    dictionary: bool = False
    start: int = 0
    compressed: int = 0


class BadHeader(ValueError):
    """A page header that cannot be read (cut short, malformed, or longer than allowed)."""


class _Reader:
    """The compact protocol over ``data`` from ``pos``."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise BadHeader("cut short")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise BadHeader("a varint longer than 10 bytes")

    def integer(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)  # zigzag

    def skip_bytes(self, count: int) -> None:
        if count < 0 or self.pos + count > len(self.data):
            raise BadHeader("cut short")
        self.pos += count

    def fields(self):
        """``(field id, type)`` of each field of the struct being read, until its end."""
        last = 0
        while (head := self.byte()) & 0x0F != _STOP:
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.integer()
            yield last, kind

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 32:
            raise BadHeader("nested too deeply")
        if kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _BYTE:
            self.skip_bytes(1)
        elif kind == _DOUBLE:
            self.skip_bytes(8)
        elif kind == _BINARY:
            self.skip_bytes(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            count = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(count):
                self.skip(head & 0x0F if head & 0x0F not in (_TRUE, _FALSE) else _BYTE,
                          depth + 1)
        elif kind == _MAP:
            count = self.varint()
            types = self.byte() if count else 0
            for _ in range(count):
                self.skip(types >> 4, depth + 1)
                self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            for _, inner in self.fields():
                self.skip(inner, depth + 1)
        elif kind not in (_TRUE, _FALSE):
            raise BadHeader(f"unknown type {kind}")


def parse_header(data: bytes) -> tuple[Page, int, int]:
    """``(page, compressed size, header length)`` of the header at the start of ``data``."""
    reader = _Reader(data)
    kind = size = compressed = values = encoding = 0
    rows = None
    for field, field_kind in reader.fields():
        if field == 1 and field_kind == _I32:
            kind = reader.integer()
        elif field == 2 and field_kind == _I32:
            size = reader.integer()
        elif field == 3 and field_kind == _I32:
            compressed = reader.integer()
        elif field in (*_DATA_PAGES, _DICTIONARY_PAGE) and field_kind == _STRUCT:
            values, rows, encoding = _data_header(reader, v2=field == 8)
        else:
            reader.skip(field_kind)
    if size < 0 or compressed < 0 or values < 0 or (rows is not None and rows < 0):
        raise BadHeader("a negative size or count")
    return Page(kind in _DATA_KINDS, size, values, rows, encoding, kind == _DICTIONARY_KIND,
                0, compressed), compressed, reader.pos


def _data_header(reader: _Reader, v2: bool) -> tuple[int, int | None, int]:
    """``(values, rows, encoding)`` of a data (or dictionary) page's header (rows: v2's,
    None for others)."""
    values, rows, encoding = 0, None, 0
    for field, kind in reader.fields():
        if field == 1 and kind == _I32:
            values = reader.integer()
        elif v2 and field == 3 and kind == _I32:
            rows = reader.integer()
        elif field == (4 if v2 else 2) and kind == _I32:
            encoding = reader.integer()
        else:
            reader.skip(kind, 1)
    return values, rows, encoding


def chunk_pages(file, start: int, length: int) -> list[Page]:
    """The pages of the column chunk stored in ``file`` (seekable, binary) at
    ``[start, start + length)``; BadHeader if a header cannot be read there."""
    pages = []
    position, end = start, start + length
    while position < end:
        want = _HEADER_READ
        while True:
            file.seek(position)
            data = file.read(min(want, end - position))
            try:
                page, compressed, header = parse_header(data)
                break
            except BadHeader:
                if len(data) < min(want, end - position) or want >= _HEADER_MAX \
                        or want >= end - position:
                    raise
                want *= 4
        pages.append(page._replace(start=position + header))
        position += header + compressed
    return pages


def decoded_pages(file, pages: list[Page], column, type_length: int, budget: int
                  ) -> list[Page]:
    """``pages`` of ``column`` (a ColumnChunkMetaData) with each size what the page takes
    decoded at most: indices into a dictionary (which a few bytes of run lengths repeat
    millions of times) as values x the largest entry, fixed widths as values x width, and
    the offsets and levels of each value. The largest entry of a dictionary of byte arrays
    is taken as the dictionary's size, or read from it (decompressed: its size is bounded
    by the caller's check of page sizes) when that bound comes to more than ``budget``."""
    physical = column.physical_type
    width = type_length if physical == "FIXED_LEN_BYTE_ARRAY" else _WIDTHS.get(physical)
    dictionary = next((page for page in pages if page.dictionary), None)
    largest = dictionary.size if dictionary is not None else 0
    sized = [page._replace(size=_decoded(page, width, largest)) for page in pages]
    if width is None and dictionary is not None and sum(p.size for p in sized) > budget:
        largest = largest_entry(file, dictionary, column.compression)
        sized = [page._replace(size=_decoded(page, width, largest)) for page in pages]
    return sized


def _decoded(page: Page, width: int | None, largest: int) -> int:
    if not page.data:
        return page.size
    values = page.values
    if page.encoding in DICTIONARY_ENCODINGS:
        each = width if width is not None else largest
        return values * (each + _VALUE_OVERHEAD)
    if width is not None:
        return max(page.size, values * width) + values * _VALUE_OVERHEAD
    if page.encoding == _DELTA_BYTE_ARRAY:  # a value is at most the page's suffixes
        return values * (page.size + _VALUE_OVERHEAD)
    return page.size + values * _VALUE_OVERHEAD


def largest_entry(file, page: Page, codec: str) -> int:
    """The longest entry of a dictionary page of byte arrays (PLAIN: each a 4-byte length
    and its bytes); the page's size where its bytes cannot be decompressed or walked (no
    entry is longer)."""
    import pyarrow as pa

    file.seek(page.start)
    stored = file.read(page.compressed)
    try:
        data = stored if codec == "UNCOMPRESSED" else pa.Codec(codec.lower()).decompress(
            stored, decompressed_size=page.size)
    except (ValueError, OSError, NotImplementedError, TypeError):
        return page.size
    at, largest, end = 0, 0, len(data) - 4
    unpack = _LENGTH.unpack_from
    for _ in range(page.values):
        if at > end:
            return page.size
        (length,) = unpack(data, at)
        at += 4 + length
        if length > largest:
            largest = length
    return largest if at <= len(data) else page.size


def chunk_start(column) -> int:
    """Where a column chunk's first page starts (its dictionary's, if it has one)."""
    offsets = [column.data_page_offset]
    if column.has_dictionary_page and column.dictionary_page_offset:
        offsets.append(column.dictionary_page_offset)
    return min(offsets)
