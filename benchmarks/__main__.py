"""``python -m benchmarks [--quick] [--only NAME ...]``: run the benchmarks, print one table per
benchmark, and write ``docs/benchmarks-results.md``.

A benchmark is a module of this package with ``run(quick: bool) -> list[dict]`` (one dict per
row; the keys are the columns, in order of first appearance). Optional conventions:

- a row's ``"table"`` key splits a benchmark's rows into several tables with that caption;
- a row holding only ``"table"`` and ``"note"`` is printed as a note under its table;
- a module's ``TITLE`` is the benchmark's heading and its docstring's first line its summary.

Rewriting the results file keeps the sections of benchmarks that were not run this time
(``--only``), so that one benchmark can be refreshed alone; nothing else of the old file is
kept (what a run was compared with belongs in its commit, decisions in docs/decisions.md).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path

from . import common

BENCHMARKS = ("pack", "read", "mosaic", "link", "manifest", "resume", "llm", "compressed",
              "raw_files", "axolotl_configs", "axolotl_packing")
RESULTS = common.REPO / "docs" / "benchmarks-results.md"
HIDDEN = {"table", "note"}


# --------------------------------------------------------------------------- formatting


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        size = abs(value)
        if size >= 1000:
            return f"{value:,.0f}"
        if size >= 100:
            return f"{value:.0f}"
        if size >= 10:
            return f"{value:.1f}"
        if size >= 0.1 or size == 0:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def tables(rows: list[dict]) -> list[tuple[str, list[str], list[dict], list[str]]]:
    """Group rows into (caption, columns, rows, notes) in order of first appearance; columns
    that are empty in every row of a table are left out."""
    groups: dict[str, tuple[list[str], list[dict], list[str]]] = {}
    for row in rows:
        caption = str(row.get("table", ""))
        columns, members, notes = groups.setdefault(caption, ([], [], []))
        if set(row) <= HIDDEN and "note" in row:
            notes.append(str(row["note"]))
            continue
        members.append(row)
        for key in row:
            if key not in HIDDEN and key not in columns:
                columns.append(key)
    out = []
    for caption, (columns, members, notes) in groups.items():
        kept = [c for c in columns if any(r.get(c) not in (None, "") for r in members)]
        out.append((caption, kept, members, notes))
    return out


def markdown_table(columns: list[str], rows: list[dict]) -> str:
    def cell(value) -> str:
        return fmt(value).replace("|", "\\|").replace("\n", " ")

    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)
               for c in columns]
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def run_alone(name: str, title: str, run, argv: list[str] | None = None) -> int:
    """One benchmark module run by itself (``python -m benchmarks.NAME [--quick]``): its
    tables on stdout, no results file."""
    argv = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    print_tables(name, title, run("--quick" in argv), time.monotonic() - started)
    return 0


def print_tables(name: str, title: str, rows: list[dict], seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.rule(f"[bold]{title}[/] ({name}, {seconds:.0f} s)")
    for caption, columns, members, notes in tables(rows):
        if members:
            table = Table(title=caption or None, title_justify="left", show_lines=False)
            for column in columns:
                numeric = all(isinstance(r.get(column), (int, float)) or r.get(column) is None
                              for r in members)
                table.add_column(column, justify="right" if numeric else "left",
                                 overflow="fold")
            for row in members:
                cells = [fmt(row.get(c)) for c in columns]
                style = None
                if row.get("met") == "no" or row.get("error"):
                    style = "red"
                elif row.get("met") == "yes":
                    style = "green"
                table.add_row(*cells, style=style)
            console.print(table)
        elif caption:
            console.print(f"[bold]{caption}[/]")
        for note in notes:
            console.print(f"  [dim]{note}[/]")


# --------------------------------------------------------------------------- the results file


def busy_seconds() -> tuple[float, float]:
    """CPU seconds so far: the machine's (user, nice and system time from /proc/stat; the
    kernel's interrupt work and the hypervisor's steal left out) and the suite's own (this
    process and the children it reaped: the cases, their DataLoader workers, the servers)."""
    machine = common.machine_cpu()
    mine = os.times()
    return (machine["user"] + machine["nice"] + machine["system"],
            mine.user + mine.system + mine.children_user + mine.children_system)


def others_cpu(before: tuple[float, float], seconds: float) -> str:
    """How quiet the machine was since ``before`` (``busy_seconds()``): the CPU time other
    processes took, in seconds and as a share of the machine's cores."""
    machine, suite = (after - start for after, start in zip(busy_seconds(), before,
                                                            strict=True))
    others = max(0.0, machine - suite)
    share = others / (seconds * (os.cpu_count() or 1)) if seconds > 0 else 0.0
    return f"other processes {others:.1f} CPU s ({share:.1%} of the machine)"


