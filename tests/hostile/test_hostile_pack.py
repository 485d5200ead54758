"""``wdstream pack`` of inputs written by a stranger: a folder with links out of it, FIFOs,
devices and sockets, and records far larger than the limit in every input format. Each case
runs ``pack`` in a subprocess under an address-space limit (``RLIMIT_AS``) and a timeout,
and checks the error (exit 2, naming the file) or the documented behaviour, and that nothing
was published and no secret from outside the folder reached a shard."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wdstream.errors import InputError

SECRET = b"aws_secret_access_key = TOP-SECRET-4242"
LIMIT = 1 << 30  # address space of a command that does not load pyarrow
PARQUET_LIMIT = 3 << 29  # pyarrow's libraries alone map about 0.8 GB
SECONDS = 30  # the longest a refused input may take

# Starts the installed command (argv[2:]) with its address space limited to argv[1] bytes.
_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execv(sys.argv[2], sys.argv[2:])")
# wdstream.pack(argv[2], argv[3], **json(argv[4])) with the address space limited to argv[1].
_PACK = """
import json, resource, sys
n = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (n, n))
import wdstream
from wdstream.errors import WdstreamError
try:
    wdstream.pack(sys.argv[2], sys.argv[3], **json.loads(sys.argv[4]))
except WdstreamError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(error.exit_code)
"""


def cli(*args, env, limit=LIMIT, stdin=None) -> subprocess.CompletedProcess:
    """The installed ``wdstream`` under ``limit`` bytes of address space and SECONDS."""
    exe = shutil.which("wdstream", path=os.path.dirname(sys.executable))
    return _limited([sys.executable, "-c", _LIMITED, str(limit), exe, *map(str, args)], env,
                    stdin)


def pack(source, output, limit=LIMIT, **options) -> subprocess.CompletedProcess:
    """``wdstream.pack`` in a subprocess under ``limit`` bytes of address space (run in the
    output's folder: ``python -c`` imports from its working directory first)."""
    return _limited([sys.executable, "-c", _PACK, str(limit), str(source), str(output),
                     json.dumps(options)], None, None, cwd=Path(output).parent)


def _limited(command, env, stdin, cwd=None) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=env, stdin=stdin,
                            timeout=SECONDS, cwd=cwd)
    result.seconds = time.monotonic() - started
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr, \
        result.stderr
    return result


def refused(result, output: Path, *names) -> str:
    """The run's error: exit 2 naming each of ``names``, within SECONDS, nothing published."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.seconds < SECONDS
    for name in names:
        assert str(name) in result.stderr, (name, result.stderr)
    assert not output.exists() or not any(output.iterdir()), sorted(output.iterdir())
    return result.stderr


def written(output: Path) -> bytes:
    """Every byte the run wrote under ``output``."""
    return b"".join(path.read_bytes() for path in sorted(output.rglob("*")) if path.is_file())


@pytest.fixture
def photos(tmp_path) -> Path:
    """A folder of two samples, and a secret file beside it."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "credentials").write_bytes(SECRET)
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"jpeg-a")
    (folder / "a.txt").write_bytes(b"caption a")
    (folder / "b.jpg").write_bytes(b"jpeg-b")
    return folder


# --- folders: links, FIFOs, devices, sockets -----------------------------------------------


@pytest.mark.slow
def test_a_link_out_of_the_folder_is_refused_and_never_read(photos, tmp_path, cli_env):
    secret = tmp_path / "home" / "credentials"
    os.symlink(secret, photos / "b.txt")
    output = tmp_path / "out"
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "b.txt",
            "out of the folder", "--follow-links")
    # relative, through a subfolder, or to a folder out of it: the same
    os.remove(photos / "b.txt")
    os.symlink("../home/credentials", photos / "b.txt")
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "b.txt")
    os.remove(photos / "b.txt")
    (photos / "sub").mkdir()
    os.symlink("../../home/credentials", photos / "sub" / "c.txt")
    refused(cli("pack", photos, "--output", output, env=cli_env), output,
            photos / "sub" / "c.txt", "out of the folder")
    shutil.rmtree(photos / "sub")
    os.symlink(tmp_path / "home", photos / "home")
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "home",
            "out of the folder")
    assert not output.exists() or SECRET not in written(output)


