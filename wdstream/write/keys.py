"""Generated sample keys: a record's index among all records of all inputs, zero-padded
(``0000000042``), unique across the dataset and the same in every part."""

from __future__ import annotations

from collections.abc import Iterator

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
