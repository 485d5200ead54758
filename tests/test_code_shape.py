"""The shape of wdstream's code (tools/code_shape.py, run as a script): no function with a
cyclomatic complexity over 25, one row per module in docs/architecture.md's module table and
no row for a module that is not there, and no import of a later layer than the module's own.
The tool itself is checked on small trees of its own here first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "code_shape.py"

ARCHITECTURE = """# Architecture

| layer / module | what it holds |
| --- | --- |
| `wdstream/` | basics |
| `errors.py` | exception classes |
| `wdstream/stream/` | reading while training |
| `plan.py` | the epoch plan, not `window.py` |
"""

BRANCHY = "def branchy(x):\n" + "".join(
    f"    if x == {i}:\n        return {i}\n" for i in range(30)) + "    return -1\n"


def run_tool(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), str(root)], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A repository of the shape the tool reads: a package and its architecture page."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(ARCHITECTURE)
    stream = tmp_path / "wdstream" / "stream"
    stream.mkdir(parents=True)
    (tmp_path / "wdstream" / "__init__.py").write_text("")
    (tmp_path / "wdstream" / "errors.py").write_text("class WdstreamError(Exception):\n    pass\n")
    (stream / "__init__.py").write_text("")
    (stream / "plan.py").write_text("def plan():\n    from wdstream.errors import WdstreamError\n"
                                    "    return WdstreamError\n")
    return tmp_path


def test_a_tree_of_the_right_shape_passes_and_lists_its_imports(tree):
    result = run_tool(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "complexity over 25: 0" in result.stdout
    assert "exactly one row in docs/architecture.md's table: 0" in result.stdout
    assert "inside functions: 1" in result.stdout
    assert "wdstream/stream/plan.py:2" in result.stdout and "wdstream.errors" in result.stdout


def test_a_complex_function_or_a_module_the_page_misses_fails(tree):
    (tree / "wdstream" / "stream" / "window.py").write_text(BRANCHY)
    (tree / "wdstream" / "sizes.py").write_text("")
    result = run_tool(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "complexity over 25: 1" in result.stdout
    assert "branchy" in result.stdout and "31" in result.stdout
    assert "exactly one row in docs/architecture.md's table: 2" in result.stdout
    assert "wdstream/stream/window.py" in result.stdout and "wdstream/sizes.py" in result.stdout


def test_a_module_with_two_rows_or_a_row_of_no_module_fails(tree):
    page = tree / "docs" / "architecture.md"
    page.write_text(page.read_text() + "| `plan.py` | again |\n| `gone.py` | removed |\n")
    result = run_tool(tree)
    assert result.returncode == 1
    assert "wdstream/stream/plan.py  2" in result.stdout
    assert "wdstream/stream/gone.py  no such module" in result.stdout


def test_an_import_of_a_later_layer_fails(tree):
    """The basics row comes first: a basics module importing stream/ climbs a layer, at the
    top of the module or inside a function alike; stream/ importing the basics does not."""
    (tree / "wdstream" / "sizes.py").write_text("def size():\n    from wdstream.stream.plan "
                                                "import plan\n    return plan\n")
    page = tree / "docs" / "architecture.md"
    page.write_text(page.read_text().replace("| `wdstream/stream/`",
                                             "| `sizes.py` | sizes |\n| `wdstream/stream/`"))
    result = run_tool(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "imports of a later layer: 1" in result.stdout
    assert "wdstream/sizes.py:2" in result.stdout and "wdstream.stream.plan" in result.stdout


def test_a_subpackage_is_a_layer_of_its_own(tree):
    """A subpackage with a layer row comes after the rows above it: its modules may import
    those of its parent's layer, not the reverse."""
    load = tree / "wdstream" / "stream" / "load"
    load.mkdir()
    (load / "__init__.py").write_text("")
    (load / "loader.py").write_text("from wdstream.stream.plan import plan\n")
    page = tree / "docs" / "architecture.md"
    page.write_text(page.read_text() + "| `wdstream/stream/load/` | the loader |\n"
                    "| `loader.py` | the DataLoader |\n")
    assert run_tool(tree).returncode == 0
    (tree / "wdstream" / "stream" / "plan.py").write_text(
        "from wdstream.stream.load.loader import plan\n")
    result = run_tool(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "imports of a later layer: 1" in result.stdout
    assert "wdstream/stream/plan.py:1  wdstream/stream/" in result.stdout


def test_wdstream_has_the_shape_asked_for():
    result = run_tool(ROOT)
    assert result.returncode == 0, "tools/code_shape.py:\n" + result.stdout + result.stderr
