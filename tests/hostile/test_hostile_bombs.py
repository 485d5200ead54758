"""Hostile data that expands: compressed shards and members that decompress enormously,
decoded members (JSON, text, arrays, images) that take far more memory than their bytes, and
image members that would make Pillow run a program. Each attack runs in a subprocess under a
memory limit (RLIMIT_AS: what the process maps after its imports plus HEADROOM) and a
timeout, and must end in wdstream's own error naming the shard, the member and the limit,
with its memory and time bounded and no program run."""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.support.hostile import wdstream
from wdstream.shards.identity import head_digest
from wdstream.shards.tar_writer import TarWriter

HEADROOM = 3 << 29  # 1.5 GiB beyond the imports (torch maps about 0.6 GiB)
CLAIM = 3 << 29  # a member that claims 1.5 GiB
MiB = 1 << 20

# Runs each case's code (with ``paths`` and ``Limits`` defined) under the limit, in one
# process (torch is imported once); prints what each raised, its time and how far the peak
# RSS grew during it.
_RUNNER = textwrap.dedent("""
    import json, os, resource, sys, time
    import numpy, PIL.Image, torch
    import wdstream
    from wdstream import Limits
    from wdstream.stream.load.dataset import StreamingDataset

    def mapped():
        return int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")

    cap = mapped() + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    for code, paths in json.loads(sys.argv[2]):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.monotonic()
        outcome = {"error": None}
        try:
            exec(code)
        except wdstream.WdstreamError as error:
            outcome = {"error": type(error).__name__, "message": str(error)}
        except MemoryError:
            outcome = {"error": "MemoryError"}
        outcome["seconds"] = time.monotonic() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        outcome["grown"] = max(peak - before, 0) * 1024
        print(json.dumps(outcome), flush=True)
""")


def run_limited(*cases, env=None, timeout: float = 240) -> list[dict]:
    """Run each ``(code, paths)`` in one fresh Python under the memory limit: for each, what
    it raised (``error``, ``message``), its ``seconds`` and how far the peak RSS ``grown``."""
    given = [(textwrap.dedent(code), [str(path) for path in paths]) for code, paths in cases]
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(HEADROOM), json.dumps(given)],
        capture_output=True, text=True, timeout=timeout, env=env,
        cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert len(outcomes) == len(cases), result.stdout
    return outcomes


def read_all(decode="False", limits="None") -> str:
    """Code iterating a StreamingDataset over ``paths`` (shard files, or a folder)."""
    source = "paths[0] if len(paths) == 1 else paths"
    return (f"for _ in StreamingDataset({source}, shuffle=False, decode={decode}, "
            f"limits={limits}): pass")


def assert_refused(outcome: dict, *words: str, seconds: float = 30) -> None:
    """A LimitError naming each of ``words``, bounded memory and time."""
    assert outcome["error"] == "LimitError", outcome
    for word in words:
        assert word in outcome["message"], (word, outcome["message"])
    assert outcome["grown"] < HEADROOM, outcome
    assert outcome["seconds"] < seconds, outcome


# ---- building hostile shards -------------------------------------------------------------


def header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def compressor(kind: str):
    """(compress, flush) of a streaming compressor of ``kind``."""
    if kind == "gz":
        made = zlib.compressobj(1, zlib.DEFLATED, 31)
    elif kind == "bz2":
        made = bz2.BZ2Compressor(1)
    elif kind == "xz":
        made = lzma.LZMACompressor(preset=0)
    else:
        import zstandard

        made = zstandard.ZstdCompressor(level=1).compressobj()
    return made.compress, made.flush


CODECS = ("gz", "bz2", "xz", "zst")


def compressed(kind: str, pieces) -> bytes:
    compress, flush = compressor(kind)
    return b"".join([*(compress(piece) for piece in pieces), flush()])


def zeros(size: int):
    while size > 0:
        yield bytes(min(size, MiB))
        size -= MiB


def claim_bomb(kind: str) -> bytes:
    """A compressed tar whose one member claims 1.5 GiB; only its first MiB follows."""
    return compressed(kind, [header("bomb.bin", CLAIM), bytes(MiB)])


def tar_of(members) -> bytes:
    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for name, payload in members:
        writer.add(name, payload)
    writer.close()
    return buffer.getvalue()


