"""``pack``'s options checked before anything is read or written: the layout (``--field``,
``--tokenize``, ``--key``), the shard limits, names, workers, parts and upload method."""

from __future__ import annotations

from wdstream import options
from wdstream.errors import InputError, OptionError, OptionTypeError
from wdstream.shards.samples import check_extension
from wdstream.shards.tar_writer import END_SIZE

DEFAULT_MAX_SIZE = 256 * 1000**2  # used when neither max_count nor max_size is given


def check_options(fields, key, max_count, max_size, name, workers, part, via, tokenize=None,
                  tokenizer=None):
    """InputError (or an option error) for the first option of ``pack`` that is wrong."""
    seen: dict[str, str] = {}  # extension -> "--field COLUMN=EXT"
    for option, members in (("--field", fields), ("--tokenize", tokenize)):
        if members is not None:
            _check_members(option, members, seen)
    if tokenize is not None and tokenizer is None:
        raise InputError("--tokenize needs --tokenizer PATH (a tokenizer.json)")
    if tokenizer is not None and tokenize is None:
        raise InputError("--tokenizer: name the text columns to tokenize with --tokenize "
                         "COLUMN=EXT, e.g. --tokenize text=tokens.npy")
    check_types(key, max_count, name, workers, part)
    _check_values(key, max_count, max_size, name, workers, part)
    if via not in options.CHOICES["via"]:
        raise OptionError(f"--via {via!r}: choose auto, cli or fsspec")


def _check_members(option: str, members: dict, seen: dict[str, str]) -> None:
    """``--field`` or ``--tokenize``'s COLUMN=EXT pairs; ``seen``: the members' extensions
    so far (lower case), each with the option that makes it."""
    if not members:
        raise InputError(f"{option}: give at least one COLUMN=EXT")
    for column, ext in members.items():
        _check_member(option, column, ext)
        given = f"{option} {column}={ext}"
        other = seen.setdefault(ext.lower(), given)
        if other != given:
            raise InputError(f"{other} and {given} both make a .{ext} member")


def _check_member(option: str, column, ext) -> None:
    if not isinstance(column, str) or not isinstance(ext, str):
        raise OptionTypeError(f"{option}: columns and extensions are strings, not "
                              f"{column!r:.40}: {ext!r:.40}")
    if not column or not ext or "/" in ext or ext.startswith(".") or ext.endswith("."):
        example = "tokens.npy" if option == "--tokenize" else "txt"
        raise InputError(f"{option} {column}={ext}: need COLUMN=EXT with an extension "
                         f"like {example}")
    check_extension(ext, f"{option} {column}={ext}")
    if option == "--tokenize" and ext.split(".")[-1].lower() != "npy":
        raise InputError(f"--tokenize {column}={ext}: token ids are stored as .npy; "
                         f"name the member like tokens.npy")


def _check_values(key, max_count, max_size, name, workers, part) -> None:
    """The options' values, once their types are known to be right."""
    if key is not None and not key:
        raise InputError("--key: give a column name")
    if max_count is not None and max_count < 1:
        raise InputError(f"--max-count must be at least 1, got {max_count}")
    if max_size is not None and max_size < 2 * 512 + END_SIZE:
        raise InputError(f"--max-size {max_size} is smaller than the smallest tar with one member")
    if not name or "/" in name or name.startswith(".") \
            or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InputError(f"--name {name!r}: need a file name prefix without '/' or control "
                         "characters")
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    if part is not None and (part[1] < 1 or not 0 <= part[0] < part[1]):
        raise InputError(f"--part {part[0]}/{part[1]}: need 0 <= I < N")


def check_types(key, max_count, name, workers, part) -> None:
    """The Python API's arguments of the wrong type, as the options' errors (not a
    TypeError from a comparison deep in the run)."""
    options.integer("pack", "max_count", max_count, allow_none=True)
    options.integer("pack", "workers", workers)
    if key is not None and not isinstance(key, str):
        raise OptionTypeError(f"pack: key must be a column name, not {key!r:.80}")
    if not isinstance(name, str):
        raise OptionTypeError(f"pack: name must be a string, not {name!r:.80}")
    if part is not None and (not isinstance(part, tuple | list) or len(part) != 2):
        raise OptionTypeError(f"pack: part must be (index, count), not {part!r:.80}")
    if part is not None:
        for value in part:
            options.integer("pack", "part", value)

