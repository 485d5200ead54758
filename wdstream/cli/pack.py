"""``wdstream pack``: options in, ``wdstream.pack`` call, summary table out."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import click

from wdstream.cli.output import manifest_rows, print_pairs, progress_bar, show_progress
from wdstream.errors import InputError
from wdstream.sizes import format_size
from wdstream.sources import urls

# Most library modules are imported in the commands that use them: `wdstream --help`
# imports every command module.


def parse_fields(values: tuple[str, ...], option: str = "--field",
                 example: str = "text=txt") -> dict[str, str] | None:
    """``("text=txt", "image=jpg")`` -> ``{"text": "txt", "image": "jpg"}``."""
    if not values:
        return None
    fields: dict[str, str] = {}
    for value in values:
        column, equals, ext = value.rpartition("=")
        if not equals or not column or not ext:
            raise InputError(f"{option} {value!r}: expected COLUMN=EXT, e.g. {option} {example}")
        if column in fields:
            raise InputError(f"{option}: column {column!r} is given twice")
        fields[column] = ext
    return fields


def parse_part(value: str | None) -> tuple[int, int] | None:
    """``"2/8"`` -> ``(2, 8)``; I counts from 0."""
    if value is None:
        return None
    index, slash, count = value.partition("/")
    if not slash or not index.strip().isdigit() or not count.strip().isdigit():
        raise InputError(f"--part {value!r}: expected I/N with 0 <= I < N, e.g. --part 0/4")
    return int(index), int(count)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during ``wdstream pack``: unwinds ``pack`` like Ctrl-C (the pool is
    stopped, uploads end, what the run wrote is deleted); the command then exits with
    128 + the signal's number (130, 143)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread, once: later ones are
    ignored, so that a second Ctrl-C cannot cut the clean-up short and leave shards behind.
    The handlers are the command's: a process forked from it (a pool worker, until its
    initializer sets its own) ignores them, and the command stops it."""
    watched = (signal.SIGINT, signal.SIGTERM)
    command = os.getpid()

    def handler(signum, frame):
        if os.getpid() != command:
            return
        for number in watched:
            signal.signal(number, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {number: signal.signal(number, handler) for number in watched}
    interrupted = False
    try:
        yield
    except Interrupted:
        interrupted = True  # the signals stay ignored while the command exits
        raise
    finally:
        if not interrupted:
            for number, action in previous.items():
                signal.signal(number, action)


def describe_progress(status, seconds: float) -> str:
    """``1.2 GB of 3.4 GB read · 1,234 records · 5 shards · 80.0 MB/s`` (bytes of the inputs
    as stored, of their total from the listing; without a total, as when reading stdin, just
    the records)."""
    text = (f"{status.records:,} records · {status.shards:,} shards · "
            f"{status.bytes / seconds / 1e6:.1f} MB/s")
    if status.input_total:
        read = min(status.input_bytes, status.input_total)
        text = f"{format_size(read)} of {format_size(status.input_total)} read · " + text
    return text


EXAMPLES = """
\b
Examples:
  wdstream pack data.jsonl --output s3://bucket/dataset/
  wdstream pack a.jsonl.zst b.parquet --output gs://bucket/ds/ --max-size 256MB --workers 4
  wdstream pack captions.parquet --field image=jpg --field caption=txt --key id --output ./shards
  wdstream pack photos/ --output ./shards --max-count 1000
  wdstream pack corpus.jsonl --output s3://bucket/ds/ --compress zstd   # .tar.zst shards
  wdstream pack web.jsonl --tokenizer tokenizer.json --tokenize text=tokens.npy --output ./tokens
  cat data.jsonl | wdstream pack - --output s3://bucket/ds/ --via cli
  wdstream pack data.jsonl --output s3://bucket/ds/ --part 0/4   # ...then 1/4, 2/4, 3/4, and:
  wdstream index --merge s3://bucket/ds/index.part-{000..003}-of-004.json --output s3://bucket/ds/
  wdstream pack 's3://raw/2026-*/part-*.jsonl.zst' --output s3://bucket/ds/ --ray 64
"""


@click.command("pack", epilog=EXAMPLES)
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--output", "-o", required=True, metavar="URL",
              help="Folder, s3://bucket/prefix/, gs://bucket/prefix/ or another fsspec URL.")
@click.option("--field", "fields", multiple=True, metavar="COLUMN=EXT",
              help="Store a column as its own member (repeatable). Default: the whole record as .json.")
@click.option("--tokenize", "tokenize", multiple=True, metavar="COLUMN=EXT",
              help="Store a text column as token ids, a .npy array (repeatable; EXT like "
                   "tokens.npy), tokenized with --tokenizer by the --workers processes. "
                   "Without EOS: PackedSequences adds it.")
@click.option("--tokenizer", metavar="PATH",
              help="The Hugging Face tokenizer.json for --tokenize. Ids are uint16 when the "
                   "vocabulary fits, else uint32.")
@click.option("--key", metavar="FIELD",
              help="Take sample keys from this column. Default: generated, unique in the dataset.")