def repeated_gzip(first: bytes, repeated: bytes, times: int, last: bytes = b"") -> bytes:
    """A gzip member of ``first + repeated * times + last`` made from one compressed copy of
    ``repeated`` (after a full flush each copy compresses to the same bytes)."""
    made = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = made.compress(first) + made.flush(zlib.Z_FULL_FLUSH)
    block = made.compress(repeated) + made.flush(zlib.Z_FULL_FLUSH)
    check = zlib.crc32(first)
    for _ in range(times):
        check = zlib.crc32(repeated, check)
    check = zlib.crc32(last, check)
    size = len(first) + len(repeated) * times + len(last)
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + head + block * times
            + made.compress(last) + made.flush()
            + check.to_bytes(4, "little") + (size & 0xFFFFFFFF).to_bytes(4, "little"))


def write_with_manifest(folder: Path, name: str, stored: bytes, tar_head: bytes, samples: int,
                        last_key: str, extensions) -> Path:
    """A shard and a manifest whose bytes, sha256, head and last key all match it."""
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(stored)
    shard = {"url": name, "samples": samples, "bytes": len(stored),
             "sha256": hashlib.sha256(stored).hexdigest(), "head": head_digest(tar_head),
             "last_key": last_key}
    (folder / "index.json").write_text(json.dumps({
        "format": "wdstream", "version": 1, "samples": samples, "bytes": len(stored),
        "extensions": list(extensions), "shards": [shard]}))
    return folder


# ---- compressed shards ---------------------------------------------------------------------


@pytest.mark.slow
def test_compressed_shard_bombs(tmp_path):
    """Every codec: a member that claims 1.5 GiB is refused before it is read (by default); a
    shard that decompresses past shard_bytes is refused while decompressing; a zstd window or
    xz dictionary past decoder_memory is refused; a shard within the limits reads."""
    claims, big = [], []
    for kind in CODECS:
        claims.append(tmp_path / f"bomb.tar.{kind}")
        claims[-1].write_bytes(claim_bomb(kind))
        big.append(tmp_path / f"big.tar.{kind}")
        members = [header(f"{i:03d}.bin", MiB) + bytes(MiB) for i in range(24)]
        big[-1].write_bytes(compressed(kind, [*members, bytes(1024)]))
    window = tmp_path / "window.tar.zst"  # a frame asking for a 2 GiB window (window log 31)
    window.write_bytes((0xFD2FB528).to_bytes(4, "little") + bytes([0x00, 0xA8])
                       + ((512 << 3) | 1).to_bytes(3, "little") + b"x" * 512)
    xz = tmp_path / "dict.tar.xz"  # an 8 MiB dictionary
    xz.write_bytes(lzma.compress(tar_of([("a.txt", b"x")]), preset=6))
    fits = """
        samples = list(StreamingDataset(paths[0], shuffle=False, decode=False,
                                        limits=Limits(shard_bytes='25MiB', sample_bytes='1MiB')))
        assert len(samples) == 24 and all(len(s["bin"]) == 1 << 20 for s in samples)
    """
    outcomes = run_limited(
        *[(read_all(), [shard]) for shard in claims],
        *[(read_all(limits="Limits(shard_bytes='8MiB')"), [shard]) for shard in big],
        (read_all(), [window]),
        (read_all(limits="Limits(decoder_memory='1MiB')"), [xz]),
        (read_all(), [xz]),
        (fits, [big[3]]))
    for shard, outcome in zip(claims, outcomes[:4], strict=True):
        assert_refused(outcome, str(shard), "'bomb.bin'", "1,610,612,736", "sample_bytes")
        assert outcome["message"].endswith("the limit sample_bytes of wdstream.Limits)")
    for shard, outcome in zip(big, outcomes[4:8], strict=True):
        assert_refused(outcome, str(shard), "decompresses to more than 8,388,608 bytes",
                       "shard_bytes", ", reading ")
    for shard, outcome in zip([window, xz], outcomes[8:10], strict=True):
        assert_refused(outcome, str(shard), "decompressor memory", "decoder_memory")
    assert outcomes[10]["error"] is None and outcomes[11]["error"] is None, outcomes[10:]


