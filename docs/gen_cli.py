"""Render the CLI reference page (cli.md) from the click commands, so it cannot drift.

The docs build (docs/hooks.py) renders the page into the site; it is not a file in the
repository. ``python docs/gen_cli.py`` prints it.
"""

from __future__ import annotations

import sys

WIDTH = 100  # columns of the rendered help, whatever the terminal

HEADER = """# CLI reference

<!-- Rendered by docs/gen_cli.py from the click commands when the docs are built. -->

Every command prints its help with `-h` or `--help`. Exit codes are the same for all:
0 success, 1 a problem found in the data (a damaged shard), 2 bad usage or input (including
a dataset that cannot be reached), 130 or 143 when stopped by SIGINT (Ctrl-C) or SIGTERM.
Errors are one line on stderr starting with `error:`, never a traceback; for an error that is
not one of wdstream's own, `WDSTREAM_DEBUG=1` in the environment shows its traceback.
"""


def render() -> str:
    """The whole page: the group's help, then each command's, in the group's order."""
    import click

    from wdstream.cli.main import COMMANDS, main

    root = click.Context(main, info_name="wdstream", terminal_width=WIDTH,
                         max_content_width=WIDTH, **main.context_settings)
    parts = [HEADER, _section("wdstream", main.get_help(root))]
    for name in COMMANDS:
        command = main.get_command(root, name)
        if command is None:
            continue
        context = click.Context(command, info_name=name, parent=root)
        parts.append(_section(f"wdstream {name}", command.get_help(context)))
    return "\n".join(parts)


def _section(title: str, help_text: str) -> str:
    return f"## {title}\n\n```text\n{help_text.rstrip()}\n```\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
