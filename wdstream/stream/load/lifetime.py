"""Iterators left open when the interpreter exits are closed while it still can: an ``atexit``
hook closes them before module teardown, so their clean-up (closing shard streams, unmapping
shared memory) runs normally rather than against module globals already set to None."""

from __future__ import annotations

import atexit
import weakref


class _OpenIterators:
    """The registry of one process. Iterators are held weakly: one dropped half-way is
    finalized by the garbage collector as usual and leaves the registry by itself."""

    def __init__(self):
        self.iterators: weakref.WeakSet = weakref.WeakSet()
        self.hooked = False

    def add(self, iterator):
        if not self.hooked:
            atexit.register(self.close_all)
            self.hooked = True
        self.iterators.add(iterator)
        return iterator

    def close_all(self) -> None:
        for iterator in list(self.iterators):
            try:
                iterator.close()
            except Exception:  # exiting: a failed clean-up has nowhere to go
                pass
        self.iterators.clear()


# The interpreter's exit is process-wide, and so is what must be closed before it.
_open = _OpenIterators()


def closed_at_exit(iterator):
    """Return ``iterator`` (a generator), registered to be closed before the interpreter
    tears its modules down."""
    return _open.add(iterator)