@click.option("--max-count", type=int, metavar="N", help="At most N samples per shard.")
@click.option("--max-size", metavar="SIZE",
              help="At most SIZE bytes per shard file, headers included (256MB, 1GiB); "
                   "with --compress, the stored (compressed) bytes. "
                   "Default 256MB when --max-count is not given either.")
@click.option("--name", default="shard", show_default=True,
              help="Shards are named NAME-000000.tar, NAME-000001.tar, ...")
@click.option("--via", type=click.Choice(["auto", "cli", "fsspec"]), default="auto",
              show_default=True,
              help="How s3:// and gs:// shards are uploaded: auto (in-process: botocore for "
                   "s3://, gcsfs for gs://), fsspec (s3fs/gcsfs, in-process) or cli (piped into "
                   "'aws s3 cp -' / 'gcloud storage cp -').")
@click.option("--workers", type=int, default=1, show_default=True, metavar="N",
              help="Processes writing shards; the shards are the same for any N.")
@click.option("--part", metavar="I/N",
              help="Write only shards I, I+N, I+2N... (I from 0), for N jobs packing together; "
                   "join their manifests with 'wdstream index --merge'.")
@click.option("--compress", type=click.Choice(["zstd", "gzip"]),
              help="Write compressed shards: NAME-000000.tar.zst or .tar.gz (text shrinks "
                   "3-5x). Read back by wdstream, GNU tar, and for gzip webdataset.")
@click.option("--level", type=int, metavar="N",
              help="The compression level (zstd 1-22, default 3; gzip 0-9, default 6).")
@click.option("--ray", "ray_parts", type=int, metavar="N",
              help="Pack in N Ray tasks (the parts of --part), on the cluster ray.init() finds "
                   "(RAY_ADDRESS), and publish the merged index.json: the same dataset as one "
                   "machine's run.")
@click.option("--follow-links", is_flag=True,
              help="Read what a folder's symbolic links point to outside the folder too. "
                   "Default: links are followed only within the folder, and a link out of "
                   "it is an error (as are FIFOs, devices and sockets, always).")
@click.option("--overwrite", is_flag=True,
              help="Replace a dataset that has a manifest; the old manifest is deleted first.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
def pack_command(inputs, output, fields, tokenize, tokenizer, key, max_count, max_size, name, via,
                 workers, part, compress, level, ray_parts, follow_links, overwrite, quiet):
    """Pack records into WebDataset tar shards and write the manifest index.json last.

    INPUT: JSON Lines (.jsonl, .ndjson, also .gz/.zst), Parquet, CSV/TSV, a folder (files
    sharing a name form one sample: a.jpg + a.json), or - for JSON Lines on stdin. Each may be
    a local path, an s3://, gs://, https:// or other fsspec URL, or a glob pattern
    ('s3://raw/2026-*/part-*.parquet', '**' for any depth; matches in sorted order), read as
    a stream without a local copy.
    A failed run leaves no manifest and deletes the shards it wrote.
    """
    from wdstream.write.packer import pack

    options = dict(
        fields=parse_fields(fields), key=key, max_count=max_count, max_size=max_size, name=name,
        via=via, workers=workers, part=parse_part(part), overwrite=overwrite,
        tokenize=parse_fields(tokenize, "--tokenize", "text=tokens.npy"), tokenizer=tokenizer,
        compress=compress, level=level, follow_links=follow_links,
    )
    start = time.monotonic()
    with stop_on_signals():
        if ray_parts is not None:
            from wdstream.write.cluster import pack_on_ray

            if options.pop("part") is not None:
                raise InputError("--ray runs the parts itself: leave out --part")
            manifest = pack_on_ray(inputs, output, parts=ray_parts, **options)
        else:
            with progress_bar(None, unit=None, description="starting",
                              enabled=show_progress(quiet)) as bar:
                def report(status) -> None:
                    seconds = max(time.monotonic() - start, 1e-9)
                    bar.describe(describe_progress(status, seconds))

                manifest = pack(inputs, output, progress=report, **options)
    if quiet:
        return
    seconds = max(time.monotonic() - start, 1e-9)
    rows = [
        *manifest_rows(manifest),
        ("MB/s", f"{manifest.bytes / seconds / 1e6:.1f} ({seconds:.1f} s)"),
        ("output", output),
        ("manifest", manifest.url or ""),
    ]
    if "compression" in manifest.extra:
        info = manifest.extra["compression"]
        rows.insert(3, ("compression", f"{info['codec']}, level {info['level']}"))
    if "tokenizer" in manifest.extra:
        info = manifest.extra["tokenizer"]
        rows.insert(3, ("tokens", f"{info['dtype']} ids, vocabulary {info['vocab_size']:,} "
                                  f"({info['file']})"))
    if options.get("part"):
        count = options["part"][1]
        pattern = urls.join(output, f"index.part-{{000..{count - 1:03d}}}-of-{count:03d}.json")
        rows.append(("next", f"when all {count} parts are done (bash): "
                             f"wdstream index --merge {pattern} --output {output}"))
    print_pairs(rows)
