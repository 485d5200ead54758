"""Checks of the shape of wdstream's code, as a table:

(a) functions of wdstream/ whose cyclomatic complexity (radon) is over 25;
(b) modules of wdstream/ that docs/architecture.md does not name exactly once: a module is
    named in its package's row of the table (the row whose first cell holds
    `wdstream/<package>/`; top-level modules: the "basics" row) as its file name in backquotes,
    `plan.py` (a subpackage's module as its path in the package, `cache/entry.py`), or as its
    path, `wdstream/stream/plan.py`; `__init__.py` is exempt;
(c) imports of wdstream's own modules inside functions (counted and listed, not a failure);
(d) imports, at the top of a module or inside a function, of a later layer: the layers are the
    table's rows in their order (the basics row first), and each may import only its own and
    earlier ones; the package's ``__init__.py`` (the public names, imported lazily) is exempt.

    python tools/code_shape.py [REPOSITORY]

Exits 1 if (a), (b) or (d) lists anything, else 0.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from radon.complexity import cc_visit

LIMIT = 25
BASICS = "basics"


def modules(package_root: Path) -> list[Path]:
    """wdstream's modules, sorted by path."""
    return sorted(package_root.rglob("*.py"))


def complex_functions(root: Path, package_root: Path) -> list[tuple[str, str, int]]:
    """(module, function, complexity) of each function over LIMIT."""
    rows = []
    for path in modules(package_root):
        for block in cc_visit(path.read_text()):  # functions, classes and their methods
            if block.letter != "C" and block.complexity > LIMIT:
                rows.append((f"{path.relative_to(root)}:{block.lineno}", block.fullname,
                             block.complexity))
    return rows


def table_rows(architecture: str) -> dict[str, str]:
    """The rows of the architecture table by package ("" for the basics row)."""
    rows = {}
    for line in architecture.splitlines():
        cells = line.split("|")
        if not line.startswith("| ") or len(cells) < 4:
            continue
        folder = re.search(r"`wdstream/(\w+)/`", cells[1])
        if folder:
            rows[folder.group(1)] = line
        elif cells[2].strip() == BASICS:
            rows[""] = line
    return rows


def naming_counts(root: Path, package_root: Path) -> list[tuple[str, int]]:
    """(module, times its row names it) of each module not named exactly once."""
    rows = table_rows((root / "docs" / "architecture.md").read_text())
    found = []
    for path in modules(package_root):
        if path.name == "__init__.py":
            continue
        parts = path.relative_to(package_root).parts
        package, short = (parts[0], "/".join(parts[1:])) if len(parts) > 1 else ("", path.name)
        named = re.findall(r"`([^`]+)`", rows.get(package, ""))
        full = path.relative_to(root).as_posix()
        count = sum(name in (short, full) for name in named)
        if count != 1:
            found.append((full, count))
    return found


def own_module(node: ast.Import | ast.ImportFrom) -> str | None:
    """The wdstream module an import statement names, if it names one."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level or module == "wdstream" or module.startswith("wdstream."):
            return "." * node.level + module
        return None
    names = [alias.name for alias in node.names
             if alias.name == "wdstream" or alias.name.startswith("wdstream.")]
    return ", ".join(names) or None


def imports_in_functions(root: Path, package_root: Path) -> list[tuple[str, str, str]]:
    """(module:line, function, imported module) of each import of wdstream's own modules
    inside a function."""
    found = []
    for path in modules(package_root):
        where = str(path.relative_to(root))
        found += [(f"{where}:{line}", function, module)
                  for line, function, module in function_imports(ast.parse(path.read_text()))]
    return found


def function_imports(node: ast.AST, function: str = ""):
    """(line, innermost function, module) of the imports of wdstream's modules below
    ``node`` that are inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from function_imports(child, child.name)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            module = own_module(child)
            if function and module:
                yield child.lineno, function, module
        else:
            yield from function_imports(child, function)


def layer_of(path: Path, package_root: Path) -> str:
    """The layer (package name, "" for the basics) of a module of wdstream/."""
    parts = path.relative_to(package_root).parts
    return parts[0] if len(parts) > 1 else ""


def upward_imports(root: Path, package_root: Path) -> list[tuple[str, str, str]]:
    """(module:line, its layer, imported module) of each import of a later layer."""
    order = list(table_rows((root / "docs" / "architecture.md").read_text()))
    rank = {layer: i for i, layer in enumerate(order)}
    found = []
    for path in modules(package_root):
        if path == package_root / "__init__.py":
            continue
        layer = layer_of(path, package_root)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in (own_module(node) or "").split(", "):
                parts = name.split(".")
                target = parts[1] if len(parts) > 2 else ""
                if name.startswith("wdstream.") and rank.get(target, -1) > rank.get(layer, 0):
                    found.append((f"{path.relative_to(root)}:{node.lineno}", layer or BASICS,
                                  name))
    return found


def table(title: str, header: tuple[str, ...], rows: list[tuple]) -> str:
    """A section of the report: its title with the count, and a plain-text table."""
    lines = [f"{title}: {len(rows)}"]
    if rows:
        cells = [tuple(map(str, row)) for row in [header, *rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                  .rstrip() for row in cells]
    return "\n".join(lines)


def report(root: Path) -> tuple[str, bool]:
    """The report's text, and whether the code has the shape asked for."""
    package_root = root / "wdstream"
    complex_rows = complex_functions(root, package_root)
    naming_rows = naming_counts(root, package_root)
    import_rows = imports_in_functions(root, package_root)
    upward_rows = upward_imports(root, package_root)
    text = "\n\n".join([
        table(f"(a) functions with a cyclomatic complexity over {LIMIT}",
              ("function at", "name", "complexity"), complex_rows),
        table("(b) modules docs/architecture.md names not exactly once in their row",
              ("module", "times named"), naming_rows),
        table("(c) imports of wdstream's own modules inside functions",
              ("import at", "function", "module"), import_rows),
        table("(d) imports of a later layer", ("import at", "layer", "module"), upward_rows),
    ])
    return text, not complex_rows and not naming_rows and not upward_rows


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    text, good = report(root)
    sys.stdout.write(text + "\n")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
