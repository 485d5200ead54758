"""The documentation cannot rot: its code is run, the CLI and API references are rendered from
the code when the site is built, the site builds.

How code blocks in docs/*.md and README.md are treated (the marker is an HTML comment on the
line just before the block's opening fence):

- ```python blocks run, in page order, in one interpreter per page (later blocks see what
  earlier ones defined), on the pages in RUN_BY_DEFAULT; elsewhere (architecture.md, pages
  written as API sketches) only blocks marked ``<!-- run -->`` run.
- ``<!-- skip -->`` (or ``<!-- skip: why -->``) never runs the block.
- ``<!-- requires: module -->`` runs it only if ``module`` imports.
- ``<!-- file: NAME -->`` writes the block to NAME in the page's folder instead of running it
  (a script that a later block runs, e.g. under torchrun).
- ```sh / ```bash blocks run only when marked ``<!-- run -->`` (``<!-- run exit=1 -->`` when
  the commands are expected to fail), with ``bash -e -o pipefail``.

Each page runs in a fresh copy of a folder holding the files the docs use (``data.jsonl``,
``captions.csv``, ``data.tsv``, ``table.parquet``, ``photos/``), with the environment pointed
at a moto S3 server where ``s3://bucket/prefix/`` is a dataset of 200 samples, each a ``.txt``
document and a ``.json`` record ``{"id", "label"}``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.shards.tar_writer import TarWriter

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUN_BY_DEFAULT = {"README.md", "index.md", "concepts.md", "packing.md", "cloud.md",
                  "training.md", "resume.md", "troubleshooting.md", "benchmarks.md",
                  "accelerate.md", "hf-trainer.md", "hf-datasets.md", "lightning.md"}
PAGE_TIMEOUT = 240

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def code_blocks(path: Path) -> list[dict]:
    """``{"lang", "code", "marker", "line"}`` for each fenced block of a Markdown file."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        previous = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        marker = _MARKER.match(previous)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        blocks.append({"lang": fence.group(1), "code": "\n".join(lines[i + 1:end]) + "\n",
                       "marker": marker.group(1) if marker else "", "line": i + 1})
        i = end + 1
    return blocks


def steps_of(path: Path) -> list[dict]:
    """What to do with each block of a page: run python, run sh, write a file, or nothing."""
    steps = []
    by_default = path.name in RUN_BY_DEFAULT
    for block in code_blocks(path):
        marker, lang = block["marker"], block["lang"]
        where = f"{path.name}:{block['line']}"
        if marker.startswith("skip"):
            continue
        if marker.startswith("file:"):
            steps.append({"kind": "file", "name": marker[5:].strip(), "code": block["code"],
                          "where": where})
            continue
        if marker.startswith("requires:"):
            if importlib.util.find_spec(marker[9:].strip()) is None:
                continue
            marker = "run"
        run = marker.startswith("run")
        if lang == "python" and (by_default or run):
            steps.append({"kind": "python", "code": block["code"], "where": where})
        elif lang in ("sh", "bash") and run:
            expected = re.search(r"exit=(\d+)", marker)
            steps.append({"kind": "sh", "code": block["code"], "where": where,
                          "exit": int(expected.group(1)) if expected else 0})
    return steps


DRIVER = textwrap.dedent("""
    import json, subprocess, sys, time
    steps = json.load(open(sys.argv[1]))
    start = time.monotonic()
    namespace = {"__name__": "__main__"}
    for step in steps:
        print(f"=== {step['where']} ({step['kind']}) at {time.monotonic() - start:.1f} s",
              flush=True)
        if step["kind"] == "file":
            with open(step["name"], "w") as f:
                f.write(step["code"])
        elif step["kind"] == "python":
            exec(compile(step["code"], step["where"], "exec"), namespace)
        else:
            status = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["code"]]).returncode
            if status != step["exit"]:
                sys.exit(f"{step['where']}: exit status {status}, expected {step['exit']}")
""")


# --------------------------------------------------------------------------- the environment


def _docs_dataset(folder: Path, shards: int = 4, per_shard: int = 50) -> None:
    """Shards of samples with a .txt document and a .json record, and index.json."""
    infos = []
    folder.mkdir(parents=True)
    for shard in range(shards):
        buffer = io.BytesIO()
        writer = TarWriter(buffer)
        for i in range(per_shard):
            n = shard * per_shard + i
            key = f"doc{n:06d}"
            writer.add(f"{key}.json", json.dumps({"id": key, "label": n % 2}).encode())
            writer.add(f"{key}.txt", ("lorem ipsum " * (1 + n % 40)).encode())
        writer.close()
        data = buffer.getvalue()
        name = f"shard-{shard:06d}.tar"
        (folder / name).write_bytes(data)
        infos.append(ShardInfo(name, per_shard, len(data), hashlib.sha256(data).hexdigest()))
    (folder / "index.json").write_text(Manifest(infos, extensions=["json", "txt"]).to_json())


