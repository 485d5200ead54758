"""Render the API reference page (api.md) from the docstrings of wdstream's public entry
points, so it cannot drift from the code.

The docs build (docs/hooks.py) renders the page into the site; it is not a file in the
repository. ``python docs/gen_api.py`` prints it, and exits 1 if an entry point's ``Args:``
misses or invents a parameter (tests/test_docs.py and a strict build fail on that too).

The sources are read with ``ast``, not imported: the docs build installs neither torch nor
the cloud SDKs.
"""

from __future__ import annotations

import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (public name, module file, qualified name in it), in the page's order
ENTRY_POINTS = (
    ("wdstream.StreamingDataset", "wdstream/stream/load/dataset.py", "StreamingDataset"),
    ("wdstream.DataLoader", "wdstream/stream/load/loader.py", "DataLoader"),
    ("wdstream.DataLoader.state_dict", "wdstream/stream/load/loader.py", "DataLoader.state_dict"),
    ("wdstream.DataLoader.load_state_dict", "wdstream/stream/load/loader.py",
     "DataLoader.load_state_dict"),
    ("wdstream.collate", "wdstream/stream/transfer/batching.py", "collate"),
    ("wdstream.Limits", "wdstream/limits.py", "Limits"),
    ("wdstream.Mix", "wdstream/stages/mix.py", "Mix"),
    ("wdstream.PackedSequences", "wdstream/stages/sequences.py", "PackedSequences"),
    ("wdstream.from_config", "wdstream/stages/config/build.py", "from_config"),
    ("wdstream.pack", "wdstream/write/packer.py", "pack"),
    ("wdstream.Manifest", "wdstream/shards/manifest.py", "Manifest"),
    ("wdstream.parse_size", "wdstream/sizes.py", "parse_size"),
    ("wdstream.format_size", "wdstream/sizes.py", "format_size"),
    ("wdstream.integrations.hf_trainer.use_loader", "wdstream/integrations/hf_trainer.py",
     "use_loader"),
    ("wdstream.integrations.accelerate.prepare_loader", "wdstream/integrations/accelerate.py",
     "prepare_loader"),
    ("wdstream.integrations.hf_datasets.to_iterable_dataset",
     "wdstream/integrations/hf_datasets.py", "to_iterable_dataset"),
    ("wdstream.integrations.checkpoint.save_loader_state",
     "wdstream/integrations/checkpoint.py", "save_loader_state"),
    ("wdstream.integrations.checkpoint.load_loader_state",
     "wdstream/integrations/checkpoint.py", "load_loader_state"),
)

HEADER = """# API reference

<!-- Rendered by docs/gen_api.py from the docstrings when the docs are built. -->

The public entry points, each with its signature and its arguments. How they fit together:
[concepts](concepts.md), [training](training.md), [LLM training](llm.md).
"""

ERRORS = "wdstream/errors.py"
ERRORS_TEXT = ("Every error wdstream raises derives from `wdstream.WdstreamError` and names the "
               "URL, file and line, record or key; messages and their fixes: "
               "[Troubleshooting](troubleshooting.md).")

ENTRY = re.compile(r"^(\*{0,2}\w+)(?: \(([^)]*(?:\([^)]*\)[^)]*)*)\))?:(?: (.*))?$")


def _node(tree: ast.Module, qualname: str):
    scope = tree.body
    node = None
    for part in qualname.split("."):
        node = next(n for n in scope if isinstance(n, ast.ClassDef | ast.FunctionDef)
                    and n.name == part)
        scope = node.body
    return node


