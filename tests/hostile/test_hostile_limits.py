"""Hostile small objects: a manifest, config or tokenizer that never ends (an endless HTTP
body, /dev/zero, a FIFO, a huge file, a large S3 object), a YAML alias bomb, documents nested
thousands deep, numbers no config holds, and servers that echo a presigned URL's secrets.
Each attack on memory or time runs in a subprocess under an address-space limit and a
timeout, and must end in wdstream's own error naming the object and the limit."""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
import traceback
import urllib.parse

import pytest

import wdstream as wds
from tests.support.hostile import wdstream
from tests.support.servers import environ, http_server
from tests.support.shard_data import write_dataset
from wdstream.errors import InputError, WdstreamError
from wdstream.limits import NestingError, json_depth, json_loads
from wdstream.printable import redact, short_repr
from wdstream.shards.manifest import load_manifest

pytestmark = pytest.mark.usefixtures("single_rank")

MEMORY = 1536 << 20  # address space of a child: the unbounded reads need 2.4 GB and more
GROWTH = 160 << 20  # what a refused read may add to the peak RSS (limits of 8 and 16 MiB)
TIMEOUT = 60
BUILD = "import wdstream.stages.config, wdstream.stages.mix"  # torch: timed without its import

_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
import wdstream
from wdstream.errors import WdstreamError
{setup}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.monotonic()
try:
{body}
    outcome = {{"error": None}}
except WdstreamError as error:
    outcome = {{"error": type(error).__name__, "message": str(error)}}
outcome["seconds"] = time.monotonic() - started
outcome["memory"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(json.dumps(outcome))
"""


def limited(body: str, env: dict[str, str] | None = None, setup: str | None = None) -> dict:
    """Run ``body`` in a child Python under ``MEMORY`` of address space and ``TIMEOUT``,
    after ``setup`` (imports); its outcome: the wdstream error's class and message (None: no
    error), the seconds it took and the memory it added to the peak RSS. Any other exception
    (MemoryError, RecursionError) fails the test with its traceback. A body that builds a
    config imports what a config builds (torch) before the clock starts, unless ``setup``
    says otherwise."""
    if setup is None:
        setup = BUILD if "from_config" in body else ""
    code = _CHILD.format(memory=MEMORY, setup=setup,
                         body=textwrap.indent(textwrap.dedent(body), "    "))
    child_env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=TIMEOUT, env=child_env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_refused(outcome: dict, kind: str, *words: str, seconds: float = 10) -> None:
    assert outcome["error"] == kind, outcome
    for word in words:
        assert word in outcome["message"], outcome
    assert outcome["seconds"] < seconds, outcome
    assert outcome["memory"] < GROWTH, outcome



# --------------------------------------------------------------------------- sizes

class _Endless(http.server.BaseHTTPRequestHandler):
    """200 without a length, then bytes until the client goes away."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):  # the http.server name
        self.send_response(200)
        self.end_headers()
        if self.command == "HEAD":
            return
        chunk = b"a" * (1 << 16)
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


# what reads each kind of small object, its error, a word of its message, the environment
READERS = {
    "config": ("wdstream.from_config({url!r})", "InputError", "16,777,216", {}),
    "tokenizer": ("from wdstream.write.tokenizer import Tokenizer\nTokenizer({url!r})",
                  "InputError", "WDSTREAM_MAX_TOKENIZER_BYTES",
                  {"WDSTREAM_MAX_TOKENIZER_BYTES": "8MiB"}),
    "manifest": ("from wdstream.shards.locate import find_shards\nfind_shards({url!r})",
                 "ManifestError", "WDSTREAM_MAX_MANIFEST_BYTES",
                 {"WDSTREAM_MAX_MANIFEST_BYTES": "8MiB"}),
    "part manifest": ("from wdstream.shards.manifest import load_manifest\n"
                      "load_manifest({url!r}, allow_empty=True)", "ManifestError",
                      "WDSTREAM_MAX_MANIFEST_BYTES", {"WDSTREAM_MAX_MANIFEST_BYTES": "8MiB"}),
}
NAMES = {"config": "mix.yaml", "tokenizer": "tokenizer.json", "manifest": "index.json",
         "part manifest": "index.part-000-of-002.json"}