@pytest.mark.slow
def test_links_inside_the_folder_are_followed_and_out_of_it_only_when_asked(
        photos, tmp_path, cli_env):
    os.symlink("a.txt", photos / "b.txt")  # within the folder: read as the file it names
    inside = tmp_path / "inside"
    result = cli("pack", photos, "--output", inside, "--quiet", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert b"caption a" in written(inside) and written(inside).count(b"caption a") == 2

    os.symlink(tmp_path / "home" / "credentials", photos / "c.txt")
    followed = tmp_path / "followed"
    result = pack(photos, followed, follow_links=True)
    assert result.returncode == 0, result.stderr
    assert SECRET in written(followed)  # the documented opt-in
    result = pack(photos, tmp_path / "not", follow_links="yes")
    assert result.returncode == 2 and "follow_links" in result.stderr


@pytest.mark.slow
def test_fifos_devices_sockets_and_loops_are_refused_at_once(photos, tmp_path, cli_env):
    output = tmp_path / "out"
    os.mkfifo(photos / "c.txt")  # nobody writes it: reading it would wait forever
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "c.txt",
            "a FIFO")
    os.remove(photos / "c.txt")
    os.symlink("/dev/zero", photos / "c.bin")  # endless bytes
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "c.bin")
    refused(cli("pack", photos, "--output", output, "--follow-links", env=cli_env), output,
            photos / "c.bin", "a character device")
    os.remove(photos / "c.bin")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(photos / "c.sock"))
        refused(cli("pack", photos, "--output", output, env=cli_env), output,
                photos / "c.sock", "a socket")
    finally:
        server.close()
        os.remove(photos / "c.sock")
    os.symlink(".", photos / "loop")
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "loop",
            "a loop")
    refused(pack(photos, output, follow_links=True), output, photos / "loop", "a loop")
    os.remove(photos / "loop")
    os.symlink("missing.txt", photos / "c.txt")
    refused(cli("pack", photos, "--output", output, env=cli_env), output, photos / "c.txt")
    os.remove(photos / "c.txt")
    os.mkfifo(photos / ".c.txt")  # hidden entries are skipped unread, as hidden files are
    assert pack(photos, output).returncode == 0


@pytest.mark.slow
def test_an_input_file_that_is_a_fifo_or_a_device_is_refused(tmp_path, cli_env):
    output = tmp_path / "out"
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    refused(cli("pack", fifo, "--output", output, env=cli_env), output, fifo, "a FIFO")
    zero = tmp_path / "zero.jsonl"
    os.symlink("/dev/zero", zero)
    refused(cli("pack", zero, "--output", output, env=cli_env), output, zero,
            "a character device")
    refused(pack(tmp_path / "*.jsonl", output), output, fifo, "a FIFO")  # a glob's match
    # stdin may be a pipe: that is how a stream is packed
    result = cli("pack", "-", "--output", output, "--quiet", env=cli_env,
                 stdin=open(os.devnull, "rb"))
    assert result.returncode == 2 and "no records" in result.stderr


def test_a_file_swapped_for_a_link_after_the_listing_is_not_read(photos, tmp_path):
    from wdstream.write.local_inputs import folder_files
    from wdstream.write.remote import read_member

    files = {file.relative: file for file in folder_files(str(photos))}
    listed = files["a.txt"]
    assert read_member(listed.path, listed.size, listed.identity) == b"caption a"
    os.remove(photos / "a.txt")
    os.symlink(tmp_path / "home" / "credentials", photos / "a.txt")
    with pytest.raises(InputError, match="a.txt"):
        read_member(listed.path, listed.size, listed.identity)
    os.remove(photos / "a.txt")
    os.link(tmp_path / "home" / "credentials", photos / "a.txt")  # another file, no link
    with pytest.raises(InputError, match="changed while packing"):
        read_member(listed.path, listed.size, listed.identity)