@pytest.mark.slow
def test_the_zstd_bomb_with_a_matching_manifest(tmp_path):
    """The reported shard: 50 KB of zstd, one member of 1.5 GiB of zeros, and a manifest whose
    bytes, sha256, head and last key all match it."""
    first = header("k.bin", CLAIM) + bytes(4096)
    tail = bytes(-CLAIM % 512) + bytes(1024)
    stored = compressed("zst", [first, *zeros(CLAIM - 4096), tail])
    assert len(stored) < 100_000
    folder = write_with_manifest(tmp_path / "ds", "bomb.tar.zst", stored, first, 1, "k", ["bin"])
    [outcome] = run_limited((read_all(), [folder]))
    assert_refused(outcome, "bomb.tar.zst", "'k.bin'", "sample_bytes")


# ---- decoded members -------------------------------------------------------------------------


@pytest.mark.slow
def test_decoded_member_bombs(tmp_path):
    """What decoding makes is bounded per sample, before it is made: gzip members (three of
    400 MiB in one sample; one of 1.5 GiB), a .json.gz of 22 million values, arrays whose
    header claims more than follows or more than the sample may take, text."""
    shards = {name: tmp_path / f"{name}.tar" for name in
              ("three", "txt", "json", "npy", "npygz", "text")}
    member = repeated_gzip(b"", bytes(MiB), 400)  # 400 KB
    shards["three"].write_bytes(tar_of([(f"k.{name}.gz", member) for name in "abc"]))
    shards["txt"].write_bytes(tar_of([("k.txt.gz", repeated_gzip(b"", bytes(MiB), 1536))]))
    json_gz = repeated_gzip(b"[", b"{}," * 349_525, 63, b"{}]")  # 66 MB of ``[{},{},...]``
    assert len(json_gz) < 100_000
    shards["json"].write_bytes(tar_of([("k.json.gz", json_gz)]))
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f8", "fortran_order": False, "shape": (10**10, 3)})
    shards["npy"].write_bytes(tar_of([("k.npy", buffer.getvalue() + bytes(64))]))
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(4 * MiB, np.float32))  # 16 MiB
    shards["npygz"].write_bytes(tar_of([("k.npy.gz", zlib.compress(buffer.getvalue(),
                                                                   wbits=31))]))
    shards["text"].write_bytes(tar_of([("k.txt", "\U0001F600".encode() + bytes(3 * MiB))]))
    small = "Limits(sample_bytes='24MiB')"
    three, txt, json_bomb, npy, npygz, text = run_limited(
        *[(read_all(decode="True"), [shards[name]]) for name in
          ("three", "txt", "json", "npy")],
        (read_all(decode="True", limits=small), [shards["npygz"]]),
        (read_all(decode="True", limits="Limits(sample_bytes='8MiB')"), [shards["text"]]))
    assert_refused(three, str(shards["three"]), "sample 'k'", "cannot decode .c.gz",
                   "sample_bytes")
    assert_refused(txt, str(shards["txt"]), "cannot decode .txt.gz",
                   "gzip data expands to more than", "sample_bytes")
    assert_refused(json_bomb, "cannot decode .json.gz", "bytes of JSON", "sample_bytes")
    assert npy["error"] == "ShardError", npy  # what follows its header is too short
    assert "cannot decode .npy: the header says 240,000,000,000 bytes" in npy["message"]
    assert npy["grown"] < 1 << 28
    assert_refused(npygz, "cannot decode .npy.gz", "an array of 16,777,216 bytes",
                   "sample_bytes")
    assert_refused(text, "cannot decode .txt", "as a str", "sample_bytes")


# ---- images ----------------------------------------------------------------------------------