def _parameters(node) -> list[tuple[str, str]]:
    """(name, the signature's text for it) of a function, a class's ``__init__`` or a
    dataclass's fields; ``self`` left out."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef)
                     and n.name == "__init__"), None)
        if init is None:  # a dataclass: its annotated fields
            return [(n.target.id, n.target.id + (f"={ast.unparse(n.value)}" if n.value else ""))
                    for n in node.body if isinstance(n, ast.AnnAssign)]
        node = init
    args = node.args
    out: list[tuple[str, str]] = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults, strict=True):
        out.append((arg.arg, arg.arg + (f"={ast.unparse(default)}" if default else "")))
    if args.vararg is not None:
        out.append(("*" + args.vararg.arg, "*" + args.vararg.arg))
    elif args.kwonlyargs:
        out.append(("*", "*"))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append((arg.arg, arg.arg + (f"={ast.unparse(default)}" if default else "")))
    if args.kwarg is not None:
        out.append(("**" + args.kwarg.arg, "**" + args.kwarg.arg))
    return [(name, text) for name, text in out if name not in ("self", "cls")]


def _sections(doc: str) -> tuple[str, list[tuple[str, str, str]], str]:
    """The text before ``Args:``, its entries (name, type and default, description) and the
    text after it."""
    lines = doc.splitlines()
    if "Args:" not in lines:
        return doc, [], ""
    start = lines.index("Args:")
    blocks: list[str] = []  # an entry's lines joined: it starts at an indent of 4
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
        line = lines[end]
        if line.startswith("    ") and line[4] != " ":
            blocks.append(line.strip())
        elif line.strip() and blocks:
            blocks[-1] += " " + line.strip()
        end += 1
    entries = []
    for block in blocks:
        match = ENTRY.match(block)
        if match is None:
            raise ValueError(f"an Args entry that is not 'name (type): text': {block!r}")
        entries.append((match.group(1), match.group(2) or "", match.group(3) or ""))
    return "\n".join(lines[:start]).strip(), entries, "\n".join(lines[end:]).strip()


def _markdown(text: str) -> str:
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _markdown(text).replace("|", "\\|")


def entry_points():
    """(public name, signature, docstring, parameter names) of each entry point."""
    trees: dict[str, ast.Module] = {}
    for name, path, qualname in ENTRY_POINTS:
        if path not in trees:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                trees[path] = ast.parse(f.read())
        node = _node(trees[path], qualname)
        parameters = _parameters(node)
        signature = f"{qualname.rsplit('.', 1)[-1]}({', '.join(t for _n, t in parameters)})"
        names = [n for n, _t in parameters if n != "*"]
        yield name, signature, ast.get_docstring(node) or "", names


def _read(path: str) -> ast.Module:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read())


def error_classes():
    """(public name, base classes, docstring) of each exception class of ``wdstream/errors.py``
    in its order: ``wdstream.X`` when the package exports it, else ``wdstream.errors.X``."""
    exported: set[str] = set()
    for node in _read("wdstream/__init__.py").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            exported = set(ast.literal_eval(node.value))
    for node in _read(ERRORS).body:
        if isinstance(node, ast.ClassDef):
            name = f"wdstream.{node.name}" if node.name in exported else \
                f"wdstream.errors.{node.name}"
            yield name, [ast.unparse(b) for b in node.bases], ast.get_docstring(node) or ""


def problems() -> list[str]:
    """Each entry point's parameters that its ``Args:`` leaves out, and entries naming no
    parameter."""
    found = []
    for name, _signature, doc, parameters in entry_points():
        _before, entries, _after = _sections(doc)
        documented = [e[0] for e in entries]
        found += [f"{name}: no Args entry for {p}" for p in parameters if p not in documented]
        found += [f"{name}: Args names {d}, not a parameter" for d in documented
                  if d not in parameters]
    return found


def render() -> str:
    parts = [HEADER]
    for name, signature, doc, _parameters in entry_points():
        before, entries, after = _sections(doc)
        parts += [f"## `{name}`", "", "```python", signature, "```", "", _markdown(before), ""]
        if entries:
            parts += ["| argument | type, default | what it does |", "| --- | --- | --- |"]
            parts += [f"| `{n}` | {_cell(kind)} | {_cell(text)} |" for n, kind, text in entries]
            parts.append("")
        if after:
            parts += [_markdown(after), ""]
    parts += ["## Errors", "", ERRORS_TEXT, "", "| class | is a | meaning |", "| --- | --- | --- |"]
    parts += [f"| `{name}` | {', '.join(f'`{b}`' for b in bases)} | {_cell(' '.join(doc.split()))} |"
              for name, bases, doc in error_classes()]
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    found = problems()
    for problem in found:
        sys.stderr.write(problem + "\n")
    sys.stdout.write(render())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
