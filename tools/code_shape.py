"""Checks of the shape of wdstream's code, as a table:

(a) functions of wdstream/ whose cyclomatic complexity (radon) is over 25;
(b) modules of wdstream/ that the module table of docs/architecture.md does not give exactly
    one row, and rows that name no module. The table is a run of layers, each a row whose
    first cell is its folder, `wdstream/stream/plan/` (the basics: `wdstream/`), followed by
    one row per module, whose first cell is the module's path in that folder, `epoch.py`
    (`cache/entry.py` in `wdstream/sources/`); a module belongs to the innermost layer
    folder holding it; `__init__.py` is exempt;
(c) imports of wdstream's own modules inside functions (counted and listed, not a failure);
(d) imports, at the top of a module or inside a function, of a later layer: the layers are
    the table's layer rows in their order (the basics first), and each may import only its
    own and earlier ones; the package's ``__init__.py`` (the public names, imported lazily)
    is exempt.

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


def module_map(architecture: str) -> dict[str, list[str]]:
    """The module table's layers in order, each folder (``wdstream/``, ``wdstream/stream/plan/``)
    with the module paths its rows name, one per row."""
    layers: dict[str, list[str]] = {}
    current = None
    for line in architecture.splitlines():
        cells = line.split("|")
        if not line.startswith("| ") or len(cells) < 3:
            continue
        name = re.fullmatch(r"\**`([^`]+)`\**", cells[1].strip())
        if not name:
            continue
        if name.group(1).startswith("wdstream/") and name.group(1).endswith("/"):
            current = layers.setdefault(name.group(1), [])
        elif current is not None and name.group(1).endswith(".py"):
            current.append(name.group(1))
    return layers


def layer_of(path: str, layers) -> str:
    """The innermost layer folder holding ``path`` (a path from the repository's root, of a
    module or a package: ``wdstream/stream/plan/epoch.py``, ``wdstream/stream/plan/``)."""
    holding = [folder for folder in layers if path.startswith(folder)]
    return max(holding, key=len, default="wdstream/")


def naming_counts(root: Path, package_root: Path) -> list[tuple[str, object]]:
    """(module, rows naming it) of each module not named by exactly one row of its layer,
    and (path, "no such module") of each row naming none."""
    layers = module_map((root / "docs" / "architecture.md").read_text())
    found: list[tuple[str, object]] = []
    named = {folder + name for folder, names in layers.items() for name in names}
    for path in modules(package_root):
        full = path.relative_to(root).as_posix()
        named.discard(full)
        if path.name == "__init__.py":
            continue
        folder = layer_of(full, layers)
        count = layers.get(folder, []).count(full[len(folder):])
        if count != 1:
            found.append((full, count))
    return found + [(path, "no such module") for path in sorted(named)]


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


def upward_imports(root: Path, package_root: Path) -> list[tuple[str, str, str]]:
    """(module:line, its layer, imported module) of each import of a later layer."""
    layers = module_map((root / "docs" / "architecture.md").read_text())
    rank = {folder: i for i, folder in enumerate(layers)}
    found = []
    for path in modules(package_root):
        if path == package_root / "__init__.py":
            continue
        layer = layer_of(path.relative_to(root).as_posix(), layers)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in (own_module(node) or "").split(", "):
                if not name.startswith("wdstream."):
                    continue
                target = layer_of(name.replace(".", "/") + "/", layers)
                if rank.get(target, -1) > rank.get(layer, 0):
                    found.append((f"{path.relative_to(root)}:{node.lineno}", layer, name))
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
        table("(b) modules without exactly one row in docs/architecture.md's table",
              ("module", "rows naming it"), naming_rows),
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
