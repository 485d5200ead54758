"""Batches of records as the input readers hand them over, and where each record came from
(``data.jsonl:17``, ``x.parquet row 5``, ``photos/a.{jpg,json}``) so that errors can name it.
Line and row numbers count from 1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from wdstream.sizes import format_size

STDIN = "-"
MAX_RECORD = 256 << 20  # the largest record accepted (bytes), unless max_size is smaller


class FolderSample(NamedTuple):
    """Files of a folder that share a key: ``a.jpg`` + ``a.json`` -> key ``a``."""

    key: str  # the relative path up to the first dot of the basename, "/"-separated
    # (extension, path, size, identity), sorted by extension; identity: a local file's
    # (device, inode) as listed, None for an object
    files: tuple[tuple[str, str, int, tuple[int, int] | None], ...]


class Batch(NamedTuple):
    """Consecutive records of one input, and where each came from.

    ``values`` holds ``bytes`` for JSON lines (stripped, not parsed), ``dict`` for Parquet and
    CSV/TSV rows (column -> value), or ``FolderSample``. Readers hand over batches rather than
    single records so that the per-record work in the reading process stays small.
    """

    source: str  # the input as the user named it; "<stdin>" for "-"
    unit: str  # "line", "row" or "file"
    numbers: Sequence[int]  # line or row number of each value, from 1 (0 for folder samples)
    values: list
    # JSON lines of a plain local file: the byte offset of each value's line, and one more
    # (where the next line starts), so that another process can read values[a:b] again
    # from the file (read_lines) rather than be sent their bytes
    offsets: Sequence[int] | None = None
    identity: tuple[int, int] | None = None  # that file's (device, inode), checked then

    def where(self, i: int) -> str:
        """``data.jsonl:17`` (a line), ``x.parquet row 5``, ``photos/a.{jpg,json}``."""
        value = self.values[i]
        if isinstance(value, FolderSample):
            exts = [file[0] for file in value.files]
            names = exts[0] if len(exts) == 1 else "{" + ",".join(exts) + "}"
            return f"{self.source.rstrip('/')}/{value.key}.{names}"
        if self.unit == "line":
            return f"{self.source}:{self.numbers[i]}"
        return f"{self.source} {self.unit} {self.numbers[i]}"



class ReadCounter:
    """Bytes of the inputs read so far (as stored: compressed bytes for .gz/.zst) and their
    total from the listing, for progress."""

    def __init__(self, total: int = 0):
        self.total = total
        self.read = 0



def limit_text(max_record: int) -> str:
    """``256 MiB``, ``1.0 MB``: the record limit as the user would write it."""
    return f"{max_record >> 20} MiB" if max_record % (1 << 20) == 0 else format_size(max_record)


def source_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path

