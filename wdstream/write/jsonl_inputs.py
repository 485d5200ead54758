"""JSON Lines inputs: non-blank lines handed on as their bytes, unparsed. In the default layout
they are packed byte for byte and parsed (to reject malformed JSON) by the process that writes
their shard, which keeps the reading process light so that ``--workers`` scales.

Reading takes time linear in the input and memory bounded by the longest record accepted
(``MAX_RECORD``) plus a constant."""

from __future__ import annotations

import codecs
import io
import itertools
from collections.abc import Iterator
from typing import cast

from wdstream.errors import InputError
from wdstream.write.input_bodies import close_binary, open_binary, read_errors
from wdstream.write.local_inputs import identity_of, open_regular
from wdstream.write.record_batches import (
    MAX_RECORD,
    STDIN,
    Batch,
    ReadCounter,
    limit_text,
    source_name,
)
from wdstream.write.remote import is_remote

_CHUNK = 4 << 20  # bytes of JSON Lines split at a time
_ONE = 1  # _ONE.__add__: a line's length plus its newline, without a Python frame


def too_long(source: str, number: int, max_record: int) -> InputError:
    return InputError(f"{source}:{number}: longer than {limit_text(max_record)}, the longest "
                      "record pack accepts")


def read_jsonl(path: str, max_record: int = MAX_RECORD,
               counter: ReadCounter | None = None) -> Iterator[Batch]:
    """Non-blank lines as stripped bytes, read in large chunks (a leading byte order mark is
    dropped).

    A line longer than a chunk is kept as a list of pieces and joined once, when its end
    comes, so reading takes time linear in the input whatever its lines' lengths; a line
    longer than ``max_record`` is refused as soon as that much of it is read.
    """
    source = source_name(path)
    counter = counter if counter is not None else ReadCounter()
    try:
        body = open_binary(path, counter)
    except OSError as error:
        raise InputError(f"{source}: cannot read: {error.strerror or error}") from None
    track = path != STDIN and not is_remote(path) and not path.lower().endswith((".gz", ".zst"))
    # the file read again by offsets: its identity
    lines = _LineSplitter(source, max_record, identity_of(body) if track else None, track)
    # From a pipe, take what has arrived rather than wait for a full chunk: records that come
    # slowly still make progress (and shards) as they come.
    # (stdin's buffer is a BufferedReader; typeshed calls it a BinaryIO, without read1)
    read = cast(io.BufferedReader, body).read1 if path == STDIN else body.read
    try:
        first, lines.line_start = _first_chunk(read)
        rest = iter(lambda: read(_CHUNK), b"")
        for chunk in itertools.chain((first,) if first else (), rest, (b"",)):
            yield from lines.split(chunk)
    except read_errors() as error:
        raise InputError(f"{source}: cannot read after line {lines.number}: {error}") from None
    finally:
        if path != STDIN:
            close_binary(body)


def _first_chunk(read) -> tuple[bytes, int]:
    """The body's first chunk, long enough to tell a byte order mark unless the body is
    shorter, without the mark; and the mark's length (0 if there is none)."""
    chunk = read(_CHUNK)
    while chunk and len(chunk) < len(codecs.BOM_UTF8):
        more = read(_CHUNK)
        if not more:
            break
        chunk += more
    if chunk.startswith(codecs.BOM_UTF8):
        return chunk[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
    return chunk, 0


class _LineSplitter:
    """Chunks of JSON Lines to batches of their non-blank lines, stripped; ``b""`` ends the
    input (its last line need not end in a newline)."""

    def __init__(self, source: str, max_record: int, identity: tuple[int, int] | None,
                 track: bool):
        self.source, self.max_record, self.identity = source, max_record, identity
        self.track = track  # hand over each line's byte offset (Batch.offsets)
        self.check_each = max_record < _CHUNK  # else no line within one chunk can be too long
        self.number = 0  # lines handed over so far, blank ones included
        self.pieces: list[bytes] = []  # an incomplete last line, completed by later chunks
        self.pending = 0  # bytes in pieces
        self.line_start = 0  # byte offset in the file of the first line not yet handed over

    def split(self, chunk: bytes) -> Iterator[Batch]:
        lines = self._lines(chunk)
        if lines:
            if self.check_each:
                for i, line in enumerate(lines):
                    if len(line) > self.max_record:
                        raise too_long(self.source, self.number + i + 1, self.max_record)
            yield from self._batches(lines)

    def _lines(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes; its incomplete last line is kept in ``pieces``."""
        if not chunk:
            lines = [b"".join(self.pieces)] if self.pending else []
            self.pieces, self.pending = [], 0
            return lines
        if not self.pieces:
            lines = chunk.split(b"\n")
            self._keep(lines.pop())
            if self.pending > self.max_record:
                raise too_long(self.source, self.number + len(lines) + 1, self.max_record)
            return lines
        first = chunk.find(b"\n")
        if first < 0:
            self.pieces.append(chunk)
            self.pending += len(chunk)
            if self.pending > self.max_record:
                raise too_long(self.source, self.number + 1, self.max_record)
            return []
        head = b"".join(self.pieces) + chunk[:first]
        if len(head) > self.max_record:
            raise too_long(self.source, self.number + 1, self.max_record)
        lines = chunk[first + 1:].split(b"\n")
        lines[0:0] = [head]
        self._keep(lines.pop())
        return lines

    def _keep(self, tail: bytes) -> None:
        self.pieces, self.pending = ([tail], len(tail)) if tail else ([], 0)

    def _batches(self, lines: list[bytes]) -> Iterator[Batch]:
        """The batch of ``lines`` (all complete), blank ones left out."""
        first = self.number + 1
        self.number += len(lines)
        offsets = None
        if self.track:  # starts of the lines, and where the next one starts
            offsets = list(itertools.accumulate(map(_ONE.__add__, map(len, lines)),
                                                initial=self.line_start))
            self.line_start = offsets[-1]
        stripped = list(map(bytes.strip, lines))
        if all(stripped):
            yield Batch(self.source, "line", range(first, self.number + 1), stripped, offsets,
                        self.identity)
            return
        kept = [i for i, line in enumerate(stripped) if line]
        if kept:
            yield Batch(self.source, "line", [first + i for i in kept],
                        [stripped[i] for i in kept],
                        None if offsets is None else [offsets[i] for i in kept] + [offsets[-1]],
                        self.identity)


def read_lines(path: str, start: int, stop: int, identity: tuple[int, int] | None,
               count: int) -> list[bytes]:
    """The ``count`` non-blank lines, stripped, between byte offsets ``start`` and ``stop`` of
    a plain local JSON Lines file, as ``read_jsonl`` handed them over (see Batch.offsets),
    from the same file (``identity``: its device and inode)."""
    try:
        with io.BufferedReader(open_regular(path, identity)) as file:  # reads until stop
            file.seek(start)
            data = file.read(stop - start)
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    lines = list(filter(None, map(bytes.strip, data.split(b"\n"))))
    if len(lines) != count:
        raise InputError(f"{path}: changed while packing (bytes {start}-{stop} no longer hold "
                         f"the {count} lines read there)")
    return lines

