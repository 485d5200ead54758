"""``wdstream ls``, ``wdstream verify`` and ``wdstream cat``: options in, a
``wdstream.inspection`` call, tables or JSON out."""

from __future__ import annotations

import json
import os
import sys

import click

from wdstream.cli.output import (
    epilog,
    external_option,
    flatten,
    json_option,
    limits_option,
    opener_option,
    plural,
    print_json,
    print_pairs,
    print_table,
    progress_bar,
    quiet_option,
    show_progress,
    workers_option,
)
from wdstream.printable import printable, printable_json
from wdstream.sizes import format_size

# Most library modules are imported in the commands that use them: `wdstream --help`
# imports every command module.


def _size(nbytes: int | None) -> str:
    return "?" if nbytes is None else format_size(nbytes)


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


# --------------------------------------------------------------------------- ls


@click.command("ls", short_help="List shards, samples, sizes and how a dataset was packed.",
               epilog=epilog("""
  wdstream ls s3://bucket/prefix/
  wdstream ls gs://bucket/prefix/index.json --json | jq .samples
  wdstream ls './shards/shard-{000000..000009}.tar' --no-scan
"""))
@click.argument("url")
@click.option("--scan/--no-scan", default=True, show_default=True,
              help="Without a manifest, read the shards to count samples (--no-scan: names "
                   "and sizes only).")
@workers_option(8, "Shards scanned at a time (without a manifest).")
@external_option
@json_option
@quiet_option
@click.pass_context
def ls_command(ctx, url, scan, workers, allow_external_shards, as_json, quiet):
    """List a dataset's shards with their samples and sizes, the totals, the member
    extensions and what the manifest records about how it was packed.

    Without a manifest (index.json) the shards under the prefix (.tar and compressed tars),
    or those the pattern names, are listed and read to count their samples; the output says
    so, and names the kinds of other files it left out. A shard that
    cannot be read is reported and makes the exit code 1.

    Raw files (Parquet, JSON Lines, Arrow: a folder of them, a pattern or a file) are listed
    per file: format, units (row groups...), rows and size.
    """
    from wdstream.inspection.summary import describe

    # the manifest, or a listing; no shard is read yet
    found = _shards(url, allow_external_shards)
    if found is None:
        _ls_raw(ctx, url, as_json)
        return
    enabled = scan and found.manifest is None and show_progress(quiet)
    with progress_bar(_known_total(found.sizes), description="scanning",
                      enabled=enabled) as advance:
        summary = describe(found, scan=scan, workers=workers, progress=advance)
    if as_json:
        print_json(summary.to_dict())
    else:
        _print_summary(summary)
    if summary.problems:
        for shard in summary.problems:
            click.echo(printable(f"{shard.name}: {shard.problem}"), err=True)
        ctx.exit(1)


def _shards(url: str, allow_external_shards: bool):
    """The shards ``url`` names, or None when it names raw files (Parquet, JSON Lines, Arrow;
    one ``….json`` of rows) or a folder holding neither a manifest nor shards."""
    from wdstream.shards.locate import NoShardsError, find_shards
    from wdstream.tables.files import names_raw_files
    from wdstream.tables.jsonl import json_rows_file

    if names_raw_files(url) or json_rows_file(url):
        return None
    try:
        return find_shards(url, allow_external_shards=allow_external_shards)
    except NoShardsError:
        return None


def _ls_raw(ctx, url: str, as_json: bool) -> None:
    """``ls`` of raw files: per file its format, units (row groups...), rows and bytes."""
    from wdstream.inspection.raw_files import raw_units, summarize, summary_dict

    files = summarize(raw_units(url))
    summary = summary_dict(url, files)
    if as_json:
        print_json(summary)
        return
    print_pairs([("dataset", url), ("raw files", ", ".join(summary["formats"])),
                 ("files", f"{len(files):,}"), ("units", f"{summary['units']:,}"),
                 ("samples", f"{summary['samples']:,}"),
                 ("bytes", f"{summary['bytes']:,} ({_size(summary['bytes'])})")])
    click.echo()
    print_table([("file", "left"), ("format", "left"), ("units", "right"), ("rows", "right"),
                 ("size", "right")],
                [[f.name, f.format, f"{f.units:,}", f"{f.rows:,}", _size(f.bytes)]
                 for f in files],
                footer=["total", "", f"{summary['units']:,}", f"{summary['samples']:,}",
                        _size(summary["bytes"])])


