"""WebDataset's sample rules: how member names split into key and extension, which keys are safe
to write, and grouping consecutive members into samples."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import chain, islice, repeat
from operator import eq, itemgetter

from wdstream.errors import InputError, LimitError, ShardError

# A key becomes part of a tar member name; keep key + "." + extension under the 255-byte file
# name limit of common file systems so that `tar x` of a shard works.
MAX_KEY_BYTES = 200


def split_name(name: str) -> tuple[str, str]:
    """``"a/b.c.json" -> ("a/b", "c.json")``: the key ends at the first dot of the basename.

    Same rule as webdataset's ``base_plus_ext``; the extension keeps its case here (webdataset
    lowercases it when grouping, and so does ``iter_samples``).
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot <= slash:  # no dot, or a basename that starts with one (webdataset skips those)
        raise ShardError(f"member {name!r} has no key.extension name")
    return name[:dot], name[dot + 1 :]


def check_key(key: str, where: str) -> None:
    """Raise InputError naming ``where`` if WebDataset readers would split or merge ``key``."""
    problem = None
    if not key or key.isspace():
        problem = "is empty or only whitespace"
    elif "." in key:
        problem = "contains '.', which WebDataset readers take as the start of the extension"
    elif "/" in key:
        problem = "contains '/'"
    elif any(ord(c) < 32 or ord(c) == 127 for c in key):
        problem = "contains a control character"
    elif not _is_unicode(key):
        problem = "is not valid Unicode (a lone surrogate, or a file name not in UTF-8)"
    elif len(key.encode("utf-8")) > MAX_KEY_BYTES:
        problem = f"is longer than {MAX_KEY_BYTES} bytes"
    if problem:
        raise InputError(f"{where}: key {key!r} {problem}")


def check_extension(ext: str, where: str) -> None:
    """Raise InputError naming ``where`` if a member extension would clash with a sample's
    own entries (``__key__``, ``__url__``: any name starting with ``__``), hold a control
    character or not be text a tar name can hold."""
    problem = None
    lowered = ext.lower()
    if not ext or ext.isspace():
        problem = "is empty or only whitespace"
    elif lowered in _RESERVED or lowered.startswith("__"):
        problem = ("is reserved: samples hold __key__, __url__ and other names starting with "
                   "'__' themselves")
    elif any(ord(c) < 32 or ord(c) == 127 for c in ext):
        problem = "contains a control character"
    elif not _is_unicode(ext):
        problem = "is not valid Unicode (a lone surrogate, or a file name not in UTF-8)"
    if problem:
        raise InputError(f"{where}: member name {ext!r} {problem}")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# webdataset's rules (webdataset.tariterators): members matching _META are skipped, and a name
# splits as _KEY_EXT does (the key ends at the first dot of the basename); others are skipped.
_META = re.compile(r"__[^/]*__($|/)")
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


class StrayCount:
    """Members that belong to no sample (names without ``key.ext``, hidden or ``__meta__``
    names, as webdataset skips them): how many, and the first few names."""

    SHOWN = 5

    def __init__(self):
        self.count = 0
        self.names: list[str] = []

    def add(self, name: str) -> None:
        self.count += 1
        if len(self.names) < self.SHOWN:
            self.names.append(name)

    def merge(self, other: StrayCount) -> None:
        """Add ``other``'s count and names to this one."""
        self.names.extend(other.names[: self.SHOWN - len(self.names)])
        self.count += other.count

    def count_and_names(self) -> str:
        """``"3 (README, .hidden, __meta__)"``."""
        more = ", ..." if self.count > len(self.names) else ""
        return f"{self.count} ({', '.join(self.names)}{more})"