def test_a_json_lines_file_swapped_before_a_worker_reads_it_again_is_refused(tmp_path):
    from wdstream.write.jsonl_inputs import read_jsonl, read_lines

    source = tmp_path / "d.jsonl"
    source.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    (batch,) = read_jsonl(str(source))
    assert read_lines(str(source), 0, batch.offsets[-1], batch.identity, 2) == batch.values
    os.rename(source, tmp_path / "moved.jsonl")
    secret = tmp_path / "credentials"
    secret.write_bytes(b'{"k": 1}\n{"k": 2}\n')  # as many lines, and as long
    os.symlink(secret, source)
    with pytest.raises(InputError, match="changed while packing"):
        read_lines(str(source), 0, batch.offsets[-1], batch.identity, 2)


# --- records larger than the limit, refused before they are read whole ---------------------


@pytest.mark.slow
def test_a_huge_file_in_a_folder_is_refused_by_its_size(photos, tmp_path, cli_env):
    with open(photos / "c.bin", "wb") as file:
        file.truncate(2 << 30)  # 2 GiB, sparse: more than the process may map
    output = tmp_path / "out"
    error = refused(cli("pack", photos, "--output", output, env=cli_env), output,
                    photos / "c.bin", "256 MiB")
    assert "2,147,483,648 bytes" in error
    refused(cli("pack", photos, "--output", output, "--max-size", "10kB", env=cli_env),
            output, photos / "c.bin", "10.0 kB")


@pytest.mark.slow
def test_long_json_lines_are_refused_under_max_size(tmp_path, cli_env):
    output = tmp_path / "out"
    lines = b'{"ok": 1}\n' + json.dumps({"text": "x" * (3 << 20)}).encode() + b"\n"
    for name, data in (("plain.jsonl", lines), ("packed.jsonl.gz", gzip.compress(lines, 1))):
        source = tmp_path / name
        source.write_bytes(data)
        for workers in (1, 2):  # read here, or by a pool worker
            refused(cli("pack", source, "--output", output, "--max-size", "1MB",
                        "--workers", workers, env=cli_env), output, f"{source}:2",
                    "longer than 1.0 MB")
    with open(tmp_path / "plain.jsonl", "rb") as stdin:
        refused(cli("pack", "-", "--output", output, "--max-size", "1MB", env=cli_env,
                    stdin=stdin), output, "<stdin>:2", "longer than 1.0 MB")


def test_a_csv_record_spread_over_many_lines_is_refused(tmp_path, cli_env):
    source = tmp_path / "spread.csv"
    with open(source, "w") as file:
        file.write("a,b\n1,2\n")  # then one record: 1 MB of short quoted lines
        file.write(",".join(['"line\nline"'] * 100_000) + "\n")
    output = tmp_path / "out"
    refused(cli("pack", source, "--output", output, "--max-size", "500kB", env=cli_env),
            output, f"{source}:3", "longer than 500.0 kB")


@pytest.mark.slow
def test_a_remote_record_or_file_larger_than_the_limit_is_refused(tmp_path, s3_bucket,
                                                                   cli_env):
    client = __import__("boto3").client(
        "s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.put_object(Bucket=s3_bucket, Key="d.jsonl",
                      Body=b'{"ok": 1}\n' + json.dumps({"t": "x" * (2 << 20)}).encode())
    client.put_object(Bucket=s3_bucket, Key="photos/a.jpg", Body=b"a")
    client.put_object(Bucket=s3_bucket, Key="photos/b.jpg", Body=b"b" * (2 << 20))
    output = tmp_path / "out"
    refused(cli("pack", f"s3://{s3_bucket}/d.jsonl", "--output", output, "--max-size", "1MB",
                env=cli_env), output, f"s3://{s3_bucket}/d.jsonl:2", "longer than 1.0 MB")
    refused(cli("pack", f"s3://{s3_bucket}/photos/", "--output", output, "--max-size", "1MB",
                env=cli_env), output, f"s3://{s3_bucket}/photos/b.jpg", "1.0 MB")
    import pyarrow

    small = pyarrow.array([f"row {i}" for i in range(100)])
    texts = pyarrow.concat_arrays([small[:50], _repeated(1, 100 << 20), small[50:]])
    source = _parquet(tmp_path / "mixed.parquet", texts, use_dictionary=False)
    client.put_object(Bucket=s3_bucket, Key="t.parquet", Body=source.read_bytes())
    refused(cli("pack", f"s3://{s3_bucket}/t.parquet", "--output", output, "--max-size",
                "10MB", env=cli_env, limit=PARQUET_LIMIT), output,
            f"s3://{s3_bucket}/t.parquet rows 1-101 (column text)", "64 MiB")