def _known_total(sizes) -> int | None:
    return None if any(size is None for size in sizes) else sum(sizes)


def _print_summary(summary) -> None:
    if summary.manifest_url:
        origin = summary.manifest_url
    elif summary.scanned:
        origin = f"none: the {plural(len(summary.shards), 'shard')} found were read to count samples"
    else:
        origin = "none: sample counts unknown (--no-scan)"
    rows = [
        ("dataset", summary.source),
        ("manifest", origin),
        ("shards", f"{len(summary.shards):,}"),
        ("samples", _count(summary.samples)),
        ("bytes", "?" if summary.bytes is None else f"{summary.bytes:,} ({_size(summary.bytes)})"),
        ("extensions", ", ".join(summary.extensions) or "?"),
    ]
    if summary.samples and summary.bytes:
        rows.append(("bytes/sample", f"{summary.bytes / summary.samples:,.0f}"))
    strays = sum(shard.stray_members or 0 for shard in summary.shards)
    if strays:
        rows.append(("stray members", f"{strays:,} skipped (names without key.ext, hidden "
                                      "or __meta__: webdataset skips them too)"))
    print_pairs(rows)
    if summary.not_shards:
        from wdstream.shards.compression import not_shards_note

        click.echo(f"note: {not_shards_note(summary.not_shards)}", err=True)
    extra = flatten(summary.extra)
    if extra:
        click.echo()
        print_pairs(extra, title="manifest extras (how it was packed)")
    click.echo()
    shard_rows = [
        [shard.name, _count(shard.samples),
         "unreadable" if shard.problem else _size(shard.bytes),
         "?" if shard.bytes is None else f"{shard.bytes:,}"]
        for shard in summary.shards
    ]
    print_table(
        [("shard", "left"), ("samples", "right"), ("size", "right"), ("bytes", "right")],
        shard_rows,
        footer=["total", _count(summary.samples), _size(summary.bytes),
                "?" if summary.bytes is None else f"{summary.bytes:,}"],
    )


# --------------------------------------------------------------------------- verify


@click.command("verify", short_help="Check every shard's size, digest (and tar) against the manifest.",
               epilog=epilog("""
  wdstream verify s3://bucket/prefix/
  wdstream verify s3://bucket/prefix/ --deep --workers 16
  wdstream verify ./shards --json > report.json || echo "damaged"
"""))
@click.argument("url")
@click.option("--deep", is_flag=True,
              help="Also parse every tar and check its sample count against the manifest.")
@workers_option(8, "Shards checked at a time.")
@opener_option
@external_option
@limits_option
@json_option
@quiet_option
@click.pass_context
def verify_command(ctx, url, deep, workers, opener, allow_external_shards, as_json, quiet,
                   limits):
    """Check every shard against the manifest: it exists, its size and its sha256 match, and
    with --deep that it parses as a complete tar holding the stated number of samples.

    Prints what is wrong with each damaged shard and exits 1 if any is. Without a manifest
    there is nothing to compare with: each shard is parsed (as with --deep) and the output
    says so.

    Raw files (Parquet, JSON Lines, Arrow) are read whole: every unit's rows parsed and
    counted, every file checked unchanged since its metadata was read.
    """
    from wdstream.inspection.verification import verify

    found = _shards(url, allow_external_shards)
    if found is None:
        _verify_raw(ctx, url, workers, opener, as_json, quiet)
        return
    with progress_bar(_known_total(found.sizes), description="verifying",
                      enabled=show_progress(quiet)) as advance:
        report = verify(found, deep=deep, workers=workers, opener=opener, progress=advance,
                        limits=limits)
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report)
    if not report.ok:
        ctx.exit(1)