def image_bytes(size, format: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1" if format != "JPEG" else "L", size).save(buffer, format=format)
    return buffer.getvalue()


EPS = b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 10 10
newpath 0 0 moveto 10 10 lineto stroke
showpage
%%EOF
"""


def fake_ghostscript(tmp_path: Path) -> tuple[dict, Path]:
    """An environment whose PATH starts with a ``gs`` that only leaves a marker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "GHOSTSCRIPT-RAN"
    gs = bin_dir / "gs"
    gs.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    gs.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return env, marker


@pytest.mark.slow
def test_image_bombs(tmp_path):
    """A 12000x12000 image (a 140 KB PNG would take 4.5 GB under decode="rgb") in each
    format is refused from its header; a 6000x6000 one past the sample's budget as float
    RGB, not as uint8; PostScript named .jpg is not read, and no program runs."""
    formats = ("PNG", "GIF", "BMP", "TIFF", "JPEG")
    shards = {}
    for format in formats:
        shards[format] = tmp_path / f"{format}.tar"
        shards[format].write_bytes(tar_of([("k.jpg", image_bytes((12000, 12000), format))]))
    shards["budget"] = tmp_path / "budget.tar"
    shards["budget"].write_bytes(tar_of([("k.png", image_bytes((6000, 6000), "PNG"))]))
    shards["eps"] = tmp_path / "eps.tar"
    shards["eps"].write_bytes(tar_of([("k.jpg", EPS)]))
    env, marker = fake_ghostscript(tmp_path)
    *pixels, budget, fits, eps = run_limited(
        *[(read_all(decode="'rgb'"), [shards[format]]) for format in formats],
        (read_all(decode="'rgb'"), [shards["budget"]]),
        (read_all(decode="'l8'"), [shards["budget"]]),
        (read_all(decode="'rgb8'"), [shards["eps"]]), env=env)
    for format, outcome in zip(formats, pixels, strict=True):
        assert_refused(outcome, str(shards[format]), "cannot decode .jpg", "12000x12000",
                       "image_pixels")
    assert_refused(budget, "cannot decode .png", "6000x6000 image takes", "sample_bytes")
    assert fits["error"] is None, fits
    assert eps["error"] == "ShardError" and "cannot decode .jpg" in eps["message"], eps
    assert not marker.exists(), "Pillow ran gs on data from a shard"
    # the same bytes opened with every format allowed do run it: the test can fail
    control = "import sys, PIL.Image; PIL.Image.open(sys.argv[1]).load()"
    (tmp_path / "a.eps").write_bytes(EPS)
    subprocess.run([sys.executable, "-c", control, str(tmp_path / "a.eps")], env=env,
                   capture_output=True, timeout=60)
    assert marker.exists()


def test_formats_that_run_programs_cannot_be_allowed():
    from wdstream import Limits
    from wdstream.errors import OptionError
    from wdstream.stream.read.decode import ImageDecoder

    with pytest.raises(OptionError, match="EPS is never read"):
        Limits(image_formats=("JPEG", "eps"))
    with pytest.raises(OptionError, match="Pillow reads no NOPE"):
        ImageDecoder("rgb8", Limits(image_formats=("NOPE",)))


# ---- the commands ----------------------------------------------------------------------------


def limited_command(*args, code: int, env: dict) -> str:
    """The installed command under the memory limit (absolute: the CLI imports no torch)."""
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (HEADROOM, HEADROOM))

    exe = os.path.join(os.path.dirname(sys.executable), "wdstream")
    result = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env,
                            timeout=60, preexec_fn=limit)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    return result.stdout + result.stderr


@pytest.mark.parametrize("command", [("verify", "--deep"), ("index",), ("cat",)])
def test_commands_refuse_a_claim_bomb(tmp_path, cli_env, command):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "bomb.tar.zst").write_bytes(claim_bomb("zst"))
    out = limited_command(*command, folder, code=1, env=cli_env)
    assert "'bomb.bin'" in out and "sample_bytes" in out, out


@pytest.mark.parametrize("command", [("verify", "--deep"), ("index",), ("cat",)])
@pytest.mark.slow
def test_commands_take_the_limits_as_options(tmp_path, cli_env, command):
    folder = tmp_path / "ds"
    folder.mkdir()
    members = [(f"{i:03d}.bin", bytes(MiB)) for i in range(24)]
    (folder / "big.tar.gz").write_bytes(compressed("gz", [tar_of(members)]))
    out = limited_command(*command, folder, "--max-shard-bytes", "8MiB", code=1, env=cli_env)
    assert "decompresses to more than 8,388,608 bytes" in out and "shard_bytes" in out, out
    out = limited_command(*command, folder, "--max-sample-bytes", "512KiB", code=1,
                          env=cli_env)
    assert "'000.bin'" in out and "sample_bytes" in out, out
    limited_command(*command, folder, code=0, env=cli_env)


def test_cat_bounds_what_it_decodes(tmp_path, cli_env):
    shard = tmp_path / "gz.tar"
    shard.write_bytes(tar_of([("k.txt.gz", repeated_gzip(b"", bytes(MiB), 8))]))
    out = wdstream("cat", shard, "--max-sample-bytes", "4MiB", env=cli_env).stdout
    error = json.loads(out)["txt.gz"]["decode_error"]
    assert "gzip data expands to more than" in error and "sample_bytes" in error
