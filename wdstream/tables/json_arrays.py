"""The elements of a JSON array of objects (``[{...}, {...}]``, what ``datasets``'
``to_json(lines=False)`` and pandas' ``orient="records"`` write), found without parsing the
document: ``ArrayScanner`` follows strings, escapes and nesting through reads of any size
and gives each element's byte range. Regular expressions do the byte-level work: one
matches a comma and the whole object after it (nested at most ``RUN_DEPTH`` levels, whole in
the read); others jump between the brackets of the rest (a Python step per bracket and per
string cut by a read, none per byte). Its memory is the read at hand; ``elements`` also
holds the element being read.

Everything is checked as it is scanned: an element that is not an object, a missing comma,
a string or an element never closed, an element longer than the row limit or nested deeper
than ``MAX_ROW_DEPTH``, bytes after the closing ``]`` are ShardErrors naming the file, the
element (its row number) and the byte."""

from __future__ import annotations

import re
from collections.abc import Iterator

from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import invalid

READ_BYTES = 1024**2
BOM = b"\xef\xbb\xbf"
# inside an element, outside strings: as far as the next bracket, over whole strings
_INSIDE = re.compile(rb'(?s)(?:[^"\[\]{}]++|"(?:[^"\\]++|\\.)*+")*+')
# inside a string: as far as its closing quote, or a backslash ending the read
_STRING = re.compile(rb'(?s)(?:[^"\\]++|\\.)*+')
_BLANK = re.compile(rb"[ \t\r\n]*+")
RUN_DEPTH = 5  # how deep an element ``_RUN`` matches whole may nest


def _object_pattern(levels: int) -> bytes:
    """A regular expression of an object nested at most ``levels`` deep, strings whole."""
    string = rb'"(?:[^"\\]++|\\.)*+"'
    inner = rb'(?:[^"\[\]{}]++|' + string + rb')*+'
    for _ in range(levels - 1):
        inner = rb'(?:[^"\[\]{}]++|' + string + rb'|\[' + inner + rb'\]|\{' + inner + rb'\})*+'
    return rb"\{" + inner + rb"\}"


# a comma and the whole element after it: one C call an element
_RUN = re.compile(rb"(?s)[ \t\r\n]*+,[ \t\r\n]*+(" + _object_pattern(RUN_DEPTH) + rb")")
_OPENER = {0x5D: 0x5B, 0x7D: 0x7B}  # "]": "[", "}": "{"

# where the scan is: before the "[", before an element (the first, or one after a comma),
# inside one (outside its strings, in a string, after a backslash ending a read), after an
# element, after the "]"
BEFORE, FIRST, NEXT, INSIDE, STRING, ESCAPE, AFTER, CLOSED = range(8)


