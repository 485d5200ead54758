"""The layouts of the shard lines ``Manifest.to_json`` writes (see ``wdstream.shards.scan``),
and the columns the two scanners fill from them."""

from __future__ import annotations

from typing import cast

import numpy as np

INT = "int"  # a gap holding ': DIGITS, '
NAME, KEY = "name", "key"
MAX_DIGITS = 18  # below 2**63: larger counts take the general parser (which refuses them)
POW10 = 10 ** np.arange(MAX_DIGITS, dtype=np.int64)


class LineLayout:
    """One line layout: literal runs (bytes) and the values between them (``NAME``, ``INT``,
    ``KEY``, or a number of hex digits)."""

    def __init__(self, sha: bool, head: bool, key: bool):
        self.sha, self.head, self.key = sha, head, key
        pieces: list[bytes | str | int] = [b'{"url": "', NAME, b'", "samples": ', INT,
                                           b', "bytes": ', INT]
        tail = b', "sha256": '  # the literal text after the last value
        if sha:
            pieces += [tail + b'"', 64]
            tail = b'"'
        else:
            tail += b"null"
        if head:
            pieces += [tail + b', "head": "', 32]
            tail = b'"'
        if key:
            pieces += [tail + b', "last_key": "', KEY]
            tail = b'"'
        pieces.append(tail + b"}")
        self.pieces = pieces
        self.quotes = sum(p.count(b'"') for p in pieces if isinstance(p, bytes))
        # a value ends where the run after it has its first quote: (which quote of the line,
        # how many bytes before it)
        self.value_ends: dict[int, tuple[int, int]] = {}
        seen = 0
        for i, piece in enumerate(pieces):
            if isinstance(piece, bytes):
                seen += piece.count(b'"')
            else:
                after = cast(bytes, pieces[i + 1])  # literal text follows every value
                self.value_ends[i] = (seen, after.index(b'"'))


def layouts_by_quotes() -> dict[int, list[LineLayout]]:
    """The eight layouts, by the number of quotes in their literal text (most first)."""
    layouts: dict[int, list[LineLayout]] = {}
    for sha in (True, False):
        for head in (True, False):
            for key in (True, False):
                layout = LineLayout(sha, head, key)
                layouts.setdefault(layout.quotes, []).append(layout)
    return dict(sorted(layouts.items(), reverse=True))


class Columns:
    """The arrays being filled, one row per shard (a missing key: length 0)."""

    def __init__(self, count: int):
        self.samples = np.zeros(count, dtype=np.int64)
        self.bytes = np.zeros(count, dtype=np.int64)
        self.sha256 = np.zeros((count, 32), dtype=np.uint8)
        self.has_sha256 = np.zeros(count, dtype=bool)
        self.heads = np.zeros((count, 16), dtype=np.uint8)
        self.has_head = np.zeros(count, dtype=bool)
        self.has_key = np.zeros(count, dtype=bool)
        self.name_len = np.zeros(count, dtype=np.int64)
        self.key_len = np.zeros(count, dtype=np.int64)

    def result(self, names: np.ndarray, keys: np.ndarray) -> dict[str, np.ndarray]:
        """The scanners' columns, with the names and keys joined by newlines."""
        return {"names": names, "keys": keys, "samples": self.samples, "bytes": self.bytes,
                "sha256": self.sha256, "has_sha256": self.has_sha256, "heads": self.heads,
                "has_head": self.has_head, "has_key": self.has_key}
