"""Packing one dataset with many machines on Ray: ``pack_on_ray`` (``wdstream pack --ray N``).

Each Ray task packs one part, ``pack(..., part=(i, n))``: it reads the whole input, computes the
same shard boundaries as a single run and writes the shards whose index ``% n == i`` and a part
manifest. When every part has succeeded, the part manifests are merged (``merge_parts``) into the
``index.json`` a single run writes, which is published last, and the part manifests are deleted:
the output is byte-identical to ``pack`` on one machine.

If any part fails, every shard and part manifest the run wrote is deleted once all tasks have
ended, no ``index.json`` is written, and the part's error is raised
(a ``WdstreamError`` naming the record, as a single run's).

Ray is imported by ``wdstream.tables.ray_index.ray_session`` (``pip install 'wdstream[ray]'``),
which connects to the cluster named by ``address`` or ``RAY_ADDRESS``, or starts one on this
machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import cast

from wdstream.errors import InputError, WdstreamError
from wdstream.shards.manifest import MANIFEST_NAME, Manifest, load_manifest, write_manifest
from wdstream.sources import urls
from wdstream.sources.objects import delete, exists
from wdstream.tables.ray_index import cluster_cpus, ray_session
from wdstream.write.inputs import check_inputs
from wdstream.write.jobs import part_manifest_name
from wdstream.write.merge import merge_parts
from wdstream.write.pack_options import check_options
from wdstream.write.packer import input_paths, pack


def _pack_part(inputs: list[str], output: str, part: tuple[int, int], options: dict) -> str:
    """One Ray task: pack one part; returns its manifest's URL."""
    return cast(str, pack(inputs, output, part=part, **options).url)  # pack() sets the URL


def pack_on_ray(inputs: Iterable[str | os.PathLike] | str | os.PathLike, output: str | os.PathLike,
                *, parts: int | None = None, address: str | None = None,
                overwrite: bool = False, via: str = "auto", **options) -> Manifest:
    """Pack ``inputs`` into ``output`` with ``parts`` Ray tasks (default: the cluster's CPUs)
    and publish the merged ``index.json``; takes ``pack``'s options (not ``part``).

    Inputs and output must be reachable from every node (object-store URLs, or a shared
    file system). Returns the manifest written.
    """
    output = os.fspath(output)
    paths = _checked_paths(inputs, parts, via, options)
    index_url = urls.join(output, MANIFEST_NAME)
    if exists(index_url):
        if not overwrite:
            raise InputError(f"{index_url} already exists; use --overwrite to replace the dataset")
        delete(index_url)

    with ray_session(address) as ray:
        count = parts or cluster_cpus(ray)
        task = ray.remote(num_cpus=options.get("workers", 1), max_retries=0)(_pack_part)
        options = {**options, "via": via, "overwrite": True}  # replaces stale part manifests
        refs = {task.remote(paths, output, (i, count), options): i for i in range(count)}
        failure = _wait_all(ray, refs)
        part_urls = [urls.join(output, part_manifest_name((i, count))) for i in range(count)]
        if failure is not None:
            _delete_parts(part_urls)
            raise failure
        return _publish(part_urls, output, via)


def _checked_paths(inputs, parts: int | None, via: str, options: dict) -> list[str]:
    """The inputs' paths, once they and the options are checked: before any task starts, so
    that a mistake fails here rather than in every task."""
    if "part" in options:
        raise InputError("--ray runs the parts itself: leave out --part")
    if "progress" in options:
        raise InputError("pack_on_ray reports no progress: leave out progress")
    paths = input_paths(inputs)
    if "-" in paths:
        raise InputError("--ray cannot read stdin (-): every part reads the whole input")
    if parts is not None and parts < 1:
        raise InputError(f"--ray must be at least 1, got {parts}")
    check_options(options.get("fields"), options.get("key"), options.get("max_count"), None,
                  options.get("name", "shard"), options.get("workers", 1), None, via)
    # a missing object, an empty glob or a folder's bad entry fails here, not in n tasks
    check_inputs(paths, options.get("follow_links", False))
    return paths


def _publish(part_urls: list[str], output: str, via: str) -> Manifest:
    """Merge the part manifests into ``output``'s ``index.json``, then delete them."""
    manifests = [load_manifest(url, allow_empty=True) for url in part_urls]
    merged = merge_parts(manifests, output)
    merged.extra.pop("merged_from", None)  # the part manifests are deleted below
    try:
        merged.url = write_manifest(merged, output, via=via)
    except BaseException:
        _delete_parts(part_urls)
        raise
    for url in part_urls:
        delete(url)
    return merged


def _wait_all(ray, refs: dict) -> WdstreamError | None:
    """Wait for every task to end; the first failure's error, if any.

    Parts are not cancelled: Ray reports a cancelled task as ended while its process may
    still be writing a shard, which could then land after the clean-up. A failing part stops
    at its first bad record; the others run to their end, and their output is deleted."""
    failure = None
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except Exception as error:  # Ray wraps the task's exception
            if failure is None:
                failure = _unwrapped(error, refs[done[0]], len(refs))
    return failure


def _unwrapped(error: Exception, index: int, count: int) -> WdstreamError:
    cause = getattr(error, "cause", None)
    if isinstance(cause, WdstreamError):
        return cause
    if isinstance(error, WdstreamError):
        return error
    return WdstreamError(f"part {index}/{count} failed on Ray: {cause or error}")


def _delete_parts(part_urls: list[str]) -> None:
    """Delete the shards and manifests of the parts that finished (a failed or cancelled part
    deleted its own shards)."""
    for url in part_urls:
        try:
            if not exists(url):
                continue
            manifest = load_manifest(url, allow_empty=True)
            for i in range(len(manifest.shards)):
                delete(manifest.shard_url(i))
            delete(url)
        except WdstreamError:
            pass  # best effort: the part's error is the one to report