def section(name: str, title: str, summary: str, rows: list[dict], took: str,
            quick: bool, when: str) -> str:
    parts = [f"<!-- benchmark:{name} -->", f"## {title}", ""]
    if summary:
        parts += [summary, ""]
    parts += [f"`python -m benchmarks --only {name}{' --quick' if quick else ''}`: "
              f"{'quick sizes' if quick else 'full sizes'}, {common.RUNS} run(s) per case, "
              f"medians; {when}; {took}.", ""]
    for caption, columns, members, notes in tables(rows):
        if caption:
            parts += [f"**{caption}**", ""]
        if members:
            parts += [markdown_table(columns, members), ""]
        for note in notes:
            parts += [f"- {note}"]
        if notes:
            parts.append("")
    parts.append(f"<!-- /benchmark:{name} -->")
    return "\n".join(parts)


def existing_sections(text: str) -> dict[str, str]:
    sections = {}
    for name in BENCHMARKS:
        start = text.find(f"<!-- benchmark:{name} -->")
        end = text.find(f"<!-- /benchmark:{name} -->")
        if start >= 0 and end > start:
            sections[name] = text[start: end + len(f"<!-- /benchmark:{name} -->")]
    return sections


def machine_lines(info: dict) -> list[str]:
    versions = ", ".join(f"{k} {info[k]}" for k in (
        "torch", "webdataset", "wdstream", "numpy", "boto3", "s3fs", "moto", "orjson",
        "datasets", "litdata", "mosaicml-streaming", "psutil"))
    return [
        f"- Date: {info['date']}",
        f"- Machine: {info['cpus']} CPUs ({info['cpu']}), {info['memory']} RAM, {info['os']}",
        f"- Load average when the run started: {info['load']}",
        f"- Memory: {info['memory_settings']}",
        f"- Python {info['python']}; {versions}",
        f"- wdstream source: {info['source']}",
    ]


def write_results(path: Path, info: dict, sections: dict[str, str], quick: bool,
                  ran: list[str]) -> None:
    text = path.read_text() if path.exists() else ""
    old = existing_sections(text)
    merged = {**old, **sections}
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python -m benchmarks` (`tox -e bench`); do not edit by hand. Figures "
        "are medians of interleaved runs; compare ratios of one run, not absolute figures "
        "across runs. How to run it and what each table measures: "
        "[Benchmarks](benchmarks.md).",
        "",
        f"Last run: {', '.join(ran)} ({'quick' if quick else 'full'} sizes).",
        "",
        *machine_lines(info),
        "",
    ]
    for name in BENCHMARKS:
        if name in merged:
            lines += [merged[name], ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")


# --------------------------------------------------------------------------- main


def available() -> list[str]:
    return [n for n in BENCHMARKS if importlib.util.find_spec(f"{__package__}.{n}") is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: the whole suite in a "
                        "few minutes")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=BENCHMARKS,
                        help=f"run only these benchmarks ({', '.join(BENCHMARKS)})")
    parser.add_argument("--runs", type=int, default=None,
                        help=f"runs per case (default {common.RUNS}; 1 with --quick)")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help=f"results file (default {RESULTS.relative_to(common.REPO)})")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.runs is None and args.quick:
        args.runs = 1  # quick is a smoke run: one run per case
    if args.runs is not None:
        if args.runs < 1:
            parser.error("--runs must be at least 1")
        common.RUNS = args.runs
        os.environ["WDSTREAM_BENCH_RUNS"] = str(args.runs)  # for benchmarks run as children

    present = available()
    wanted = args.only or list(BENCHMARKS)
    missing = [n for n in wanted if n not in present]
    for name in missing:
        common.log(f"benchmark {name!r}: no module benchmarks/{name}.py here; skipped")
    info = common.machine()
    info["load"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    sections, failed = {}, []
    for name in (n for n in wanted if n in present):
        started = time.monotonic()
        when = (f"{common.machine_date()}, load average "
                f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at its start, "
                f"{common.memory_settings()}")
        common.log(f"benchmark {name}: starting ({'quick' if args.quick else 'full'} sizes)")
        cpu = busy_seconds()
        module = importlib.import_module(f"{__package__}.{name}")
        title = getattr(module, "TITLE", name)
        summary = (module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        try:
            rows = list(module.run(args.quick))
        except Exception:  # one benchmark's failure does not stop the others
            failed.append(name)
            rows = [{"error": traceback.format_exc().strip().splitlines()[-1]}]
            traceback.print_exc()
        seconds = time.monotonic() - started
        print_tables(name, title, rows, seconds)
        took = f"took {seconds:.0f} s, {others_cpu(cpu, seconds)}"
        sections[name] = section(name, title, summary, rows, took, args.quick, when)
    if sections and not args.no_write:
        write_results(args.output, info, sections, args.quick, list(sections))
        common.log(f"results written to {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