def stray_split(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name as webdataset groups it, or None for a member
    webdataset skips."""
    if name.startswith("__") and ("/" not in name and name.endswith("__")
                                  or _META.match(name)):
        return None
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot > slash and "\n" not in name:  # the common case, where the rules agree
        return name[:dot], name[dot + 1 :]
    match = _KEY_EXT.match(name)
    return None if match is None else (match.group(1), match.group(2))


def iter_samples(members: Iterable[tuple[str, bytes]], url: str,
                 strays: StrayCount | None = None, sample_limit: int | None = None
                 ) -> Iterator[dict]:
    """Group consecutive members with the same key into WebDataset sample dicts.

    ``{"__key__": key, "__url__": url, ext: payload, ...}`` with extensions lowercased, as
    webdataset does. A key that comes back after another key starts a new sample; an extension
    repeated within a sample raises ShardError. Members webdataset skips (no ``key.ext``
    name, a hidden basename, ``__meta__`` names) are skipped and counted in ``strays``. A
    sample whose members hold more than ``sample_limit`` bytes together is a ``LimitError``
    (``Limits.sample_bytes``; the tar reader refuses a member that claims more on its own).
    """
    batches = members.batches() if hasattr(members, "batches") else ([m] for m in members)
    return chain.from_iterable(sample_batches(batches, url, strays, sample_limit))


def sample_batches(batches: Iterable[list[tuple[str, bytes]]], url: str,
                   strays: StrayCount | None = None, sample_limit: int | None = None
                   ) -> Iterator[list[dict]]:
    """``iter_samples`` over lists of members (``TarMembers.batches()``), as lists: the
    samples a list of members completes (a sample is complete when a member of another key,
    or the end, follows it). An error comes after the samples completed before it."""
    sample: dict | None = None
    key = None
    most = sample_limit or 1 << 62
    held = 0  # bytes of the open sample's members
    done: list[dict] = []
    add = done.append
    try:
        for batch in batches:
            alone = _one_member_samples(batch, key)
            if alone is not None:
                payloads = alone[2]  # each member a sample of its own: made a list at a time
                if sample is not None:
                    add(sample)
                done += [{"__key__": k, "__url__": url, ext: payload}
                         for k, ext, payload in zip(*alone, strict=True)]
                sample = done.pop()  # the last may have members in the next list
                key = sample["__key__"]
                held = len(payloads[-1])
                if done:
                    yield done[:]
                    done.clear()
                continue
            for name, payload in batch:
                # the usual case of stray_split inlined: this runs once per member
                slash = name.rfind("/") + 1
                dot = name.find(".", slash)
                if dot > slash and name[:1] != "_" and "\n" not in name:
                    member_key = name[:dot]
                    ext = name[dot + 1 :].lower()
                else:
                    split = stray_split(name)
                    if split is None:
                        if strays is not None:
                            strays.add(name)
                        continue
                    member_key, ext = split[0], split[1].lower()
                if member_key == key and sample is not None:  # (key: the sample's)
                    held = _add_member(sample, name, ext, payload, held, most)
                    continue
                if sample is not None:
                    add(sample)
                if ext in _RESERVED:
                    sample = None
                    raise ShardError(f"{url}: sample {member_key!r} has a reserved extension "
                                     f"{ext!r}")
                key = member_key
                held = len(payload)
                sample = {"__key__": key, "__url__": url, ext: payload}
            if done:
                yield done[:]
                done.clear()
    except Exception:
        if done:  # the samples before the error first; it is raised when asked again
            yield done[:]
            done.clear()
        raise
    if sample is not None:
        add(sample)
    if done:
        yield done


_RESERVED = frozenset(("__key__", "__url__"))


def _add_member(sample: dict, name: str, ext: str, payload, held: int, most: int) -> int:
    """Add a member to the open ``sample``, whose members hold ``held`` bytes; the bytes they
    hold then. ShardError for an extension it has, LimitError past ``most`` bytes."""
    if ext in sample:
        what = "a reserved" if ext in _RESERVED else "a duplicate"
        raise ShardError(f"{sample['__url__']}: sample {sample['__key__']!r} has {what} "
                         f"extension {ext!r}")
    held += len(payload)
    if held > most:
        raise LimitError(f"{sample['__url__']}: sample {sample['__key__']!r} holds more than "
                         f"{most:,} bytes with member {name!r} (the limit sample_bytes of "
                         "wdstream.Limits)")
    sample[ext] = payload
    return held


def _one_member_samples(batch: list[tuple[str, bytes]], key: str | None
                        ) -> tuple[list[str], list[str], list] | None:
    """``(keys, extensions, payloads)`` of a list of members that are each a sample of its
    own, their names of the usual shape (``key.ext``, no directory, nothing ``stray_split``
    would look at twice), their keys none like the one before it nor the first like ``key``
    (the open sample's): checked for the whole list at once, in C. None when any member is
    not so (the members are then grouped one by one)."""
    if len(batch) < 2:
        return None
    names, payloads = map(list, zip(*batch, strict=True))
    joined = "\n".join(names)
    if "/" in joined or joined.count("\n") != len(names) - 1 or joined[:1] in "._" \
            or "\n." in joined or "\n_" in joined:
        return None
    split = _one_extension(joined, names) or _extensions(names)
    if split is None:
        return None
    keys, exts = split
    if keys[0] == key or any(map(eq, keys, islice(keys, 1, None))) \
            or not _RESERVED.isdisjoint(exts):
        return None
    return keys, exts, payloads


def _one_extension(joined: str, names: list[str]) -> tuple[list[str], list[str]] | None:
    """``(keys, extensions)`` of names (``joined``: them joined by newlines, none holding
    one) that all have one dot, followed by the first name's extension: the keys in one
    split, one ``str`` for every extension; None when they are not all so."""
    ext = names[0][names[0].find(".") + 1 :]
    suffix = "." + ext
    count = len(names)
    # as many dots as names, and as many ending in the extension: each name's one dot
    if not ext or joined.count(".") != count or not joined.endswith(suffix) \
            or joined.count(suffix + "\n") != count - 1:
        return None
    keys = joined[: -len(suffix)].replace(suffix + "\n", "\n").split("\n")
    return keys, [ext.lower()] * count


def _extensions(names: list[str]) -> tuple[list[str], list[str]] | None:
    """``(keys, extensions)`` of names each split at its first dot; None when one has none."""
    parts = list(map(str.partition, names, repeat(".")))
    if "" in map(itemgetter(1), parts):  # a name without a dot
        return None
    exts = "\n".join(map(itemgetter(2), parts)).lower().split("\n")
    if len(exts) != len(parts):
        return None
    return list(map(itemgetter(0), parts)), exts
