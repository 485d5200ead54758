"""Many files cut into units by several processes: ``Cutters``, which cuts runs of files as they
come (the pages of a folder's listing), and ``cut_in_processes(files, access, cut)`` for
files known all at once.

Cutting a file costs about a millisecond of CPU in this process's threads (a presigned
GET of its footer, parsing it: docs/benchmarks-results.md), all under one interpreter lock.
A thread of this process cuts the first run with ``cut`` (``units.cut_files``:
``FILES_IN_FLIGHT`` files at once); whenever at least ``FILES_PER_PROCESS`` files wait for
a cutter, a child is started (up to ``most`` processes in all), and each cutter takes the
next run waiting. The units are those one process makes, whichever cutter made them.
``cut_in_processes`` cuts at least ``MIN_FILES`` files into one run per process.

A child is a fresh interpreter (``sys.executable -c``) importing the same wdstream, with
nothing of this process but its environment variables (credentials, endpoints): it imports
no script of the user's and inherits no threads or connections. It reads runs (the
``RawFile``s and the ``Access``) from stdin until it ends and writes back each run's units,
or the wdstream error a file gave (raised here as it is: a file that is not Parquet, a
footer too large, a missing object), pickled; what it prints to stderr is shown only if it
fails. A rank of a node with ``LOCAL_WORLD_SIZE`` ranks takes its share of the CPUs, so the
ranks of a node together start at most one cutter a CPU. Once a run fails, or when the
cutters are closed, every child still running is killed.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import IO, NamedTuple, Self, cast

import wdstream
from wdstream.errors import WdstreamError
from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import FileUnits
from wdstream.tables.reads import Access

MIN_FILES = 2000  # fewer files are cut in this process alone
FILES_PER_PROCESS = 1000  # a child is started for no fewer files: its start costs ~0.5 s
MAX_PROCESSES = 8  # cutters of one rank, this process included
STDERR_TAIL = 4000  # characters of a failed child's output in the error
_CHILD = ("import sys; home = sys.argv.pop(1); "
          "sys.path[0:1] = [] if home in sys.path else [home]; "
          "from wdstream.tables.unit_processes import child_main; child_main()")

Cut = Callable[[Sequence[RawFile], Access], list[FileUnits]]
log = logging.getLogger(__name__)


def cpu_share() -> int:
    """The cutters this process may run: ``rank_cpus()``, at most ``MAX_PROCESSES`` (1 where
    no interpreter can be started: ``sys.executable`` empty)."""
    if not sys.executable:
        return 1
    return min(MAX_PROCESSES, rank_cpus())


def rank_cpus() -> int:
    """This rank's share of the CPUs it may run on: those over the ranks of its node, at
    least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) // _local_ranks())


