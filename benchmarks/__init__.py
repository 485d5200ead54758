"""wdstream's benchmark suite: ``python -m benchmarks [--quick] [--only NAME]`` (or ``tox -e bench``).

Each benchmark is a module here with ``run(quick: bool) -> list[dict]``: one dict per table row.
``benchmarks/__main__.py`` runs every module present (``pack``, ``read``, ``resume``, ``llm``),
prints a table per benchmark and writes ``docs/benchmarks-results.md``. ``benchmarks/common.py``
holds the shared helpers: timing (median of runs), cases run in fresh subprocesses with their
peak memory measured, data generation and a local S3 (moto) server.
"""