def _input_files(folder: Path) -> None:
    """The files the packing examples read."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "data.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"id": f"doc{i:06d}", "text": "word " * (1 + i % 50)}) + "\n")
    (folder / "captions.csv").write_text("id,caption,label\nimg1,a cat,1\nimg2,a dog,0\n")
    (folder / "data.tsv").write_text("id\ttext\nr1\thello\n")
    photos = folder / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"JPEGDATA")
    (photos / "cat.json").write_text('{"label": 1}\n')
    (photos / "dog.jpg").write_bytes(b"JPEG2")
    (photos / "dog.json").write_text('{"label": 0}\n')
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"],
                             "image": [b"\x00\x01", b"\x02"]}), folder / "table.parquet")


@pytest.fixture(scope="module")
def docs_env(moto_server, tmp_path_factory):
    """(template folder, environment) for running the docs' code."""
    base = tmp_path_factory.mktemp("docs")
    dataset = base / "prefix"
    _docs_dataset(dataset)
    client = moto_server.client()
    if "bucket" not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket="bucket")
    for path in sorted(dataset.iterdir()):
        client.put_object(Bucket="bucket", Key=f"prefix/{path.name}", Body=path.read_bytes())
    template = base / "template"
    _input_files(template)
    env = {**os.environ, **moto_server.env}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("WDSTREAM_OPENER", None)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONWARNINGS"] = "ignore"
    return template, env


# The slowest page (torchrun, Hugging Face Trainer) starts first: it is the critical path.
RUNNABLE = sorted((p for p in pages() if steps_of(p)), key=lambda p: p.name != "training.md")


@pytest.fixture(scope="module")
def page_runs(docs_env, tmp_path_factory):
    """Every page's code, run two pages at a time (most of the time is importing torch and
    starting workers); maps the page name to (exit status, output)."""
    template, env = docs_env

    def run(page: Path):
        for step in steps_of(page):
            if step["kind"] == "python":
                try:
                    compile(step["code"], step["where"], "exec")
                except SyntaxError as error:
                    return 1, f"{step['where']}: {error}"
        folder = tmp_path_factory.mktemp(page.stem)
        shutil.copytree(template, folder, dirs_exist_ok=True)
        (folder / "steps.json").write_text(json.dumps(steps_of(page)))
        (folder / "driver.py").write_text(DRIVER)
        try:
            result = subprocess.run([sys.executable, "driver.py", "steps.json"], cwd=folder,
                                    env=env, capture_output=True, text=True,
                                    timeout=PAGE_TIMEOUT)
        except subprocess.TimeoutExpired as error:
            return -1, f"timed out after {PAGE_TIMEOUT} s\n{error.stdout}\n{error.stderr}"
        return result.returncode, result.stdout + "\n" + result.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([p.name for p in RUNNABLE], pool.map(run, RUNNABLE), strict=True))


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
@pytest.mark.slow
def test_code_in_page_runs(page, page_runs):
    status, output = page_runs[page.name]
    assert status == 0, output[-6000:]


def _generator(name: str):
    sys.path.insert(0, str(DOCS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(DOCS))


def test_cli_reference_renders_every_command():
    from wdstream.cli.main import COMMANDS

    page = _generator("gen_cli").render()
    assert page.startswith("# CLI reference\n")
    for name in COMMANDS:
        assert f"\n## wdstream {name}\n\n```text\nUsage: wdstream {name} " in page, name


def test_api_reference_renders_every_entry_point():
    gen_api = _generator("gen_api")
    assert gen_api.problems() == [], "an entry point's Args: misses or invents a parameter"
    page = gen_api.render()
    for name, _file, _qualname in gen_api.ENTRY_POINTS:
        assert f"\n## `{name}`\n\n```python\n" in page, name
    errors = [name for name, _bases, _doc in gen_api.error_classes()]
    assert "wdstream.ShardError" in errors and "wdstream.errors.AccessError" in errors
    import wdstream.errors
    classes = [c for c in vars(wdstream.errors).values()
               if isinstance(c, type) and issubclass(c, wdstream.errors.WdstreamError)]
    assert len(errors) == len(classes)
    for name in errors:
        assert f"\n| `{name}` | " in page.split("\n## Errors\n", 1)[1], name


def test_generated_pages_are_not_committed():
    assert not (DOCS / "cli.md").exists() and not (DOCS / "api.md").exists(), \
        "docs/cli.md and docs/api.md are rendered by the docs build (docs/hooks.py)"


def test_an_args_entry_for_each_parameter_is_checked(tmp_path, monkeypatch):
    gen_api = _generator("gen_api")
    module = tmp_path / "m.py"
    module.write_text('''
def f(a, b=1, *, c=None, **kwargs):
    """Does f.

    Args:
        a (int): the first, which
            goes on.
        b (int, default 1): the second.
        d: not a parameter.
    """
''')
    monkeypatch.setattr(gen_api, "ROOT", str(tmp_path))
    monkeypatch.setattr(gen_api, "ENTRY_POINTS", (("m.f", "m.py", "f"),))
    monkeypatch.setattr(gen_api, "error_classes", list)  # no wdstream/errors.py in tmp_path
    assert gen_api.problems() == ["m.f: no Args entry for c", "m.f: no Args entry for **kwargs",
                                  "m.f: Args names d, not a parameter"]
    page = gen_api.render()
    assert "f(a, b=1, *, c=None, **kwargs)" in page
    assert "| `a` | int | the first, which goes on. |" in page


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    assert (site / "troubleshooting" / "index.html").exists()
    assert 'id="wdstream-pack"' in (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "wdstream.StreamingDataset" in (site / "api" / "index.html").read_text(encoding="utf-8")
