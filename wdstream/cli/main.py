"""The ``wdstream`` command group. Each command lives in its own module, imported when the
group needs it; the library modules that import numpy are imported only when a command runs,
so ``wdstream --help`` stays fast. Commands are thin: they parse options, call the library,
and print; a WdstreamError becomes a one-line message and its exit code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys

import click

from wdstream import __version__
from wdstream.errors import WdstreamError
from wdstream.printable import printable

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

    def parse_args(self, ctx, args):
        ctx.meta["wdstream.argv"] = list(args)  # for the last guard's message
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except WdstreamError as error:
            click.echo(f"error: {_shown(error)}", err=True)
            sys.exit(error.exit_code)
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or pack's Interrupted (SIGTERM too)
            signum = getattr(interrupt, "signum", signal.SIGINT)
            click.echo(f"interrupted ({signal.Signals(signum).name})", err=True)
            sys.exit(128 + signum)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # usage errors: click prints them (exit 2)
        except BrokenPipeError:
            _quiet_stdout()  # the reader of our output went away (`| head`): not an error
            sys.exit(1)
        except Exception as error:  # the last guard: no traceback for users
            if debugging():
                raise
            click.echo(f"error: {_command_line(ctx)}: {unexpected(error)} "
                       f"(set {DEBUG_VARIABLE}=1 for the traceback)", err=True)
            sys.exit(2)


DEBUG_VARIABLE = "WDSTREAM_DEBUG"


def debugging() -> bool:
    """Whether ``WDSTREAM_DEBUG`` asks for tracebacks (read at each call, not at import)."""
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def unexpected(error: BaseException) -> str:
    """A one-line description of an exception that is not wdstream's own."""
    if isinstance(error, RecursionError):
        return "the input is nested too deeply (RecursionError)"
    if isinstance(error, UnicodeError):
        return f"text that is not valid Unicode ({type(error).__name__}: {error})"
    if isinstance(error, MemoryError):
        return "out of memory (MemoryError)"
    text = str(error).splitlines()[0][:300] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _command_line(ctx) -> str:
    """``wdstream verify s3://b/ds/``: the command and its arguments, which name the input."""
    words = ["wdstream", *ctx.meta.get("wdstream.argv", ())]
    return " ".join(words[:8]) + (" ..." if len(words) > 8 else "")


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _shown(error: WdstreamError) -> str:
    """An error's message safe for a terminal: names from storage may hold control characters.
    One line, but for the stderr of a failed command (a StreamError), which keeps its lines."""
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
