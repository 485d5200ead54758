"""The exact tar bytes every sample takes, known before anything is written, so that shard
boundaries do not depend on who writes the shards."""

from __future__ import annotations

import operator

from wdstream.shards.tar_writer import member_size
from wdstream.write.jobs import KEY_DIGITS, FileMember, GeneratedKeys, Keys

_header_sizes: dict[int, int] = {}


def _header_size(name_bytes: int) -> int:
    """Tar bytes of a member before its payload, for a name of that length without "/".

    Keys never contain "/" (check_key) and neither do extensions, so the header cost depends
    on the name's length only, and the payload costs its length padded to 512.
    """
    size = _header_sizes.get(name_bytes)
    if size is None:
        size = _header_sizes[name_bytes] = member_size("k" * name_bytes, 0)
    return size


def sample_sizes(keys: Keys, exts: tuple[str, ...],
                 columns: tuple[list, ...]) -> list[int] | None:
    """The exact tar bytes of each sample: per member, header plus payload padded to 512;
    None without members."""
    uniform = isinstance(keys, GeneratedKeys) and keys.same_length()
    key_bytes = None if uniform else [len(key.encode("utf-8")) for key in keys]
    sizes = None
    for ext, column in zip(exts, columns, strict=True):
        extra = len(ext.encode("utf-8")) + 1
        if isinstance(column[0], FileMember):
            lengths = [member.size for member in column]
        else:
            lengths = list(map(len, column))
        if key_bytes is None:  # the common case, kept to one cheap pass
            header = _header_size(KEY_DIGITS + extra)
            member = [header + n + (-n % 512) for n in lengths]
        else:
            member = [
                _header_size(k + extra) + n + (-n % 512)
                for k, n in zip(key_bytes, lengths, strict=True)
            ]
        sizes = member if sizes is None else list(map(operator.add, sizes, member))
    return sizes