def _verify_raw(ctx, url: str, workers: int, opener, as_json: bool, quiet: bool) -> None:
    """``verify`` of raw files: every unit read whole, every row parsed, each file checked
    unchanged since its metadata was read."""
    from wdstream.inspection.raw_files import check_units, raw_units, summary_dict

    table = raw_units(url, opener)
    with progress_bar(sum(f.size for f in table.files), description="verifying",
                      enabled=show_progress(quiet)) as advance:
        files = check_units(table, workers=workers, opener=opener, progress=advance)
    problems = [f for f in files if f.problem]
    if as_json:
        print_json(summary_dict(url, files) | {"ok": not problems})
    else:
        for file in problems:
            click.echo(printable(f"{file.name}: {file.problem}"))
        checked = "metadata, unchanged, every row read"
        rows = sum(f.rows for f in files)
        click.echo(f"FAILED: {len(problems):,} of {plural(len(files), 'file')} have problems "
                   f"({checked})" if problems else
                   f"OK: {plural(len(files), 'file')}, {rows:,} rows ({checked})")
    if problems:
        ctx.exit(1)


def _print_report(report) -> None:
    checks = ["exists", "size", "sha256"] if report.manifest_url else ["exists"]
    if report.deep:
        checks += ["tar parses", "sample count"] if report.manifest_url else ["tar parses"]
    for shard in report.problems:
        for problem in shard.problems:
            click.echo(printable(f"{shard.name}: {problem}"))
    for note in report.notes:
        click.echo(printable(f"note: {note}"), err=True)
    checked = ", ".join(checks)
    if report.ok:
        nbytes = sum(s.size or 0 for s in report.shards)
        click.echo(f"OK: {plural(len(report.shards), 'shard')}, {_size(nbytes)} ({checked})")
    else:
        click.echo(f"FAILED: {len(report.problems):,} of {plural(len(report.shards), 'shard')} "
                   f"have problems ({checked})")


# --------------------------------------------------------------------------- cat


@click.command("cat", short_help="Print samples as JSON Lines.", epilog=epilog("""
  wdstream cat s3://bucket/prefix/ -n 3
  wdstream cat s3://bucket/prefix/ --key doc000042 --fields json,txt
  wdstream cat ./shards/shard-000000.tar --fields jpg --base64 | head -1
  wdstream cat gs://bucket/prefix/ --no-decode | jq -c '.__key__'
"""))
@click.argument("url")
@click.option("-n", "--count", "count", type=click.IntRange(min=0), default=None, metavar="N",
              help="Print at most N samples (default: all).")
@click.option("--key", "-k", metavar="KEY",
              help="Print the first sample with this key (exit 2 if there is none).")
@click.option("--fields", "-f", metavar="EXT,EXT",
              help="Only these members, by extension (e.g. json,txt); __key__ is always kept.")
@click.option("--base64", "base64_bytes", is_flag=True,
              help='Binary members as {"base64": ...} instead of {"bytes": SIZE}.')
@click.option("--decode/--no-decode", default=True, show_default=True,
              help="Show .json as JSON, .txt as text, .cls as a number, .npy as its shape; "
                   "--no-decode treats every member as binary.")
@opener_option
@external_option
@limits_option
def cat_command(url, count, key, fields, base64_bytes, decode, opener, allow_external_shards,
                limits):
    """Print samples as JSON Lines on stdout, in file order (shard by shard, no shuffling).

    Each line holds __key__, __url__ and one entry per member: decoded .json/.txt/.cls, and
    binary members as their size ({"jpg": {"bytes": 1234}}) or, with --base64, their bytes.
    Raw files' rows are printed as their columns (--fields names columns).
    """
    from wdstream.inspection.contents import read_samples, sample_to_json

    field_list = None
    if fields is not None:
        field_list = [name.strip().lower() for name in fields.split(",") if name.strip()]
        if not field_list:
            raise click.BadParameter("give at least one extension, e.g. json,txt",
                                     param_hint="--fields")
    found = _shards(url, allow_external_shards)
    if found is None:
        from wdstream.inspection.raw_files import iter_rows, raw_units, row_to_json

        lines = (row_to_json(row, fields=field_list, base64_bytes=base64_bytes)
                 for row in iter_rows(raw_units(url, opener), key=key, limit=count,
                                      opener=opener))
    else:
        lines = (sample_to_json(sample, fields=field_list, decode=decode,
                                base64_bytes=base64_bytes, limits=limits)
                 for sample in read_samples(found, key=key, limit=count, opener=opener,
                                            limits=limits))
    try:
        for value in lines:
            line = printable_json(json.dumps(value, ensure_ascii=False, default=str))
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # `wdstream cat ... | head`: the reader has what it wanted.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
