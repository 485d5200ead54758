"""Manifests that cannot be right are refused by every entry point with a ManifestError naming
the manifest and the entry (``ls`` and ``verify`` never call them OK, nothing overflows or
recurses), and what a terminal shows of names and values from storage is escaped."""

from __future__ import annotations

import json

import pytest

import wdstream as wds
from tests.support.hostile import wdstream
from tests.support.shard_data import shard_bytes, write_dataset
from wdstream.errors import ManifestError

pytestmark = pytest.mark.timeout(120)


def edit(doc, **changes):
    """The manifest ``doc`` with ``changes``: ``shard0_samples=...`` edits shards[0]."""
    doc = json.loads(json.dumps(doc))
    for key, value in changes.items():
        if key.startswith("shard") and key != "shards":
            index, _, field = key[len("shard"):].partition("_")
            doc["shards"][int(index)][field] = value
        else:
            doc[key] = value
    return json.dumps(doc)


def resum(text):
    """Keep the top-level sums right, so only the edited entry is wrong."""
    doc = json.loads(text)
    doc["samples"] = sum(s["samples"] for s in doc["shards"])
    doc["bytes"] = sum(s["bytes"] for s in doc["shards"])
    return json.dumps(doc)


# case -> (manifest text from the good one, what the error names)
IMPOSSIBLE = {
    "no-shards": (lambda d: edit(d, shards=[], samples=0, bytes=0), "'samples'"),
    "shard-without-samples": (lambda d: resum(edit(d, shard0_samples=0, shard0_bytes=20480)),
                              "'shards[0].bytes'"),
    "empty-shards-only": (lambda d: resum(edit(d, shard0_samples=0, shard0_bytes=1024,
                                               shard1_samples=0, shard1_bytes=1024)),
                          "'samples'"),
    "duplicate-shard": (lambda d: resum(edit(d, shard1_url="./shard-000000.tar")),
                        "'shards[1].url'"),
    "duplicate-key": (lambda d: json.dumps(d)[:-1] + ', "samples": 7}', "'samples' appears twice"),
    "duplicate-key-in-shard": (
        lambda d: json.dumps(d).replace('"samples": 3,', '"samples": 3, "samples": 300,', 1),
        "'samples' appears twice"),
    "samples-as-text": (lambda d: resum(edit(d, shard0_samples=3)).replace(
        '"samples": 3,', '"samples": "3",', 1), "'shards[0].samples'"),
    "url-not-a-string": (lambda d: edit(d, shard0_url=5), "'shards[0].url'"),
    "shards-not-a-list": (lambda d: edit(d, shards={"url": "x.tar"}), "'shards'"),
    "extensions-not-strings": (lambda d: edit(d, extensions=[1]), "'extensions'"),
    "samples-2**63": (lambda d: resum(edit(d, shard0_samples=2**63)), "'shards[0].bytes'"),
    "samples-and-bytes-2**63": (
        lambda d: resum(edit(d, shard0_samples=2**63, shard0_bytes=2**72)), "'shards[0].bytes'"),
    "top-level-sum-2**63": (lambda d: edit(d, samples=2**63), "'samples'"),
    "nested-100k": (lambda d: json.dumps(d)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000
                    + "}", "nested deeper than 32"),
    "nested-40": (lambda d: json.dumps(d)[:-1] + ', "x": ' + "[" * 40 + "]" * 40 + "}",
                  "nested deeper than 32"),
    "control-characters": (lambda d: edit(d, shard0_url="shard-000000\x1b[2J.tar"),
                           "'shards[0].url'"),
    "not-json": (lambda d: json.dumps(d)[:-5], "not valid JSON"),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
@pytest.mark.slow
def test_impossible_manifests_are_refused_everywhere(scene, case):
    make, named = IMPOSSIBLE[case]
    good = json.loads(scene.manifest.read_text())
    scene.manifest.write_text(make(good))
    with pytest.raises(ManifestError) as caught:
        wds.StreamingDataset(str(scene.dataset))
    assert str(scene.manifest) in str(caught.value) and named in str(caught.value)
    assert "\x1b" not in str(caught.value)
    for command in ("ls", "verify"):
        result = wdstream(command, scene.dataset, code=2, timeout=30)
        assert result.stderr.startswith(f"error: {scene.manifest}: ") and named in result.stderr
        assert "OK" not in result.stdout and "\x1b" not in result.stderr
    if "2**63" in case:
        for command in (["bench", "--workers", "0"], ["cat"]):
            result = wdstream(*command, scene.dataset, code=2)
            assert "Overflow" not in result.stderr and named in result.stderr


def test_verify_checks_sizes_without_deep(tmp_path):
    folder = tmp_path / "ds"
    write_dataset(folder, [3, 3])
    shard = folder / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes() + b"\0" * 512)
    result = wdstream("verify", folder, code=1)
    assert "shard-000001.tar: size 7,680 bytes, the manifest says 7,168" in result.stdout
    assert "FAILED: 1 of 2 shards" in result.stdout


