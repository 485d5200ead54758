"""No traceback reaches a CLI user for bad input: an ``error:`` line naming the file and the
line or entry, exit status 2; and what ``wdstream pack`` refuses at pack time."""

from __future__ import annotations

import http.server
import io
import json
import subprocess
import sys

import pytest

from tests.support.servers import http_server
from tests.support.shard_data import shard_bytes


def run(args, cli_env, cwd, **env):
    return subprocess.run(["wdstream", *args], capture_output=True, text=True, cwd=cwd,
                          errors="replace",
                          env={**cli_env, **env}, timeout=120)


def assert_clean_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path.name


def deep_record(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("options", [[], ["--workers", "2"], ["--field", "x=json"]])
def test_a_deeply_nested_record_is_an_error_line(tmp_path, cli_env, options):
    name = write(tmp_path / "deep.jsonl", '{"a": 1}\n' + deep_record(990) + "\n")
    result = run(["pack", name, "--output", "out", *options], cli_env, tmp_path)
    assert_clean_error(result, "deep.jsonl:2", "nested too deeply")
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.parametrize("options", [["--key", "id"], ["--field", "id=txt"], []])
def test_a_lone_surrogate_is_an_error_line(tmp_path, cli_env, options):
    name = write(tmp_path / "s.jsonl", '{"id": "ok", "t": 1}\n{"id": "a\\udc80b", "t": 2}\n')
    result = run(["pack", name, "--output", "out", *options], cli_env, tmp_path)
    assert_clean_error(result, "s.jsonl:2", "lone surrogate")


def test_a_file_name_not_in_utf8_is_an_error_line(tmp_path, cli_env):
    folder = tmp_path / "files"
    folder.mkdir()
    with open(bytes(folder) + b"/a\xffb.txt", "wb") as file:
        file.write(b"x")
    result = run(["pack", "files", "--output", "out"], cli_env, tmp_path)
    assert_clean_error(result, "is not valid Unicode")


@pytest.mark.slow
def test_a_surrogate_pair_is_text(tmp_path, cli_env):
    name = write(tmp_path / "p.jsonl", '{"t": "\\ud83d\\ude00"}\n')
    assert run(["pack", name, "--output", "out", "-q"], cli_env, tmp_path).returncode == 0
    result = run(["cat", "out"], cli_env, tmp_path)
    assert json.loads(result.stdout)["json"] == {"t": "\U0001f600"}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("options", [[], ["--field", "v=txt"]])
def test_nan_and_infinity_are_refused(tmp_path, cli_env, constant, options):
    name = write(tmp_path / "n.jsonl", f'{{"v": 1}}\n{{"v": {constant}}}\n')
    result = run(["pack", name, "--output", "out", *options], cli_env, tmp_path)
    assert_clean_error(result, "n.jsonl:2", f"{constant} is not JSON")


@pytest.mark.slow
def test_nan_in_a_parquet_row_is_refused(tmp_path, cli_env):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"v": [1.0, float("nan")]}), tmp_path / "r.parquet")
    result = run(["pack", "r.parquet", "--output", "out"], cli_env, tmp_path)
    assert_clean_error(result, "r.parquet", "NaN or Infinity")


@pytest.mark.parametrize(("field", "what"), [
    ("v=__url__", "reserved"), ("v=__key__", "reserved"), ("v=__KEY__", "reserved"),
    ("v=__meta__", "reserved"), ("v=a\tb", "control character"), ("v=a\x7fb", "control"),
])
@pytest.mark.slow
def test_reserved_and_control_character_names_are_refused_at_pack_time(tmp_path, cli_env,
                                                                        field, what):
    name = write(tmp_path / "ok.jsonl", '{"v": "x"}\n')
    for option in ("--field", "--tokenize"):
        result = run(["pack", name, "--output", "out", option, field], cli_env, tmp_path)
        assert_clean_error(result, what)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_folder_file_with_a_reserved_extension_is_refused(tmp_path, cli_env):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    (folder / "a.__url__").write_text("y")
    result = run(["pack", "files", "--output", "out"], cli_env, tmp_path)
    assert_clean_error(result, "'__url__' is reserved")


@pytest.fixture
def http_without_length():
    """An HTTP server whose responses have no Content-Length (HTTP/1.0, the body ends with
    the connection)."""
    data = shard_bytes(0, 3)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_HEAD(self):  # http.server's naming
            self.send_response(200)
            self.end_headers()

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    with http_server(Handler) as base:
        yield f"{base}/shard-000000.tar"


def test_verify_an_http_shard_without_content_length(http_without_length, cli_env, tmp_path):
    result = run(["verify", http_without_length], cli_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "TypeError" not in result.stdout + result.stderr
    assert "OK: 1 shard" in result.stdout


def test_a_shard_without_content_length_is_checked_against_the_manifest_size(
        http_without_length):
    """No size from the server differs from nothing: the shard is read and its size is what
    came (its None was formatted into a size-mismatch message before: a TypeError)."""
    from wdstream.inspection.verification import ShardCheck, check_shard

    size = len(shard_bytes(0, 3))
    check = check_shard(ShardCheck("shard-000000.tar", http_without_length,
                                   expected_bytes=size), deep=False)
    assert check.problems == []
    assert check.size == size


GUARDED = """
import sys
import wdstream.inspection.summary
from wdstream.cli.main import main

def hostile(*args, **kwargs):  # what a bug or an unforeseen input would raise
    raise RecursionError("maximum recursion depth exceeded")

wdstream.inspection.summary.describe = hostile
main(sys.argv[1:], prog_name="wdstream")
"""


@pytest.mark.parametrize("debug", ["", "0", "1"])
def test_an_unexpected_error_is_one_line_unless_debugging(tmp_path, cli_env, debug):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard-000000.tar").write_bytes(shard_bytes(0, 1))
    result = subprocess.run([sys.executable, "-c", GUARDED, "ls", "data"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            env={**cli_env, "WDSTREAM_DEBUG": debug})
    if debug == "1":  # read when the command runs: the traceback, for a bug report
        assert "Traceback" in result.stderr and "RecursionError" in result.stderr
        return
    assert_clean_error(result, "wdstream ls data", "nested too deeply", "WDSTREAM_DEBUG=1")


@pytest.mark.slow
def test_shards_and_members_named_outside_utf8(tmp_path, cli_env):
    """A shard file name and a member name that are not UTF-8: read and listed (with a
    replacement character), and ``index`` refuses to put such a name in a manifest."""
    import tarfile

    folder = tmp_path / "odd"
    folder.mkdir()
    shard = bytes(folder) + b"/bad\xff.tar"
    with tarfile.open(shard.decode("utf-8", "surrogateescape"), "w", format=tarfile.GNU_FORMAT,
                      encoding="utf-8", errors="surrogateescape") as tar:
        for name in (b"a\xffb.txt", b"ok.txt"):
            info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    for command in (["ls", "odd"], ["verify", "odd", "--deep"], ["cat", "odd"]):
        result = run(command, cli_env, tmp_path)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "\ufffd" in run(["cat", "odd"], cli_env, tmp_path).stdout
    assert_clean_error(run(["index", "odd"], cli_env, tmp_path), "bad\\udcff.tar",
                       "not valid UTF-8")