def processes_for(count: int) -> int:
    """How many processes cut ``count`` files given at once (1: this one alone)."""
    if count < MIN_FILES:
        return 1
    return max(1, min(cpu_share(), count // FILES_PER_PROCESS))


def _local_ranks() -> int:
    """The ranks of this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 when unset or invalid)."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def cut_in_processes(files: Sequence[RawFile], access: Access, cut: Cut) -> list[FileUnits]:
    """The units of ``files`` in order: ``cut(files, access)``, by ``processes_for``
    processes (see the module docstring)."""
    count = processes_for(len(files))
    if count == 1:
        return cut(files, access)
    with Cutters(access, cut, count) as cutters:
        return cutters.units(files)


class Cutters:
    """Runs of files cut into units as they are added, by a thread of this process and by up to
    ``most - 1`` children (see the module docstring): ``add(files)`` as they are found,
    ``units(files)`` once all are. As a context manager, leaving it kills the children."""

    def __init__(self, access: Access, cut: Cut, most: int):
        self.access, self.cut, self.most = access, cut, most
        self._lock = threading.Condition()
        self._added: set[RawFile] = set()
        self._waiting: collections.deque[list[RawFile]] = collections.deque()
        self._waiting_files = 0
        self._done: dict[RawFile, FileUnits] = {}
        self._error: BaseException | None = None
        self._all_added = False
        self._threads: list[threading.Thread] = []
        self._children: list[_Child] = []

    def add(self, files: Sequence[RawFile]) -> None:
        """Cut ``files`` (those not added before): one run, or for many files one run of at
        least ``FILES_PER_PROCESS`` per cutter there may be."""
        with self._lock:
            new = [f for f in dict.fromkeys(files) if f not in self._added]
            if not new or self._error is not None:
                return
            self._added.update(new)
            count = max(1, min(self.most, len(new) // FILES_PER_PROCESS))
            for i in range(count):
                self._queue(new[len(new) * i // count:len(new) * (i + 1) // count])

    def _queue(self, run: list[RawFile]) -> None:
        """``run`` waits for a cutter; one more is started if need be (under the lock)."""
        self._waiting.append(run)
        self._waiting_files += len(run)
        self._lock.notify()
        if self._threads and (self._waiting_files < FILES_PER_PROCESS
                              or len(self._threads) >= self.most):
            return
        child = None  # the first cutter: this process's
        if self._threads:
            try:
                child = _start()
            except OSError as error:  # no process to be had: the cutters there are go on
                log.warning("cutting into units in another process: %s", error)
                return
            self._children.append(child)
        thread = threading.Thread(target=self._serve, args=(child,), daemon=True,
                                  name="wdstream-cutter")
        self._threads.append(thread)
        thread.start()

    @property
    def started(self) -> bool:
        """Whether a run was added."""
        return bool(self._threads)

    def units(self, files: Sequence[RawFile]) -> list[FileUnits]:
        """The units of ``files`` in order, once every run added is cut (``files`` not
        added yet are added now): the first error a cutter met is raised."""
        self.add(files)
        with self._lock:
            self._all_added = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error
        return [self._done[f] for f in files]

    def close(self) -> None:
        with self._lock:
            self._all_added = True
            self._error = self._error or WdstreamError("cutting into units was stopped")
            self._lock.notify_all()
        self._kill()
        for thread in self._threads:
            thread.join()
        for child in self._children:
            child.process.wait()
            child.stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _next(self) -> list[RawFile] | None:
        """The next run waiting; None once all are cut, or after an error."""
        with self._lock:
            while not self._waiting and not self._all_added and self._error is None:
                self._lock.wait()
            if self._error is not None or not self._waiting:
                return None
            run = self._waiting.popleft()
            self._waiting_files -= len(run)
            return run

    def _serve(self, child: _Child | None) -> None:
        """A cutter: this process's threads (``child`` None) or a child, run after run."""
        try:
            while (run := self._next()) is not None:
                file_units = self.cut(run, self.access) if child is None \
                    else _ask(child, run, self.access)
                with self._lock:
                    self._done.update(zip(run, file_units, strict=True))
        except BaseException as error:  # noqa: BLE001 - raised by units()
            with self._lock:
                self._error = self._error or error
                self._lock.notify_all()
            self._kill()

    def _kill(self) -> None:
        for child in list(self._children):
            if child.process.poll() is None:
                child.process.kill()


class _Child(NamedTuple):
    process: subprocess.Popen
    stderr: IO[bytes]  # a temporary file: read only if the child fails


def _start() -> _Child:
    """A child cutter: a fresh interpreter that imports this very wdstream (the folder
    holding it first on its path, where ``-c`` puts the current directory, unless it is
    already on the path, as site-packages is)."""
    home = os.path.dirname(os.path.dirname(os.path.abspath(wdstream.__file__)))
    stderr = tempfile.TemporaryFile()
    return _Child(subprocess.Popen([sys.executable, "-c", _CHILD, home], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=stderr), stderr)


def _ask(child: _Child, run: list[RawFile], access: Access) -> list[FileUnits]:
    """The child's units of ``run``, or the error it met, raised here."""
    process = child.process
    try:
        stdin = cast(IO[bytes], process.stdin)  # the child is started with stdin=PIPE
        stdin.write(pickle.dumps((run, access)))
        stdin.flush()
        kind, value = pickle.load(cast(IO[bytes], process.stdout))  # and stdout=PIPE
    except Exception:  # noqa: BLE001 - no answer: the child failed before it could give one
        process.kill()
        process.wait()
        child.stderr.seek(0)
        tail = child.stderr.read().decode(errors="replace")[-STDERR_TAIL:]
        raise WdstreamError(f"cutting {printable(run[0].url)} and {len(run) - 1} more files in "
                            f"another process failed (exit {process.returncode}): {tail}"
                            ) from None
    if kind == "error":
        raise value
    return value


def child_main() -> None:
    """A child's work: runs and the access from stdin until it ends, each run's units or
    its error to stdout."""
    from wdstream.tables.units import cut_files

    while True:
        try:
            run, access = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            answer: tuple[str, object] = ("units", cut_files(run, access))
        except WdstreamError as error:
            answer = ("error", error)
        sys.stdout.buffer.write(pickle.dumps(answer))
        sys.stdout.buffer.flush()