# --- Parquet: sizes from the page headers, before a row group is decoded ---------------------


def _parquet(path: Path, texts, **options) -> Path:
    import pyarrow
    import pyarrow.parquet

    table = pyarrow.table({"id": pyarrow.array(range(len(texts)), pyarrow.int64()),
                           "text": pyarrow.chunked_array([texts])})
    options = {"compression": "zstd", "write_statistics": False, **options}
    pyarrow.parquet.write_table(table, path, **options)
    return path


def _repeated(count: int, size: int):
    """``count`` strings of ``size`` bytes, built in Arrow (no Python string that large)."""
    import pyarrow
    import pyarrow.compute

    return pyarrow.compute.binary_repeat(pyarrow.array(["x"] * count), size)


@pytest.fixture(scope="module")
def one_huge_cell(tmp_path_factory) -> Path:
    """A few kB of Parquet: one row whose text is 600 MiB."""
    return _parquet(tmp_path_factory.mktemp("parquet") / "cell.parquet", _repeated(1, 600 << 20),
                    use_dictionary=False)


@pytest.mark.slow
def test_a_huge_parquet_cell_is_refused_from_the_page_headers(one_huge_cell, tmp_path,
                                                               cli_env):
    assert one_huge_cell.stat().st_size < 100_000
    output = tmp_path / "out"
    error = refused(cli("pack", one_huge_cell, "--output", output, env=cli_env,
                        limit=PARQUET_LIMIT), output, f"{one_huge_cell} row 1", "256 MiB")
    assert "629,1" in error  # its size, as the pages declare it


@pytest.mark.slow
def test_a_huge_parquet_cell_among_small_rows_is_refused_before_decoding(tmp_path):
    import pyarrow

    small = pyarrow.array([f"row {i}" for i in range(1000)])
    texts = pyarrow.concat_arrays([small[:500], _repeated(1, 300 << 20), small[500:]])
    source = _parquet(tmp_path / "mixed.parquet", texts, use_dictionary=False)
    output = tmp_path / "out"
    refused(pack(source, output, limit=PARQUET_LIMIT), output, str(source), "(column text)",
            "the largest page")
    # a cell above --max-size but in a page pack may decode: refused by row, as decoded
    texts = pyarrow.concat_arrays([small[:700], _repeated(1, 20 << 20), small[700:]])
    for options in ({}, {"use_dictionary": True}, {"data_page_version": "2.0"}):
        source = _parquet(tmp_path / "medium.parquet", texts, **options)
        refused(pack(source, output, limit=PARQUET_LIMIT, max_size="10MB"), output,
                f"{source} row 701", "10.0 MB")


def test_parquet_with_ordinary_rows_packs_as_before(tmp_path):
    import pyarrow.parquet

    texts = [f"text {i} " * (i % 50) for i in range(5000)]
    source = _parquet(tmp_path / "ok.parquet", texts, row_group_size=1500,
                      data_page_size=4096)
    output = tmp_path / "out"
    result = pack(source, output, limit=PARQUET_LIMIT, max_count=1000)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((output / "index.json").read_text())
    assert manifest["samples"] == 5000
    rows = pyarrow.parquet.read_table(source).to_pylist()
    assert rows[4999]["text"].encode() in written(output)


def test_a_parquet_file_with_broken_page_headers_is_an_input_error(tmp_path):
    texts = [f"text {i}" for i in range(100)]
    source = _parquet(tmp_path / "broken.parquet", texts)
    data = bytearray(source.read_bytes())
    data[4:40] = b"\xff" * 36  # the first column chunk's first page header
    source.write_bytes(bytes(data))
    output = tmp_path / "out"
    refused(pack(source, output, limit=PARQUET_LIMIT), output, str(source))