def _source(kind: str, folder) -> str:
    """What the reader of ``kind`` is given for the object ``NAMES[kind]`` in ``folder``."""
    return f"{folder}/" if kind == "manifest" else f"{folder}/{NAMES[kind]}"


@pytest.mark.parametrize("kind", READERS)
def test_an_endless_http_body_is_cut_at_the_limit(kind):
    code, error, word, env = READERS[kind]
    with http_server(_Endless) as base:
        outcome = limited(code.format(url=_source(kind, f"{base}/data")), env)
    assert_refused(outcome, error, word, "more than", f"{base}/data/{NAMES[kind]}")


@pytest.mark.parametrize("kind", READERS)
def test_a_local_device_or_fifo_is_refused_without_blocking(kind, tmp_path):
    code, error, _word, env = READERS[kind]
    for made in ("zero", "fifo"):
        folder = tmp_path / made
        folder.mkdir()
        if made == "zero":
            (folder / NAMES[kind]).symlink_to("/dev/zero")
        else:
            os.mkfifo(folder / NAMES[kind])  # opened, it would wait for a writer forever
        outcome = limited(code.format(url=_source(kind, folder)), env)
        assert_refused(outcome, error, "not a regular file", str(folder), seconds=2)


@pytest.mark.parametrize("kind", READERS)
def test_a_huge_local_file_is_read_up_to_the_limit(kind, tmp_path):
    code, error, word, env = READERS[kind]
    with open(tmp_path / NAMES[kind], "wb") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB of zeros that take no disk
    outcome = limited(code.format(url=_source(kind, tmp_path)), env)
    assert_refused(outcome, error, word, str(tmp_path / NAMES[kind]))


def test_an_endless_gcs_metadata_answer_is_read_in_part():
    """A GCS-compatible endpoint (``STORAGE_EMULATOR_HOST``) answering the object's metadata
    with an endless body: the reader takes its first 16 KiB, not the whole answer."""
    with http_server(_Endless) as base:
        outcome = limited("from wdstream.sources.objects import read_bytes\n"
                          "read_bytes('gs://bucket/data/index.json')",
                          {"STORAGE_EMULATOR_HOST": base})
    assert_refused(outcome, "StreamError", "gs://bucket/data/index.json",
                   "unreadable object metadata")


@pytest.mark.slow
def test_the_commands_refuse_a_fifo_or_an_oversized_manifest(tmp_path, cli_env):
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "index.json")
    for command in ("ls", "verify"):
        result = wdstream(command, fifo, code=2, env=cli_env, timeout=30)
        assert f"{fifo}/index.json: not a regular file" in result.stderr
    write_dataset(tmp_path / "ds", [3, 2])
    result = wdstream("ls", tmp_path / "ds", code=2, timeout=30,
                      env={**cli_env, "WDSTREAM_MAX_MANIFEST_BYTES": "100"})
    assert "index.json: more than 100 bytes, the most a manifest may have (set " \
        "WDSTREAM_MAX_MANIFEST_BYTES to change it)" in result.stderr


@pytest.mark.slow
def test_large_objects_on_s3_are_cut_at_the_limit(s3, s3_bucket):
    """Through the moto server and the ranged S3 reader: a manifest and a config of 3 MiB
    under limits of 1 MiB (the reader stops, having fetched at most its parts in flight)."""
    client = s3.client()
    blob = b" " * (3 << 20)
    client.put_object(Bucket=s3_bucket, Key="data/index.json", Body=blob)
    client.put_object(Bucket=s3_bucket, Key="cfg/mix.yaml", Body=blob)
    limits = {"WDSTREAM_MAX_MANIFEST_BYTES": "1MiB", "WDSTREAM_MAX_CONFIG_BYTES": "1MiB"}
    manifest = limited(READERS["manifest"][0].format(url=f"s3://{s3_bucket}/data/"), limits)
    assert_refused(manifest, "ManifestError", f"s3://{s3_bucket}/data/index.json",
                   "more than 1,048,576 bytes", "WDSTREAM_MAX_MANIFEST_BYTES")
    config = limited(f"wdstream.from_config('s3://{s3_bucket}/cfg/mix.yaml')", limits)
    assert_refused(config, "InputError", f"s3://{s3_bucket}/cfg/mix.yaml",
                   "more than 1,048,576 bytes", "WDSTREAM_MAX_CONFIG_BYTES")


