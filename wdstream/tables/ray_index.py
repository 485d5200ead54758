"""The unit index of many JSON Lines files cut into units by Ray tasks (``wdstream index SOURCE
--output URL --ray N``): the files, in order, are cut into N runs of about equal bytes, each
task scans its run as one machine does (``units.cut_files``: ``FILES_IN_FLIGHT`` files at
once), and the caller gets the units back in the files' order, so the index is the one a
single machine writes.

Ray is imported only here (``pip install 'wdstream[ray]'``): ``ray_session`` connects to the
cluster named by ``address`` or ``RAY_ADDRESS``, or starts one on this machine, for the
``--ray`` commands (``write.cluster`` packs in one too). The files must be readable from every
node (object-store URLs, or a shared file system).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from wdstream.errors import InputError, WdstreamError
from wdstream.tables.files import RawFile
from wdstream.tables.formats import FileUnits
from wdstream.tables.reads import Access
from wdstream.tables.units import cut_files


@contextmanager
def ray_session(address: str | None = None) -> Iterator:
    """The ``ray`` module, connected to the cluster at ``address`` (or ``RAY_ADDRESS``), or to
    one started on this machine, which is shut down at the end. Every ``--ray`` command
    (``wdstream pack``, ``wdstream index``) runs its tasks in one."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'wdstream[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def cluster_cpus(ray) -> int:
    """The CPUs of the cluster ``ray`` is connected to (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def cut_on_ray(files: Sequence[RawFile], access: Access, tasks: int | None = None,
                address: str | None = None) -> list[FileUnits]:
    """The units of ``files`` from ``tasks`` Ray tasks (default: the cluster's CPUs); a
    task's ``WdstreamError`` (a file that cannot be read or scanned) is raised as it is."""
    if tasks is not None and (isinstance(tasks, bool) or tasks < 1):
        raise InputError(f"--ray must be at least 1, got {tasks}")
    with ray_session(address) as ray:
        scan = ray.remote(cut_files)
        refs = [scan.remote(run, access)
                for run in byte_runs(files, tasks or cluster_cpus(ray))]
        file_units: list[FileUnits] = []
        for ref in refs:
            try:
                file_units.extend(ray.get(ref))
            except ray.exceptions.RayTaskError as error:
                cause = getattr(error, "cause", None)
                if isinstance(cause, WdstreamError):
                    raise cause from None
                raise WdstreamError(f"scanning JSON Lines files on Ray failed: {error}") from None
        return file_units


def byte_runs(files: Sequence[RawFile], count: int) -> list[list[RawFile]]:
    """``files`` cut, in order, into at most ``count`` runs of about equal bytes."""
    runs: list[list[RawFile]] = [[] for _ in range(max(1, min(count, len(files))))]
    total, at = max(1, sum(f.size for f in files)), 0
    for file in files:
        runs[min(len(runs) - 1, at * len(runs) // total)].append(file)
        at += file.size
    return [run for run in runs if run]
