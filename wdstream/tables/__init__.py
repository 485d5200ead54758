"""Raw files streamed where they lie: Parquet, JSON Lines and Arrow IPC files cut into units
of known row counts (``units.UnitTable``), which the epoch plan treats as shards.

- ``files``: finding a source's files (folders at any depth, patterns, lists) and their
  identity (size and ETag, generation or modification time).
- ``reads``: byte ranges through ``wdstream.sources.openers.open_read``; the check that a
  file is still the one planned.
- ``formats``: what a format gives (``TableFormat``: a file's units, a unit's rows);
  ``parquet``: row groups from the footer, read as their column chunks; ``jsonl``:
  line-aligned ranges, or whole compressed files; ``arrow``: runs of record batches.
- ``index``: the unit index of JSON Lines files that ``wdstream index --output`` writes.
- ``units``: the unit table, cut from many files' metadata at once.
"""