def test_objects_within_the_limits_read_as_before(tmp_path, monkeypatch):
    write_dataset(tmp_path / "ds", [3, 2])
    size = (tmp_path / "ds" / "index.json").stat().st_size
    monkeypatch.setenv("WDSTREAM_MAX_MANIFEST_BYTES", str(size))
    assert load_manifest(str(tmp_path / "ds")).samples == 5
    monkeypatch.setenv("WDSTREAM_MAX_MANIFEST_BYTES", str(size - 1))
    with pytest.raises(wds.errors.ManifestError, match=f"more than {size - 1:,} bytes"):
        load_manifest(str(tmp_path / "ds"))
    monkeypatch.setenv("WDSTREAM_MAX_MANIFEST_BYTES", "lots")
    with pytest.raises(InputError, match="WDSTREAM_MAX_MANIFEST_BYTES='lots': not a size"):
        load_manifest(str(tmp_path / "ds"))


# --------------------------------------------------------------------------- configs

def _laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\ndatasets: *a{levels - 1}\nseed: *a{levels - 1}\n"


def test_a_yaml_alias_bomb_is_refused_as_it_is_composed(tmp_path):
    (tmp_path / "bomb.yaml").write_text(_laughs(9))  # 10**9 values expanded
    assert len(_laughs(9)) < 600
    outcome = limited(f"wdstream.from_config({str(tmp_path / 'bomb.yaml')!r})")
    assert_refused(outcome, "InputError", "bomb.yaml", "more than 100,000 values", seconds=2)


@pytest.mark.slow
def test_a_config_of_one_long_value_reads_in_seconds(tmp_path):
    """15 MiB in one string, under the 16 MiB limit: libyaml's scanner, not PyYAML's
    pure-Python one (50 s), and the error names the key."""
    (tmp_path / "long.yaml").write_text("datasets: '" + "x" * (15 << 20) + "'\n")
    outcome = limited(f"wdstream.from_config({str(tmp_path / 'long.yaml')!r})")
    assert_refused(outcome, "InputError", "'datasets' must be a list of datasets, not str",
                   seconds=8)


@pytest.mark.slow
def test_yaml_aliases_within_the_bound_still_work(tmp_path):
    write_dataset(tmp_path / "a", [3])
    write_dataset(tmp_path / "b", [2])
    (tmp_path / "mix.yaml").write_text(
        "defaults: &d {weight: 1, shuffle: false}\n"
        "datasets:\n  - {<<: *d, path: a, label: a}\n  - {<<: *d, path: b, label: b}\n")
    mix = wds.from_config(str(tmp_path / "mix.yaml"))
    assert sorted(sample["__source__"] for sample in mix) == ["a"] * 3 + ["b"] * 2
    (tmp_path / "cycle.yaml").write_text("datasets: &a [*a]\n")
    with pytest.raises(InputError, match="cycle.yaml: .*an alias to a value that contains it"):
        wds.from_config(str(tmp_path / "cycle.yaml"))


def test_json_depth_counts_brackets_outside_strings():
    assert json_depth(b'{"a": [1, {"b": "[[[[\\" [[{"}], "c": []}') == 3
    assert json_depth("[" * 40 + "]" * 40) == 40
    assert json_depth('["' + "\\\"" * 1000 + '", [[]]]') == 3  # escaped quotes stay inside
    started = time.monotonic()  # escaped quotes that never close: linear, not quadratic
    assert json_depth(b'"' + b'\\"[' * (1 << 20)) == 0
    assert time.monotonic() - started < 5
    with pytest.raises(NestingError, match="nested deeper than 32 levels"):
        json_loads(b'{"a": ' * 33 + b"1" + b"}" * 33)
    assert json_loads(b'{"a": ' * 32 + b"1" + b"}" * 32) is not None