class ArrayScanner:
    """Finds the elements of a JSON array in the reads ``feed`` is given, in order, from
    byte ``offset``: ``whole``, the file from its start (a BOM, blanks, ``[``, elements,
    ``]``, blanks); else a range of whole elements (a plain file's unit: elements and the
    commas between them). Elements longer than ``longest`` bytes, or nested deeper than
    ``depth`` levels, are errors."""

    def __init__(self, file: RawFile, offset: int, longest: int, depth: int,
                 whole: bool = True):
        self.file, self.longest, self.most_depth = file, longest, depth
        self.state = BEFORE if whole else NEXT
        self.whole = whole
        self.base = offset  # the file's byte at the next read's start
        self.start = 0  # the element being read: its first byte
        self.open = bytearray()  # and the brackets open in it, the innermost last
        self.count = 0  # elements found so far

    def feed(self, data: bytes) -> list[tuple[int, int]]:
        """The ``(start, end)`` file offsets of the elements that end in ``data``."""
        found: list[tuple[int, int]] = []
        pos, size = 0, len(data)
        if self.state == BEFORE and self.base == 0 and data.startswith(BOM):
            pos = len(BOM)
        while pos < size:
            if self.state in (INSIDE, STRING, ESCAPE):
                pos = self._inside(data, pos, found)
            else:
                if self.state == AFTER and self.most_depth >= RUN_DEPTH:
                    pos = self._run(data, pos, found)
                pos = _BLANK.match(data, pos).end()  # type: ignore[union-attr]  # matches "" at least
                if pos < size:
                    self._between(data[pos], pos)
                    pos += 1
        if self.state in (INSIDE, STRING, ESCAPE):
            self._check_length(self.base + size)
        self.base += size
        return found

    def _run(self, data: bytes, pos: int, found: list[tuple[int, int]]) -> int:
        """After an element: the next ones while one regular expression matches each with
        the comma before it (whole in ``data``, within ``RUN_DEPTH`` levels and the row
        limit); the others, and whatever is wrong, are left to the byte-level states."""
        base, match, longest = self.base, _RUN.match, self.longest
        while (found_next := match(data, pos)) is not None:
            start, end = found_next.span(1)
            if end - start > longest:
                break
            found.append((base + start, base + end))
            self.count += 1
            pos = end
        return pos

    def _inside(self, data: bytes, pos: int, found: list[tuple[int, int]]) -> int:
        """From ``pos`` inside an element, as far as the read, or the element, ends."""
        size = len(data)
        while pos < size:
            if self.state == ESCAPE:
                self.state, pos = STRING, pos + 1
                continue
            if self.state == STRING:
                pos = _STRING.match(data, pos).end()  # type: ignore[union-attr]  # matches "" at least
                if pos == size:
                    return pos
                self.state = INSIDE if data[pos] == 0x22 else ESCAPE  # '"', or a last "\"
                pos += 1
                continue
            pos = _INSIDE.match(data, pos).end()  # type: ignore[union-attr]  # matches "" at least
            if pos == size:
                return pos
            byte = data[pos]
            pos += 1
            if byte == 0x22:  # a string going on past this read
                self.state = STRING
            elif byte in b"[{":
                self.open.append(byte)
                if len(self.open) > self.most_depth:
                    raise self._error(f"nests deeper than {self.most_depth} levels")
            elif (opened := self.open.pop()) != _OPENER[byte]:
                raise self._error(f"has a {chr(opened)!r} closed by {chr(byte)!r} at byte "
                                  f"{self.base + pos - 1}")
            elif not self.open:
                end = self.base + pos
                self._check_length(end)
                found.append((self.start, end))
                self.count += 1
                self.state = AFTER
                return pos
        return pos

    def _between(self, byte: int, pos: int) -> None:
        """The first non-blank byte at ``pos`` outside an element."""
        at = self.base + pos
        state = self.state
        if state == BEFORE and byte == 0x5B:  # "["
            self.state = FIRST
        elif state in (FIRST, NEXT) and byte == 0x7B:  # "{"
            self.state, self.start, self.open = INSIDE, at, bytearray(b"{")
        elif state == FIRST and byte == 0x5D:  # "]": an empty array
            self.state = CLOSED
        elif state == AFTER and byte == 0x2C:  # ","
            self.state = NEXT
        elif state == AFTER and byte == 0x5D and self.whole:
            self.state = CLOSED
        elif state in (FIRST, NEXT) and byte in b'"-0123456789[tfn':
            raise invalid(f"{self._where(at)} is not a JSON object")
        else:
            expected = {BEFORE: "'['", FIRST: "an object or ']'", NEXT: "an object",
                        AFTER: "',' or ']'" if self.whole else "','",
                        CLOSED: "nothing after the array's ']'"}[state]
            raise invalid(f"{printable(self.file.url)}: byte {at}: {chr(byte)!r} where "
                          f"{expected} was expected (after {self.count} elements of a JSON "
                          "array)")

    def finish(self) -> None:
        """At the end of the data: an error unless the array (or the range) ended there."""
        if self.state == (CLOSED if self.whole else AFTER):
            return
        if self.state in (INSIDE, STRING, ESCAPE):
            what = "a string in it never closed" if self.state != INSIDE else \
                f"{len(self.open)} of its brackets never closed"
            raise invalid(f"{self._where(self.start)} does not end: {what} (the data ends "
                          f"at byte {self.base})")
        raise invalid(f"{printable(self.file.url)}: the data ends at byte {self.base} after "
                      f"{self.count} elements, before the JSON array's closing ']'"
                      if self.whole else f"{printable(self.file.url)}: bytes ending at "
                      f"{self.base} end after a ',' (after {self.count} elements)")

    def _check_length(self, end: int) -> None:
        if end - self.start > self.longest:
            raise invalid(f"{self._where(self.start)} is longer than {self.longest} bytes "
                          "(the longest read: 256 MiB, or the limit sample_bytes of "
                          "wdstream.Limits)")

    def _where(self, at: int) -> str:
        return f"{printable(self.file.url)}: element {self.count} of the JSON array (byte {at})"

    def _error(self, what: str):
        return invalid(f"{self._where(self.start)} {what}")


def elements(body, scanner: ArrayScanner) -> Iterator[tuple[int, bytes]]:
    """``(offset, element)`` for each element ``scanner`` finds in ``body``'s bytes; only
    the element being read is held past a read."""
    pending: list[bytes] = []  # the start of an element going on past the reads so far
    while chunk := body.read(READ_BYTES):
        base = scanner.base
        spans = scanner.feed(chunk)
        for start, end in spans:
            if pending:
                yield start, b"".join(pending) + chunk[:end - base]
                pending = []
            else:
                yield start, chunk[start - base:end - base]
        if scanner.state in (INSIDE, STRING, ESCAPE):
            if pending:
                pending.append(chunk)
            else:
                pending = [chunk[max(scanner.start - base, 0):]]
    scanner.finish()
