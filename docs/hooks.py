"""MkDocs hooks (see mkdocs.yml):

- pages named in ``nav`` that do not exist yet are dropped from the navigation (with a note),
  so a page still being written elsewhere does not fail ``mkdocs build --strict``;
- ``cli.md`` must equal what ``docs/gen_cli.py`` renders from the click commands, and
  ``api.md`` what ``docs/gen_api.py`` renders from the public entry points' docstrings (each
  parameter in its ``Args:``): a stale page is a warning, which fails a strict build;
- ``benchmarks.md`` gets the figures of the last ``tox -e bench`` run
  (``docs/benchmarks-results.md``, written by the benchmark suite) at its
  ``<!-- benchmark-results -->`` marker.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

log = logging.getLogger("mkdocs.hooks.wdstream")

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
        if "://" in item_path or os.path.exists(os.path.join(docs_dir, item_path)):
            kept.append(item)
        else:
            log.info("nav: %s (%s) does not exist yet; left out", item_path, title)
    return kept


def on_config(config):
    if config.get("nav"):
        config["nav"] = _existing(config["nav"], config["docs_dir"])
    return config


def on_pre_build(config):
    docs_dir = config["docs_dir"]
    _check_generated(docs_dir, "gen_cli", "cli.md", "the click commands")
    gen_api = _check_generated(docs_dir, "gen_api", "api.md", "the docstrings")
    for problem in gen_api.problems():
        log.warning("docstring Args: %s", problem)


def _check_generated(docs_dir: str, generator: str, page: str, source: str):
    """Warn when ``docs/<page>`` is not what ``docs/<generator>.py`` renders from
    ``source``; the generator module, imported from the docs folder."""
    sys.path.insert(0, docs_dir)
    try:
        module = importlib.import_module(generator)
    finally:
        sys.path.remove(docs_dir)
    path = os.path.join(docs_dir, page)
    current = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    if current != module.render():
        log.warning("docs/%s is not what %s say: run `python docs/%s.py`", page, source,
                    generator)
    return module


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