@pytest.mark.parametrize("name, text", [
    ("deep.yaml", "datasets: " + "[" * 50_000 + "]" * 50_000 + "\n"),
    ("deep-block.yaml", "".join(" " * i + "-\n" for i in range(0, 4000, 2))),
    ("deep.json", '{"datasets": ' + "[" * 50_000 + "]" * 50_000 + "}"),
    ("deep-map.json", '{"a": ' * 50_000 + "1" + "}" * 50_000),
], ids=["deep.yaml", "deep-block.yaml", "deep.json", "deep-map.json"])
def test_deep_configs_are_refused_by_depth(tmp_path, name, text):
    """(libyaml refuses flow collections 1,000 deep itself, as it scans)"""
    (tmp_path / name).write_text(text)
    outcome = limited(f"wdstream.from_config({str(tmp_path / name)!r})")
    assert_refused(outcome, "InputError", name, "nest")
    shallow = "datasets: " + "[" * 33 + "]" * 33 if name.endswith(".yaml") else \
        '{"datasets": ' + "[" * 33 + "]" * 33 + "}"
    (tmp_path / name).write_text(shallow)
    with pytest.raises(InputError, match=f"{name}: not valid .*nested deeper than 32 levels"):
        wds.from_config(str(tmp_path / name))


@pytest.mark.parametrize("name, text, words", [
    ("digits.yaml", "seed: " + "7" * 5000 + "\n", "digits"),
    ("digits.json", '{"seed": ' + "7" * 5000 + "}", "digits"),
    ("date.yaml", "seed: 2001-13-45\n", "month"),
])
def test_values_a_parser_cannot_build_are_input_errors(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=f"{name}: not valid .*{words}"):
        wds.from_config(str(tmp_path / name))


def test_numbers_no_config_holds_are_input_errors(tmp_path):
    write_dataset(tmp_path / "a", [3])
    write_dataset(tmp_path / "b", [2])
    two = [{"path": str(tmp_path / "a"), "label": "a"},
           {"path": str(tmp_path / "b"), "label": "b"}]
    cases = {
        "'weight' must be at most": {"datasets": [{**two[0], "weight": 10**400}]},
        "weight 0 must be a finite number": {
            "datasets": two, "schedule": [{"start": 0, "weights": {"a": 10**400}}]},
        "'seq_len' must be at most 16,777,216": {"datasets": two, "seq_len": 10**30,
                                                 "eos": 1},
        "unknown key": {"datasets": two,
                        "schedule": [{"start": 0, "weights": {"a": 1}, 1: 2, "x": 3}]},
    }
    for words, config in cases.items():
        with pytest.raises(InputError, match=re.escape(words)):
            wds.from_config(config)


@pytest.mark.slow
def test_an_error_shows_a_bounded_prefix_of_a_shared_value():
    """A value whose parts are shared 10**9 times over (what YAML aliases build) is shown
    a few items deep, never expanded whole."""
    outcome = limited("""
        value = ["lol"] * 10
        for _ in range(8):
            value = [value] * 10
        wdstream.from_config({"datasets": [{"path": "x"}], "seed": value})
    """)
    assert_refused(outcome, "InputError", "'seed' must be an integer, not list [[[[",
                   seconds=1)
    value = ["lol"] * 10
    for _ in range(8):
        value = [value] * 10
    assert len(short_repr(value)) <= 203


# --------------------------------------------------------------------------- secrets

SECRET_KEY_ID = "AKIDLEAKCHECK0042"


def test_redact_removes_signed_request_secrets():
    texts = [
        "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F2026%2Fus-east-1"
        "&X-Amz-Signature=5ecret&X-Amz-Security-Token=tok3n",
        "<Resource>/b/k?AWSAccessKeyId=AKID&amp;Signature=5ecret%2B&amp;Expires=1</Resource>"
        "<AWSAccessKeyId>AKID</AWSAccessKeyId><SignatureProvided>5ecret</SignatureProvided>",
        "Authorization: AWS4-HMAC-SHA256 Credential=AKID/2026/us/s3/aws4_request, "
        "SignedHeaders=host, Signature=5ecret",
        "https://storage.googleapis.com/b/o?X-Goog-Credential=AKID%40p.iam&X-Goog-Signature"
        "%3D5ecret",
        "https://h/x?access_token=tok3n&alt=media https://h/y?token=tok3n",
    ]
    for text in texts:
        shown = redact(text)
        assert "AKID" not in shown and "5ecret" not in shown and "tok3n" not in shown, shown
        assert "REDACTED" in shown
    assert redact("s3://b/data/index.json: key 'token': not found") == \
        "s3://b/data/index.json: key 'token': not found"
    assert SECRET_KEY_ID not in str(wds.errors.StreamError(
        f"https://h/k?AWSAccessKeyId={SECRET_KEY_ID}", "failed",
        stderr=f"<AWSAccessKeyId>{SECRET_KEY_ID}</AWSAccessKeyId>"))


