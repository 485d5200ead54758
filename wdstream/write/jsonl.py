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

from wdstream.errors import InputError
from wdstream.write.input_streams import close_binary, open_binary, read_errors
from wdstream.write.local_files import identity_of, open_regular
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
        stream = open_binary(path, counter)
    except OSError as error:
        raise InputError(f"{source}: cannot read: {error.strerror or error}") from None
    number = 0  # lines handed over so far, blank ones included
    pieces: list[bytes] = []  # an incomplete last line, completed by later chunks
    pending = 0  # bytes in pieces
    at_start = True
    check_each = max_record < _CHUNK  # else no line within one chunk can be too long
    name = path.lower()
    track = path != STDIN and not is_remote(path) and not name.endswith((".gz", ".zst"))
    line_start = 0  # byte offset in the file of the first line not yet handed over
    identity = identity_of(stream) if track else None  # the file read again by offsets
    # From a pipe, take what has arrived rather than wait for a full chunk: records that come
    # slowly still make progress (and shards) as they come.
    read = stream.read1 if path == STDIN else stream.read
    try:
        while True:
            chunk = read(_CHUNK)
            if at_start and chunk:
                if pending + len(chunk) < len(codecs.BOM_UTF8):
                    pieces.append(chunk)
                    pending += len(chunk)
                    continue
                at_start = False
                if pieces:
                    chunk, pieces, pending = b"".join(pieces) + chunk, [], 0
                if chunk.startswith(codecs.BOM_UTF8):
                    chunk = chunk[len(codecs.BOM_UTF8):]
                    line_start = len(codecs.BOM_UTF8)
                    if not chunk:
                        continue
            if not chunk:
                lines = [b"".join(pieces)] if pending else []
                pieces, pending = [], 0
            elif pieces:
                first = chunk.find(b"\n")
                if first < 0:
                    pieces.append(chunk)
                    pending += len(chunk)
                    if pending > max_record:
                        raise too_long(source, number + 1, max_record)
                    continue
                head = b"".join(pieces) + chunk[:first]
                if len(head) > max_record:
                    raise too_long(source, number + 1, max_record)
                lines = chunk[first + 1:].split(b"\n")
                lines[0:0] = [head]
                tail = lines.pop()
                pieces, pending = ([tail], len(tail)) if tail else ([], 0)
            else:
                lines = chunk.split(b"\n")
                tail = lines.pop()
                pieces, pending = ([tail], len(tail)) if tail else ([], 0)
                if pending > max_record:
                    raise too_long(source, number + len(lines) + 1, max_record)
            if check_each and lines:
                for i, line in enumerate(lines):
                    if len(line) > max_record:
                        raise too_long(source, number + i + 1, max_record)
            if lines:
                first = number + 1
                number += len(lines)
                offsets = None
                if track:  # starts of the lines, and where the next one starts
                    offsets = list(itertools.accumulate(map(_ONE.__add__, map(len, lines)),
                                                        initial=line_start))
                    line_start = offsets[-1]
                stripped = list(map(bytes.strip, lines))
                if all(stripped):
                    yield Batch(source, "line", range(first, number + 1), stripped, offsets,
                                identity)
                else:
                    kept = [i for i, line in enumerate(stripped) if line]
                    if kept:
                        yield Batch(source, "line", [first + i for i in kept],
                                    [stripped[i] for i in kept],
                                    None if offsets is None else
                                    [offsets[i] for i in kept] + [offsets[-1]], identity)
            if not chunk:
                return
    except read_errors() as error:
        raise InputError(f"{source}: cannot read after line {number}: {error}") from None
    finally:
        if path != STDIN:
            close_binary(stream)


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

