"""What goes from the reading process to the shard writers: samples made from a batch of
records, the pieces of a shard, and whole shard jobs (with their names); generated sample keys,
a record's index among all records of all inputs, zero-padded (``0000000042``), unique across
the dataset and the same in every part."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from wdstream.write.record_batches import Batch

KEY_DIGITS = 10  # generated keys: the global record index, zero-padded so that keys sort
generated_key = f"{{:0{KEY_DIGITS}d}}".format  # index -> key; str.format: no Python frame


class GeneratedKeys:
    """The keys of records ``start`` to ``stop - 1``, as a sequence that makes each string only
    when it is used: in the process that writes the shard, not in the one that reads input."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[str]:
        return map(generated_key, range(self.start, self.stop))

    def __getitem__(self, item):
        if isinstance(item, slice):
            start, stop, _ = item.indices(len(self))
            return GeneratedKeys(self.start + start, self.start + stop)
        return generated_key(self.start + range(len(self))[item])

    def same_length(self) -> bool:
        """Whether every key has KEY_DIGITS characters (records before the 10-billionth)."""
        return self.stop <= 10**KEY_DIGITS

    def __getstate__(self):
        return (self.start, self.stop)

    def __setstate__(self, state):
        self.start, self.stop = state


Keys = list[str] | GeneratedKeys


class FileMember(NamedTuple):
    """A member whose bytes are read from a file by the process that writes the shard."""

    path: str
    size: int
    identity: tuple[int, int] | None = None  # a local file's (device, inode) as listed


class SampleBatch(NamedTuple):
    """Samples made from one input Batch, column by column (cheap to slice and to pickle)."""

    keys: Keys
    exts: tuple[str, ...]  # member extensions, sorted; the same for every sample of the batch
    columns: tuple[list, ...]  # per extension, the data of each sample: bytes or FileMember
    sizes: list[int] | None  # the exact bytes each sample takes in a tar; None: not known yet
    unparsed_json: bool  # columns[0] holds JSON lines that are still to be parsed
    batch: Batch  # the records, for error messages
    tokenize: tuple[int, ...] = ()  # columns that hold texts still to be tokenized


class ShardPiece(NamedTuple):
    """A run of consecutive samples of one SampleBatch, as sent to the shard writer."""

    keys: Keys
    exts: tuple[str, ...]
    columns: tuple[list, ...]
    json_lines_at: tuple[str, Sequence[int]] | None  # (source, line numbers) to parse first
    tokenize: tuple[int, ...] = ()  # columns of texts the writer tokenizes
    # JSON lines of a plain local file: (path, start, stop, identity), the bytes they are
    # read from again by a pool worker, which is sent the piece without its columns (see
    # by_reference), and the file's (device, inode) when they were read
    lines_at: tuple[str, int, int, tuple[int, int] | None] | None = None


class ShardJob(NamedTuple):
    name: str  # file name under the output prefix
    url: str
    pieces: list[ShardPiece]
    samples: int
    size: int | None  # the exact size of the tar; None: known once tokenized
    compress: tuple[str, int] | None = None  # (kind, level) of a compressed shard


def shard_name(name: str, index: int, suffix: str = ".tar") -> str:
    return f"{name}-{index:06d}{suffix}"


def part_manifest_name(part: tuple[int, int]) -> str:
    """``index.part-002-of-008.json``: the manifest a ``part=(2, 8)`` run writes."""
    return f"index.part-{part[0]:03d}-of-{part[1]:03d}.json"


def by_reference(job: ShardJob) -> ShardJob:
    """``job`` without the bytes of lines its writer can read from their file itself: a pool
    worker reading them from the page cache costs less than their pickling and piping."""
    if not any(piece.lines_at for piece in job.pieces):
        return job
    return job._replace(pieces=[piece._replace(columns=()) if piece.lines_at else piece
                                for piece in job.pieces])