class _Echo(http.server.BaseHTTPRequestHandler):
    """An S3-compatible server that serves ``manifest`` as any ``index.json`` and answers
    every other GET with ``status`` and an error whose message echoes the request: its path
    with the presigned query and its Authorization header. ``secrets``: those it was sent."""

    protocol_version = "HTTP/1.1"
    manifest, status, code, secrets = b"", 503, "SlowDown", set()

    def do_GET(self):  # the http.server name
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        auth = self.headers.get("Authorization", "")
        for name in ("X-Amz-Signature", "X-Amz-Credential", "Signature", "AWSAccessKeyId"):
            self.secrets.update(query.get(name, []))
        self.secrets.update(re.findall(r"(?:Credential|Signature)=([^,\s]+)", auth))
        if self.path.split("?")[0].endswith("/index.json"):
            self._send(200, self.manifest, {"ETag": '"m1"'})
            return
        body = (f"<Error><Code>{self.code}</Code><Message>GET {self.path} "
                f"Authorization: {auth}</Message><Resource>{self.path}</Resource>"
                f"<AWSAccessKeyId>{SECRET_KEY_ID}</AWSAccessKeyId></Error>").encode()
        self._send(self.status, body, {"Content-Type": "application/xml"})

    def do_HEAD(self):
        self._send(self.status, b"", {})

    def _send(self, status, body, headers):
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(params=[(503, "SlowDown"), (403, "AccessDenied")], ids=["503", "403"])
def echoing_s3(tmp_path, request):
    """``(server's handler class, environment)``: an ``_Echo`` server answering shards with
    the status of the parameter, in an environment whose access key id is ``SECRET_KEY_ID``
    (also set in os.environ)."""
    write_dataset(tmp_path / "ds", [3, 2])
    status, code = request.param
    handler = type("Echo", (_Echo,), {"manifest": (tmp_path / "ds" / "index.json").read_bytes(),
                                      "status": status, "code": code, "secrets": set()})
    with http_server(handler) as endpoint:
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": SECRET_KEY_ID,
               "AWS_SECRET_ACCESS_KEY": "not-a-real-secret", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_MAX_ATTEMPTS": "1", "AWS_CONFIG_FILE": "/dev/null",
               "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
        with environ(env):
            yield handler, env


def _assert_no_secret(handler, *texts: str) -> None:
    assert handler.secrets, "the server was sent no signed request"
    for text in texts:
        assert "REDACTED" in text  # the server's echo was there, and was redacted
        for secret in {SECRET_KEY_ID, *handler.secrets}:
            assert secret not in text and urllib.parse.unquote(secret) not in text, (
                secret, text[:2000])


@pytest.mark.slow
def test_no_signed_url_secret_in_errors_warnings_or_tracebacks(echoing_s3, caplog):
    handler, _env = echoing_s3
    caplog.set_level(logging.WARNING, logger="wdstream")
    ds = wds.StreamingDataset("s3://bucket/ds/", shuffle=False, retries=1, retry_backoff=0.01)
    with pytest.raises(WdstreamError) as caught:
        list(ds)
    shown = "".join(traceback.format_exception(caught.value))
    _assert_no_secret(handler, shown, repr(caught.value.args))
    if handler.status == 503:
        assert "retry 1 of 1" in caplog.text
        _assert_no_secret(handler, caplog.text)


@pytest.mark.slow
def test_no_signed_url_secret_on_the_commands_stderr(echoing_s3, cli_env):
    handler, env = echoing_s3
    result = wdstream("cat", "s3://bucket/ds/", code=2, env={**cli_env, **env})
    _assert_no_secret(handler, result.stderr)
