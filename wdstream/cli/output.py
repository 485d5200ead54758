"""What the inspection commands share: tables on stdout, one JSON document for ``--json``,
progress bars on stderr (only on a terminal and without ``--quiet``), common options and the
exit-code text for ``--help``."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from wdstream.limits import Limits
from wdstream.printable import printable, printable_json
from wdstream.sizes import format_size
from wdstream.sources.openers import OPENERS

if TYPE_CHECKING:
    from rich.console import JustifyMethod

EXIT_CODES = """
\b
Exit codes:
  0  success
  1  a problem found in the data (a damaged shard; for verify also a missing one)
  2  bad usage or input, or storage that cannot be reached (a missing object)
"""


def epilog(examples: str) -> str:
    """The text after a command's options: examples, then the exit codes."""
    return "\b\nExamples:\n" + examples.strip("\n") + "\n" + EXIT_CODES


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON document on stdout instead of tables.")
quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
opener_option = click.option(
    "--opener", type=click.Choice(OPENERS), default=None,
    help="How shards are read: auto (default; $WDSTREAM_OPENER if set), cli (aws / gcloud "
         "as a pipe), fsspec, sdk (botocore, s3:// only).")


external_option = click.option(
    "--allow-external-shards", "allow_external_shards", is_flag=True,
    help="Let the manifest name shards outside its prefix (other buckets, prefixes, hosts, "
         "local paths). Never a pipe: command. See docs/security.md.")


# --max-NAME: the size fields of wdstream.Limits
_LIMIT_OPTIONS = (
    ("shard_bytes", "Bytes a compressed shard may decompress to (default 64GiB)."),
    ("sample_bytes", "Bytes one sample's members, and what decoding makes of them, may take "
                     "(default 1GiB)."),
    ("decoder_memory", "Memory a decompressor may use for its window: zstd, xz "
                       "(default 128MiB)."),
)


def limits_option(command):
    """``--max-shard-bytes``, ``--max-sample-bytes``, ``--max-decoder-memory``: the command is
    called with ``limits``, a ``wdstream.Limits`` (docs/security.md)."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        given = {name: kwargs.pop(f"max_{name}") for name, _ in _LIMIT_OPTIONS}
        return command(*args, limits=Limits(**{name: value for name, value in given.items()
                                                if value is not None}), **kwargs)

    for name, help_text in reversed(_LIMIT_OPTIONS):
        run = click.option(f"--max-{name.replace('_', '-')}", f"max_{name}", metavar="SIZE",
                           default=None, help=help_text)(run)
    return run


def workers_option(default: int, help_text: str):
    return click.option("--workers", "-w", type=click.IntRange(min=1), default=default,
                        show_default=True, metavar="N", help=help_text)


def stdout_console():
    """Rich console on stdout; when stdout is not a terminal, lines may run to 160 columns
    (rich's default of 80 would wrap long URLs in files and pipes)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 160
    return Console(soft_wrap=True, highlight=False, width=width)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_json(document) -> None:
    """One JSON document on stdout (characters that would act on a terminal escaped)."""
    click.echo(printable_json(json.dumps(document, indent=2, ensure_ascii=False)))


def _cell(value):
    """A table cell as plain text: neither rich markup nor control characters act."""
    from rich.text import Text

    return Text(printable(value)) if isinstance(value, str) else value


def print_pairs(rows: Sequence[tuple[str, str]], title: str | None = None) -> None:
    """A two-column name/value table on stdout."""
    from rich.table import Table

    table = Table(show_header=False, box=None, padding=(0, 2, 0, 0), title=title,
                  title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(_cell(name), _cell(value))
    stdout_console().print(table)


def print_table(columns: Sequence[tuple[str, JustifyMethod]], rows: Sequence[Sequence[str]],
                footer: Sequence[str] | None = None) -> None:
    """A table on stdout; ``columns`` are (header, justify) pairs; ``footer`` a totals row."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_footer=footer is not None, pad_edge=False)
    for i, (header, justify) in enumerate(columns):
        table.add_column(header, justify=justify,
                         footer=_cell(footer[i]) if footer else "", overflow="fold")
    for row in rows:
        table.add_row(*(_cell(cell) for cell in row))
    stdout_console().print(table)




def show_progress(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


class Bar:
    """What ``progress_bar`` yields: call it with a number of bytes or items done;
    ``set_total(n)`` when the total becomes known. A disabled bar does nothing."""

    def __init__(self, progress=None, task=None):
        self._progress, self._task = progress, task

    def __call__(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def set_total(self, total: int | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def describe(self, text: str) -> None:
        """Replace the text shown (the whole line for ``unit=None``)."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)


@contextmanager
def progress_bar(total: int | None, *, unit: str | None = "bytes", description: str = "",
                 enabled: bool = True) -> Iterator[Bar]:
    """A transient bar on stderr; yields a ``Bar`` (doing nothing when not ``enabled``).

    ``unit="bytes"`` shows bytes and MB/s; ``None`` a spinner and the text ``Bar.describe``
    sets; anything else counts items (``unit`` names them).
    """
    if not enabled:
        yield Bar()
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    if unit is None:
        columns = [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
    elif unit == "bytes":
        columns = [TextColumn(description), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeElapsedColumn()]
    else:
        columns = [TextColumn(description), BarColumn(), MofNCompleteColumn(),
                   TextColumn(unit), TimeElapsedColumn()]
    progress = Progress(*columns, console=stderr_console(), transient=True)
    task = progress.add_task(description, total=total)
    with progress:
        yield Bar(progress, task)


def manifest_rows(manifest) -> list[tuple[str, str]]:
    """The summary rows every command that writes a manifest prints first."""
    return [
        ("shards", f"{len(manifest.shards):,}"),
        ("samples", f"{manifest.samples:,}"),
        ("bytes", f"{manifest.bytes:,} ({format_size(manifest.bytes)})"),
    ]


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def flatten(data: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as ``("packed_by.options.max_size", "256MB")`` rows; None values are
    left out, lists and other values shown as compact JSON (strings as they are)."""
    rows: list[tuple[str, str]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows.extend(flatten(value, name + "."))
        elif value is not None:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            rows.append((name, text))
    return rows