# --------------------------------------------------------------------------- terminals

EVIL = "evil\x1b[31m\r\n[bold]x\u009b\u202e.tar"  # ANSI, CR/LF, rich markup, C1 CSI, bidi
RAW = ("\x1b", "\r", "\u009b", "\u202e")


def assert_escaped(*texts):
    for text in texts:
        for char in RAW:
            assert char not in text, (char, text)


@pytest.mark.slow
def test_listed_names_are_escaped_on_the_terminal(tmp_path):
    folder = tmp_path / "ds"
    write_dataset(folder, [2], manifest=False)
    (folder / EVIL).write_bytes(shard_bytes(8, 1))
    table = wdstream("ls", folder).stdout
    assert "evil\\x1b[31m\\r\\n[bold]x\\x9b\\u202e.tar" in table  # markup shown, not applied
    listing = wdstream("ls", folder, "--json").stdout
    assert json.loads(listing)["shards"][0]["name"] == EVIL
    samples = wdstream("cat", folder).stdout
    assert [json.loads(line)["__url__"] for line in samples.splitlines()][0] == str(folder / EVIL)
    assert_escaped(table, listing, samples, wdstream("ls", folder, "--no-scan").stdout)
    # damaged: verify names the shard in its report, ls in its problems
    (folder / EVIL).write_bytes(shard_bytes(8, 1)[:700])
    report = wdstream("verify", folder, code=1)
    assert "evil\\x1b" in report.stdout
    problems = wdstream("ls", folder, code=1)
    cat = wdstream("cat", folder, code=1)
    assert "evil\\x1b" in cat.stderr
    assert_escaped(report.stdout, report.stderr, problems.stdout, problems.stderr, cat.stderr)


@pytest.mark.slow
def test_manifest_values_are_escaped_on_the_terminal(scene):
    doc = json.loads(scene.manifest.read_text())
    doc["packed_by"] = {"note": "\x1b]0;owned\x07 \u009b2J \u202eright", "\x1b[1mkey": 1}
    doc["extensions"] = ["json", "t\x1b[8mxt"]
    scene.manifest.write_text(json.dumps(doc))
    table = wdstream("ls", scene.dataset).stdout
    assert "\\x1b]0;owned\\x07" in table and "\\x1b[1mkey" in table
    listing = wdstream("ls", scene.dataset, "--json").stdout
    assert json.loads(listing)["extra"]["packed_by"]["note"].startswith("\x1b]0;owned")
    assert_escaped(table, listing)
    scene.set_entry("pipe:\x1b[2J\rOK: all good")
    result = wdstream("ls", scene.dataset, code=2)
    assert "pipe:\\x1b[2J\\rOK: all good" in result.stderr and result.stderr.count("\n") == 1
    assert_escaped(result.stderr)
