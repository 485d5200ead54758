"""``wdstream index``: a manifest for existing shards, or several manifests merged into one."""

from __future__ import annotations

import time

import click

from wdstream.cli.output import (
    external_option,
    limits_option,
    manifest_rows,
    print_pairs,
    progress_bar,
    show_progress,
)
from wdstream.errors import InputError
from wdstream.sources import urls

# Most library modules are imported in the commands that use them: `wdstream --help`
# imports every command module.

EXAMPLES = """
\b
Examples:
  wdstream index s3://bucket/dataset/          # writes s3://bucket/dataset/index.json
  wdstream index ./shards --workers 8
  wdstream index --merge s3://b/ds/index.part-{000..003}-of-004.json --output s3://b/ds/
  wdstream index --merge s3://b/set-a/index.json gs://c/set-b/index.json --output s3://b/all/
  wdstream index s3://data/jsonl/ --output s3://mine/jsonl-index.json   # JSON Lines files
  wdstream index s3://data/jsonl/ --output s3://mine/jsonl-index.json --ray 64
"""


def _refuse_existing(prefix: str, overwrite: bool) -> None:
    from wdstream.shards.manifest import MANIFEST_NAME
    from wdstream.sources.objects import exists

    url = urls.join(prefix, MANIFEST_NAME)
    if not overwrite and exists(url):
        raise InputError(f"{url} already exists; use --overwrite to replace it")


@click.command("index", epilog=EXAMPLES)
@click.argument("sources", nargs=-1, required=True, metavar="PREFIX | MANIFEST...")
@click.option("--merge", is_flag=True,
              help="Join the manifests given (URLs of .json files or prefixes) into one.")
@click.option("--output", "-o", metavar="PREFIX | URL",
              help="Where the merged index.json goes (--merge), or the unit index of the JSON "
                   "Lines files under a source (a file or object anywhere).")
@click.option("--workers", type=int, default=8, show_default=True, metavar="N",
              help="Shards read at a time.")
@click.option("--ray", "ray_tasks", type=int, metavar="N",
              help="With --output: scan the JSON Lines files in N Ray tasks, on the cluster "
                   "ray.init() finds (RAY_ADDRESS) or one started here.")
@click.option("--overwrite", is_flag=True, help="Replace an existing index.json.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@external_option
@limits_option
def index_command(sources, merge, output, workers, ray_tasks, overwrite, quiet,
                  allow_external_shards, limits):
    """Write PREFIX/index.json for the shards under PREFIX (*.tar, *.tar.gz/*.tgz, *.tar.zst,
    *.tar.bz2, *.tar.xz; from wdstream, webdataset's ShardWriter, GNU tar...), or with --merge
    join manifests, such as the parts of a
    'wdstream pack --part' run, into OUTPUT/index.json. With --output and no --merge, write
    to OUTPUT the unit index of the JSON Lines files under SOURCE (their line-aligned ranges
    and row counts: StreamingDataset(SOURCE, index=OUTPUT) then reads none of them to plan)."""
    from wdstream.shards.manifest import write_manifest

    start = time.monotonic()
    if output and not merge:
        _index_raw_files(sources, output, overwrite, quiet, ray_tasks)
        return
    if ray_tasks is not None:
        raise InputError("--ray scans JSON Lines files for their unit index: give --output URL "
                         "(and no --merge)")
    strays = None
    if merge:
        manifest = _merged(sources, output, overwrite, allow_external_shards)
        prefix = output
    else:
        if len(sources) != 1:
            raise InputError(f"give one PREFIX to index (got {len(sources)}), or use --merge")
        prefix = sources[0]
        from wdstream.shards.samples import StrayCount

        strays = StrayCount()
        manifest = _indexed(prefix, overwrite, quiet, workers, strays, limits)
    url = write_manifest(manifest, prefix)
    if quiet:
        return
    seconds = max(time.monotonic() - start, 1e-9)
    rows = manifest_rows(manifest)
    if not merge:  # merging reads manifests only
        rows.append(("MB/s read", f"{manifest.bytes / seconds / 1e6:.1f} ({seconds:.1f} s)"))
    if strays is not None and strays.count:
        rows.append(("stray members", f"{strays.count_and_names()} skipped: no sample holds them"))
    print_pairs([*rows, ("manifest", url)])


def _merged(sources, output: str | None, overwrite: bool, allow_external_shards: bool):
    """The manifests ``sources`` joined into one for ``output`` (``--merge``)."""
    from wdstream.shards.manifest import load_manifest
    from wdstream.write.merge import merge_parts

    if not output:
        raise InputError("--merge needs --output PREFIX")
    _refuse_existing(output, overwrite)
    return merge_parts([load_manifest(source, allow_external_shards=allow_external_shards,
                                      allow_empty=True)
                        for source in sources], output)


def _indexed(prefix: str, overwrite: bool, quiet: bool, workers: int, strays, limits):
    """The manifest of the shards listed under ``prefix``, read ``workers`` at a time."""
    from wdstream.shards.compression import is_shard_name, not_shard_kinds, not_shards_note
    from wdstream.shards.index_shards import index_shards
    from wdstream.sources.objects import list_files

    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    _refuse_existing(prefix, overwrite)
    listed = list_files(prefix, suffix="")
    found = [(url, size) for url, size in listed if is_shard_name(url)]
    others = not_shard_kinds(url for url, _ in listed if not is_shard_name(url))
    if not found:
        raise InputError(f"{prefix}: no shards found (*.tar, *.tar.gz, *.tgz, *.tar.zst, "
                         "*.tar.bz2, *.tar.xz)")
    if others:  # said even with --quiet: data may be missing
        click.echo(f"note: {not_shards_note(others)}", err=True)
    show = show_progress(quiet)
    with progress_bar(sum(size or 0 for _, size in found), enabled=show) as bar:
        return index_shards([url for url, _ in found], base=prefix, workers=workers,
                            progress=bar if show else None, strays=strays, limits=limits)


def _index_raw_files(sources, output: str, overwrite: bool, quiet: bool,
                     ray_tasks: int | None) -> None:
    """The unit index of the JSON Lines files under ``sources[0]``, written to ``output``."""
    from wdstream.sources.objects import exists
    from wdstream.tables.files import find_files
    from wdstream.tables.reads import Access
    from wdstream.tables.unit_index import write_index
    from wdstream.tables.unit_processes import cut_in_processes
    from wdstream.tables.units import cut_files

    if len(sources) != 1:
        raise InputError(f"give one SOURCE to index (got {len(sources)})")
    if not overwrite and exists(output):
        raise InputError(f"{output} already exists; use --overwrite to replace it")
    files = [f for f in find_files(sources[0]) if f.format == "jsonl"]
    if not files:
        raise InputError(f"{sources[0]}: no JSON Lines files to index (Parquet and Arrow files "
                         "are cut from their own metadata)")
    if ray_tasks is None:
        file_units = cut_in_processes(files, Access(), cut_files)
    else:
        from wdstream.tables.ray_index import cut_on_ray

        file_units = cut_on_ray(files, Access(), tasks=ray_tasks)
    write_index(output, files, file_units)
    if not quiet:
        print_pairs([("files", str(len(files))),
                     ("rows", str(sum(u.rows for p in file_units for u in p.units))),
                     ("units", str(sum(len(p.units) for p in file_units))), ("index", output)])
