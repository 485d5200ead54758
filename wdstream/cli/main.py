"""The ``wdstream`` command group. Each command lives in its own module and is imported only
when it runs, so ``wdstream --help`` stays fast. Commands are thin: they parse options, call
the library, and print; a WdstreamError becomes a one-line message and its exit code."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from .. import __version__
from ..errors import WdstreamError

# command name -> (module, attribute); the module defines a click.Command.
COMMANDS = {
    "pack": ("wdstream.cli.pack", "pack_command"),
    "index": ("wdstream.cli.index", "index_command"),
    "ls": ("wdstream.cli.inspect", "ls_command"),
    "verify": ("wdstream.cli.inspect", "verify_command"),
    "cat": ("wdstream.cli.inspect", "cat_command"),
    "bench": ("wdstream.cli.bench", "bench_command"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(name for name in COMMANDS if self._available(name))

    def get_command(self, ctx, name):
        if name not in COMMANDS or not self._available(name):
            return None
        module, attribute = COMMANDS[name]
        return getattr(importlib.import_module(module), attribute)

    @staticmethod
    def _available(name):
        return importlib.util.find_spec(COMMANDS[name][0]) is not None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except WdstreamError as error:
            click.echo(f"error: {_shown(error)}", err=True)
            sys.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


def _shown(error: WdstreamError) -> str:
    """An error's message safe for a terminal: names from storage may hold control characters.
    One line, but for the stderr of a failed command (a StreamError), which keeps its lines."""
    from ..printable import printable

    text = str(error).rstrip("\n")
    tail = getattr(error, "stderr", "")
    if tail and text.endswith("\n" + tail):
        head = text[: -len(tail) - 1]
        return printable(head) + "\n" + printable(tail, keep_newlines=True)
    return printable(text)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wdstream")
def main():
    """Pack examples into WebDataset shards in S3, GCS or a folder, and inspect them.

    \b
    Exit codes: 0 ok, 1 a problem found in the data (verify), 2 bad usage or input.
    Endpoints and credentials come from the clouds' usual environment
    (AWS_ENDPOINT_URL, AWS_PROFILE, STORAGE_EMULATOR_HOST, ...).
    """


if __name__ == "__main__":  # pragma: no cover
    main()
