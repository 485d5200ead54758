"""Many files planned by several processes: ``plan_in_processes(files, access, plan)``.

Planning a file costs about a millisecond of CPU in this process's threads (a presigned
GET of its footer, parsing it: docs/benchmarks-results.md), all under one interpreter lock.
With at least ``MIN_FILES`` files and more than one CPU for this process, the files are cut
into runs, in order, of at least ``FILES_PER_PROCESS``: this process plans the first with
``plan`` (``units.plan_files``: ``PLANS_IN_FLIGHT`` files at once) while each other run is
planned the same way by a child (``child_main``), and the plans are joined in the files'
order: the same plans as one process makes.

A child is a fresh interpreter (``sys.executable -c``) importing the same wdstream, with
nothing of this process but its environment variables (credentials, endpoints): it imports
no script of the user's and inherits no threads or connections. It reads its run (the
``RawFile``s and the ``Access``) from stdin and writes back the plans, or the wdstream error
a file gave (raised here as it is: a file that is not Parquet, a footer too large, a missing
object), pickled; anything else it prints is dropped unless it fails. A rank of a node with
``LOCAL_WORLD_SIZE`` ranks takes its share of the CPUs, so the ranks of a node together
start at most one planner a CPU. Every child still running when the call ends (an error,
an interrupt) is killed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import wdstream
from wdstream.errors import WdstreamError
from wdstream.printable import printable
from wdstream.tables.files import RawFile
from wdstream.tables.formats import FilePlan
from wdstream.tables.reads import Access

MIN_FILES = 2000  # fewer files are planned in this process alone
FILES_PER_PROCESS = 1000  # a child is started for no fewer files: its start costs ~0.5 s
MAX_PROCESSES = 8  # planners of one rank, this process included
STDERR_TAIL = 4000  # characters of a failed child's output in the error
_CHILD = ("import sys; home = sys.argv.pop(1); "
          "sys.path[0:1] = [] if home in sys.path else [home]; "
          "from wdstream.tables.plan_processes import child_main; child_main()")


def processes_for(count: int) -> int:
    """How many processes plan ``count`` files (1: this one alone)."""
    if count < MIN_FILES or not sys.executable:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_PROCESSES, (cpus or 1) // _local_ranks(), count // FILES_PER_PROCESS))


def _local_ranks() -> int:
    """The ranks of this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 when unset or invalid)."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def plan_in_processes(files: Sequence[RawFile], access: Access,
                      plan: Callable[[Sequence[RawFile], Access], list[FilePlan]]
                      ) -> list[FilePlan]:
    """The plans of ``files`` in order: ``plan(files, access)``, by ``processes_for``
    processes (see the module docstring)."""
    count = processes_for(len(files))
    if count == 1:
        return plan(files, access)
    bounds = [len(files) * i // count for i in range(count + 1)]
    runs = [list(files[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    children: list[subprocess.Popen] = []
    pool = ThreadPoolExecutor(count - 1)  # a thread a child: its run in, its answer out
    try:
        answers = []
        for run in runs[1:]:
            children.append(_start(run, access))
            answers.append(pool.submit(_answer, children[-1], run, access))
        plans = plan(runs[0], access)
        for answer in answers:
            plans.extend(answer.result())
        return plans
    finally:
        for child in children:  # all ended, unless this call failed
            if child.poll() is None:
                child.kill()
        pool.shutdown(wait=True)
        for child in children:
            child.wait()


def _start(run: list[RawFile], access: Access) -> subprocess.Popen:
    """A child planning ``run``: a fresh interpreter that imports this very wdstream (the
    folder holding it first on its path, where ``-c`` puts the current directory, unless it
    is already on the path, as site-packages is)."""
    home = os.path.dirname(os.path.dirname(os.path.abspath(wdstream.__file__)))
    return subprocess.Popen([sys.executable, "-c", _CHILD, home], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _answer(child: subprocess.Popen, run: list[RawFile], access: Access) -> list[FilePlan]:
    """The child's plans of ``run``, or the error it met, raised here."""
    out, err = child.communicate(pickle.dumps((run, access)))
    try:
        kind, value = pickle.loads(out)
    except Exception:  # noqa: BLE001 - no answer: the child failed before it could give one
        tail = err.decode(errors="replace")[-STDERR_TAIL:]
        raise WdstreamError(f"planning {printable(run[0].url)} and {len(run) - 1} more files in "
                            f"another process failed (exit {child.returncode}): {tail}") from None
    if kind == "error":
        raise value
    return value


def child_main() -> None:
    """A child's work: the run and access from stdin, the plans or the error to stdout."""
    from wdstream.tables.units import plan_files

    run, access = pickle.load(sys.stdin.buffer)
    try:
        answer = ("plans", plan_files(run, access))
    except WdstreamError as error:
        answer = ("error", error)
    sys.stdout.buffer.write(pickle.dumps(answer))
