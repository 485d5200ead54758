"""The unit index of JSON Lines files: their units (line-aligned byte ranges and row counts)
and identities, written once by ``wdstream index SOURCE --output URL`` anywhere the user
chooses (a local file, another bucket), so that building a dataset reads no JSON Lines file.

Its names are only ever matched against the files found under the source: an index names
nothing to read, and one that does not describe those files as they are now is an error.
Its counts are claims: each unit is bounded when the index is read (``indexed_units``), and
checked as it is read (``jsonl.JsonRows``: a unit holding more or fewer rows than counted is
an error); the node's shared units are named by the digest of its bytes, so a corrected
index is used.
"""

from __future__ import annotations

import hashlib
import json

from wdstream.errors import ManifestError
from wdstream.limits import json_loads
from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import MAX_UNIT_ROWS, FileUnits, Unit
from wdstream.tables.jsonl import ARRAY, compression

FORMAT = "wdstream-units"
MAX_INDEX_BYTES = 256 * 1024**2


def index_document(files: list[RawFile], file_units: list[FileUnits]) -> dict:
    entries = [{"name": f.name, "size": f.size, "tag": f.tag,
                "units": [[u.part, u.end, u.rows] for u in cut.units],
                **({"array": True} if cut.metadata == ARRAY else {})}
               for f, cut in zip(files, file_units, strict=True)]
    return {"format": FORMAT, "version": 1,
            "rows": sum(u.rows for cut in file_units for u in cut.units), "files": entries}


def write_index(url: str, files: list[RawFile], file_units: list[FileUnits]) -> None:
    from wdstream.sources.objects import write_bytes

    write_bytes(url, json.dumps(index_document(files, file_units), separators=(",", ":")).encode())


def read_index(url: str) -> tuple[dict, str]:
    """The index at ``url``, its size bounded by ``MAX_INDEX_BYTES`` before it is read,
    and the digest of its bytes (what names the units cut from it)."""
    from wdstream.sources.objects import read_bytes, size

    found = size(url)
    if found is not None and found > MAX_INDEX_BYTES:
        raise ManifestError(f"{printable(url)}: {found} bytes, more than the "
                            f"{MAX_INDEX_BYTES} an index may have")
    data = read_bytes(url)
    try:
        document = json_loads(data)
    except ValueError as exc:
        raise ManifestError(f"{printable(url)}: not a JSON document ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or \
            not isinstance(document.get("files"), list):
        raise ManifestError(f"{printable(url)}: not a wdstream unit index (format {FORMAT!r})")
    return document, hashlib.sha256(data).hexdigest()


def indexed_units(url: str, document: dict, files: list[RawFile], most: int
                  ) -> list[FileUnits]:
    """The units of ``files`` (JSON Lines files found under the source) from the index,
    which must describe exactly those files with their current sizes and tags, in units a
    reader may take: a plain file's of at most ``most`` bytes and at most a row for each 3
    of them (``{}`` and a newline, or a comma), a compressed file's one unit, the whole file.
    ``"array": true`` marks a JSON array's entry."""
    entries = {}
    for entry in document["files"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name in entries:
            raise ManifestError(f"{printable(url)}: a file entry without a name, or named twice")
        entries[name] = entry
    found = {f.name for f in files}
    missing = sorted(found - set(entries))
    if missing:
        raise ManifestError(f"{printable(url)}: does not list {printable(missing[0])} (and "
                            f"{len(missing) - 1} more found); run `wdstream index` again")
    gone = sorted(set(entries) - found)
    if gone:
        raise ManifestError(f"{printable(url)}: lists {printable(gone[0])}, not found under the "
                            f"source ({len(gone)} such)")
    return [_file_units(url, entries[f.name], f, most) for f in files]


def _file_units(url: str, entry: dict, file: RawFile, most: int) -> FileUnits:
    if (entry.get("size"), entry.get("tag")) != (file.size, file.tag):
        raise ManifestError(f"{printable(file.url)}: changed since the index {printable(url)} "
                            "was written; run `wdstream index` again")
    units, first, at = [], 0, 0
    whole = compression(file.name) is not None  # one unit: it cannot be entered midway
    listed = entry.get("units")
    items = listed if isinstance(listed, list) else [None]
    if whole and len(items) != 1:
        raise ManifestError(f"{printable(url)}: {printable(file.name)}: a compressed file is "
                            f"one unit, not {len(items)}")
    for item in items:
        if not (isinstance(item, list) and len(item) == 3
                and all(type(v) is int for v in item)):
            raise ManifestError(f"{printable(url)}: {printable(file.name)}: a unit is not "
                                "[start, end, rows]")
        start, end, rows = item
        if not (at <= start < end <= file.size and 0 < rows <= MAX_UNIT_ROWS) or \
                (whole and (start, end) != (0, file.size)):
            raise ManifestError(f"{printable(url)}: {printable(file.name)}: unit {item} does "
                                f"not fit in its {file.size} bytes after byte {at}")
        if not whole and (end - start > most or 3 * rows > end - start + 1):
            raise ManifestError(f"{printable(url)}: {printable(file.name)}: unit {item}: "
                                f"{rows} rows in {end - start} bytes (at most {most:,} bytes "
                                "a unit, the limit unit_bytes of wdstream.Limits, and a row "
                                "for each 3 bytes)")
        units.append(Unit(start, rows, first, end))
        first, at = first + rows, end
    return FileUnits(units, ARRAY if entry.get("array") is True else b"")
