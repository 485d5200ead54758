"""MkDocs hooks (see mkdocs.yml):

- pages named in ``nav`` that do not exist yet are dropped from the navigation (with a note),
  so a page still being written elsewhere does not fail ``mkdocs build --strict``;
- ``cli.md`` and ``api.md`` are not files in the repository: the build renders them, with
  ``docs/gen_cli.py`` from the click commands and ``docs/gen_api.py`` from the public entry
  points' docstrings, so they cannot be stale; an entry point whose ``Args:`` misses or
  invents a parameter is a warning, which fails a strict build;
- ``benchmarks.md`` gets the figures of the last ``tox -e bench`` run
  (``docs/benchmarks-results.md``, written by the benchmark suite) at its
  ``<!-- benchmark-results -->`` marker.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.wdstream")

# page rendered by the build -> the module in docs/ whose render() writes it
GENERATED = {"cli.md": "gen_cli", "api.md": "gen_api"}

RESULTS_MARKER = "<!-- benchmark-results -->"
RESULTS_FILE = "benchmarks-results.md"


def _existing(nav, docs_dir: str):
    kept = []
    for item in nav:
        if isinstance(item, dict):
            (title, target), = item.items()
            if isinstance(target, list):
                children = _existing(target, docs_dir)
                if children:
                    kept.append({title: children})
                continue
            item_path = target
        else:
            title, item_path = None, item
        if ("://" in item_path or item_path in GENERATED
                or os.path.exists(os.path.join(docs_dir, item_path))):
            kept.append(item)
        else:
            log.info("nav: %s (%s) does not exist yet; left out", item_path, title)
    return kept


def on_config(config):
    if config.get("nav"):
        config["nav"] = _existing(config["nav"], config["docs_dir"])
    return config


def _generator(docs_dir: str, name: str):
    """The module ``docs/<name>.py``, imported from the docs folder."""
    sys.path.insert(0, docs_dir)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(docs_dir)


def on_files(files, config):
    for page, name in GENERATED.items():
        module = _generator(config["docs_dir"], name)
        for problem in getattr(module, "problems", list)():
            log.warning("docstring Args: %s", problem)
        stale = files.get_file_from_path(page)
        if stale is not None:
            log.warning("docs/%s is rendered by the build: remove the file", page)
            files.remove(stale)
        files.append(File.generated(config, page, content=module.render()))
    return files


def on_page_markdown(markdown, page, config, files):
    if RESULTS_MARKER not in markdown:
        return markdown
    path = os.path.join(config["docs_dir"], RESULTS_FILE)
    if os.path.exists(path):
        results = open(path, encoding="utf-8").read()
    else:
        results = ("*No figures recorded yet: run `tox -e bench` (it writes "
                   f"`docs/{RESULTS_FILE}`, shown here).*")
    return markdown.replace(RESULTS_MARKER, results)
