"""``wdstream bench``: stream a dataset through the real ``wdstream.DataLoader`` and time it."""

from __future__ import annotations

import click

from wdstream.cli.output import (
    epilog,
    external_option,
    json_option,
    print_json,
    print_pairs,
    progress_bar,
    quiet_option,
    show_progress,
)
from wdstream.errors import InputError
from wdstream.options import CHOICES
from wdstream.printable import printable

# Most library modules are imported in the commands that use them: `wdstream --help`
# imports every command module.


@click.command("bench", short_help="Time streaming through wdstream.DataLoader.", epilog=epilog("""
  wdstream bench s3://bucket/prefix/
  wdstream bench s3://bucket/prefix/ --workers 4 --batch-size 64 --batches 200
  wdstream bench s3://bucket/prefix/ --opener cli --json    # compare with --opener sdk
  wdstream bench gs://bucket/images/ --no-decode --bytes-as tensor
  wdstream bench gs://bucket/images/ --images rgb8     # JPEGs decoded in the workers
"""))
@click.argument("url")
@click.option("--workers", "-w", type=click.IntRange(min=0), default=2, show_default=True,
              metavar="N", help="DataLoader worker processes (0: read in this process).")
@click.option("--batch-size", "-b", type=click.IntRange(min=0), default=32, show_default=True,
              metavar="B", help="Samples per batch (0: one sample at a time, batch_size=None).")
@click.option("--batches", "-n", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop after N batches (default: one whole epoch).")
@click.option("--opener", type=click.Choice(CHOICES["opener"]), default="auto",
              show_default=True,
              help="How shards are read: auto ($WDSTREAM_OPENER, else the scheme's default), "
                   "cli (aws / gcloud as a pipe), fsspec, sdk (botocore, s3:// only).")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True,
              help="Shuffle as training would (seed 0).")
@click.option("--decode/--no-decode", default=True, show_default=True,
              help="Decode members (.json, .txt, .npy...) as training would, or keep bytes.")
@click.option("--images", metavar="MODE",
              help="Also decode images in the workers, as decode=MODE would: pil, rgb8, "
                   "torchrgb8, torchrgb... (needs Pillow).")
@click.option("--on-error", type=click.Choice(CHOICES["on_error"]), default="raise",
              show_default=True, help="What a shard that cannot be read does; skips are counted.")
@click.option("--bytes-as", type=click.Choice(CHOICES["bytes_as"]), default="bytes",
              show_default=True,
              help="How undecoded members reach the loop: bytes, or uint8 tensors sharing the "
                   "workers' memory (no copy; the fast way for large binary members).")
@external_option
@json_option
@quiet_option
def bench_command(url, workers, batch_size, batches, opener, shuffle, decode, images, on_error,
                  bytes_as, allow_external_shards, as_json, quiet):
    """Stream URL through wdstream.DataLoader and report samples/s, MB/s and the time to the
    first batch (worker start-up included), with the loader's retries and skipped shards.

    MB/s counts shard bytes, estimated from the manifest's mean sample size (none without a
    manifest). Measure what your training job will see: the same workers, batch size and
    opener. Startup costs weigh on short runs; use an epoch or a few hundred batches.
    """
    from wdstream.inspection.throughput import benchmark

    if images is not None:
        if not decode:
            raise InputError("--images decodes images: it does not go with --no-decode")
        from wdstream.stream.read.decode import decode_option

        try:
            decode_option(images)
        except ValueError as error:
            raise InputError(f"--images: {error}") from None
        decode = images
    with progress_bar(batches, unit="batches", description="streaming",
                      enabled=show_progress(quiet)) as bar:
        result = benchmark(url, workers=workers, batch_size=batch_size or None, batches=batches,
                           opener=opener, shuffle=shuffle, decode=decode, on_error=on_error,
                           bytes_as=bytes_as, progress=bar,
                           on_length=bar.set_total if batches is None else None,
                           allow_external_shards=allow_external_shards)
    if as_json:
        print_json(result.to_dict())
        return
    _print_result(result)


def _decode_text(decode) -> str:
    if isinstance(decode, str):
        return f"on, images as {decode}"
    return "on" if decode else "off"


def _print_result(result) -> None:
    def rate(value, digits=0):
        return "n/a" if value is None else f"{value:,.{digits}f}"

    rows = [
        ("source", result.source),
        ("layout", f"{result.workers} workers, batch size {result.batch_size or 'None'}, "
                   f"opener {result.opener}, shuffle {'on' if result.shuffle else 'off'}, "
                   f"decode {_decode_text(result.decode)}, bytes as {result.bytes_as}"),
        ("batches", f"{result.batches:,}"),
        ("samples", f"{result.samples:,}"),
        ("time", f"{result.seconds:.2f} s"),
        ("first batch", "n/a" if result.first_batch_seconds is None
         else f"{result.first_batch_seconds:.2f} s"),
        ("samples/s", rate(result.samples_per_s)),
        ("samples/s after 1st batch", rate(result.steady_samples_per_s)),
        ("MB/s", rate(result.mb_per_s, 1)),
        ("retries", f"{result.retries:,}"),
        ("skipped", f"{len(result.skipped_shards):,} shards, {result.skipped_samples:,} samples"),
    ]
    print_pairs(rows)
    for shard in result.skipped_shards:
        click.echo(printable(f"skipped: {shard}"), err=True)
