"""Writing one shard, in this process or a pool worker: its tar built in memory piece by
piece, compressed if asked, hashed and sent to storage in chunks."""

from __future__ import annotations

import hashlib
import io

from wdstream.errors import InputError
from wdstream.shards.compact import ShardInfo
from wdstream.shards.compression.writing import ShardCompressor
from wdstream.shards.identity import HEAD_BYTES, head_digest
from wdstream.shards.tar_writer import TarWriter
from wdstream.sources.objects import open_write
from wdstream.write.jobs import FileMember, ShardJob
from wdstream.write.json_records import check_json_lines
from wdstream.write.jsonl_inputs import read_lines
from wdstream.write.remote import read_member
from wdstream.write.token_members import tokenize_columns
from wdstream.write.tokenizer import Tokenizer

_FLUSH_SIZE = 4 << 20  # bytes buffered before hashing and writing a chunk of a shard


class _ShardSink:
    """The file object TarWriter writes to: an in-memory buffer (``write`` is the buffer's own
    C method, called three times per member) that ``flush`` compresses (if asked), hashes and
    sends on in chunks. ``size`` and ``sha256`` are the stored bytes', ``tar_size`` the tar's."""

    def __init__(self, out, compress: tuple[str, int] | None = None):
        self._out = out
        self._buffer = io.BytesIO()
        self.write = self._buffer.write
        self.sha256 = hashlib.sha256()
        self.size = self.tar_size = 0
        self.first = b""  # the tar's first HEAD_BYTES (before compression), for ``head``
        self._compressor = ShardCompressor(*compress) if compress else None
        # A writer that keeps what it is given (an S3 upload) takes larger chunks: its part
        # then goes out as the buffer's own bytes, not a join of small chunks.
        self.chunk_size = max(_FLUSH_SIZE, getattr(out, "chunk_size", 0))

    def flush(self, at_least: int = 1) -> None:
        if self._buffer.tell() >= at_least:
            chunk = self._buffer.getvalue()
            self._buffer = io.BytesIO()
            self.write = self._buffer.write
            if self.tar_size < HEAD_BYTES:
                self.first += chunk[: HEAD_BYTES - self.tar_size]
            self.tar_size += len(chunk)
            if self._compressor is not None:
                chunk = self._compressor.compress(chunk)
            self._store(chunk)

    def finish(self) -> None:
        self.flush()
        if self._compressor is not None:
            self._store(self._compressor.flush())

    def _store(self, chunk: bytes) -> None:
        if chunk:
            self.sha256.update(chunk)
            self.size += len(chunk)
            self._out.write(chunk)


def _file_bytes(member: FileMember) -> bytes:
    return read_member(*member)  # local path or URL; size (and a file's identity) checked


def write_shard(job: ShardJob, via: str, encoder: Tokenizer | None = None) -> ShardInfo:
    """Write one shard and return its manifest entry (URL relative to the output prefix).

    Pieces with texts still to tokenize (``pack(max_count=...)`` without ``max_size``) are
    tokenized here, with ``encoder``."""
    out = open_write(job.url, via=via)
    try:
        sink = _write_tar(job, out, encoder)
        out.commit(sink.sha256.digest())  # S3 checks the upload against it
    except BaseException:  # also an interrupt during the commit: nothing may appear
        out.abort()
        raise
    last = job.pieces[-1][0] if job.pieces else ()
    return ShardInfo(job.name, job.samples, sink.size, sink.sha256.hexdigest(),
                     head_digest(sink.first), last[len(last) - 1] if len(last) else None)


def _write_tar(job: ShardJob, out, encoder: Tokenizer | None) -> _ShardSink:
    """The shard's tar, written to ``out``; returns the sink with its size and digest."""
    sink = _ShardSink(out, job.compress)
    tar = TarWriter(sink)
    add = tar.add
    for keys, exts, columns, json_lines_at, tokenize, lines_at in job.pieces:
        if not columns and lines_at is not None:  # sent by reference (by_reference)
            columns = (read_lines(*lines_at, len(keys)),)
        if json_lines_at is not None:
            check_json_lines(columns[0], *json_lines_at)
        if tokenize:
            if encoder is None:
                raise InputError(f"{job.url}: texts to tokenize, and no tokenizer")
            columns = tokenize_columns(columns, tokenize, encoder)
        if len(exts) == 1 and not isinstance(columns[0][0], FileMember):  # the common case
            suffix = "." + exts[0]
            for key, data in zip(keys, columns[0], strict=True):
                add(key + suffix, data)
        else:
            for i, key in enumerate(keys):
                for ext, column in zip(exts, columns, strict=True):
                    data = column[i]
                    add(f"{key}.{ext}", _file_bytes(data) if isinstance(data, FileMember) else data)
                sink.flush(sink.chunk_size)
        sink.flush(sink.chunk_size)
    tar.close()
    sink.finish()
    if job.size is not None and sink.tar_size != job.size:  # boundaries rely on exact sizes
        raise AssertionError(f"{job.url}: wrote {sink.tar_size} bytes, expected {job.size}")
    return sink

