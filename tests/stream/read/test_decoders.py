"""The decoders webdataset users expect, through the real loader: ints, gzip members decoded by
their inner extension, msgpack, .pth only when asked for, and images decoded with Pillow in
the workers into arrays or tensors that collate into one batch tensor; a user's map runs after
decoding, in the workers."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle

import msgpack
import numpy as np
import pytest
import torch
from PIL import Image

import wdstream as wds
from tests.cli.test_inspect import wdstream
from wdstream.errors import ShardError
from wdstream.shards.tar_writer import TarWriter
from wdstream.stream.read.decode import IMAGE_MODES, build_decoders, decode_sample

H, W = 24, 40


def jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def png_gray(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((H, W), seed, dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision") / "v.tar"
    with open(path, "wb") as f:
        writer = TarWriter(f)
        for i in range(12):
            writer.add(f"k{i:02d}.jpg", jpeg(i))
            writer.add(f"k{i:02d}.mask.png", png_gray(i))
            writer.add(f"k{i:02d}.cls", b"%d" % (i % 3))
            writer.add(f"k{i:02d}.txt.gz", gzip.compress(f"caption {i}".encode()))
        writer.close()
    return str(path)


def sample(**members) -> dict:
    return {"__key__": "k", "__url__": "u.tar", **members}


def test_default_table():
    table = build_decoders(None)
    pth = io.BytesIO()
    torch.save({"w": torch.ones(2)}, pth)
    got = decode_sample(sample(**{
        "cls": b"3", "cls2": b"7", "index": b"12", "id": b"5", "jsn": b'{"a": 1}',
        "json.gz": gzip.compress(b'{"b": 2}'), "txt.gz": gzip.compress(b"hi"),
        "seg.txt": b"x", "gz": gzip.compress(b"raw"), "mp": msgpack.packb({"c": [1, 2]}),
        "msgpack": msgpack.packb("s"), "pth": pth.getvalue(), "pyd": pickle.dumps(1),
        "jpg": b"not decoded by default",
    }), table)
    assert got["cls"] == 3 and got["cls2"] == 7 and got["index"] == 12 and got["id"] == 5
    assert got["jsn"] == {"a": 1} and got["json.gz"] == {"b": 2} and got["txt.gz"] == "hi"
    assert got["seg.txt"] == "x" and got["gz"] == b"raw"
    assert got["mp"] == {"c": [1, 2]} and got["msgpack"] == "s"
    # nothing unpickles, and images stay bytes, unless asked for
    assert got["pth"] == pth.getvalue() and got["pyd"] == pickle.dumps(1)
    assert got["jpg"] == b"not decoded by default"
    opted = decode_sample(sample(pth=pth.getvalue(), pyd=pickle.dumps(1)),
                          build_decoders({"pth": "torch", "pyd": "pickle"}))
    assert torch.equal(opted["pth"]["w"], torch.ones(2)) and opted["pyd"] == 1


def test_bad_members_are_clear_errors():
    table = build_decoders(None)
    with pytest.raises(ShardError, match=r"u.tar: sample 'k': cannot decode .txt.gz"):
        decode_sample(sample(**{"txt.gz": gzip.compress(b"abc")[:-6]}), table)
    with pytest.raises(ShardError, match="cannot decode .cls"):
        decode_sample(sample(cls=b"x"), table)
    with pytest.raises(ShardError, match="cannot decode .jpg"):
        decode_sample(sample(jpg=b"\xff\xd8 broken"), build_decoders(None, "rgb8"))


def test_gzip_bomb_member_is_refused():
    with pytest.raises(ShardError, match="expands to more than .*sample_bytes"):
        decode_sample(sample(**{"txt.gz": gzip.compress(bytes(2 << 20))}), build_decoders(None),
                      sample_bytes=1 << 20)


@pytest.mark.parametrize("mode, kind, shape, dtype", [
    ("rgb8", np.ndarray, (H, W, 3), np.uint8),
    ("rgb", np.ndarray, (H, W, 3), np.float32),
    ("l8", np.ndarray, (H, W), np.uint8),
    ("torchrgb8", torch.Tensor, (3, H, W), torch.uint8),
    ("torchrgb", torch.Tensor, (3, H, W), torch.float32),
    ("torch", torch.Tensor, (3, H, W), torch.float32),
])
def test_image_modes(mode, kind, shape, dtype):
    value = decode_sample(sample(jpg=jpeg(1)), build_decoders(None, mode))["jpg"]
    assert isinstance(value, kind) and tuple(value.shape) == shape and value.dtype == dtype
    if dtype in (np.float32, torch.float32):
        assert 0.0 <= float(value.min()) and float(value.max()) <= 1.0


def test_pil_modes():
    image = decode_sample(sample(png=png_gray(9)), build_decoders(None, "pil"))["png"]
    assert isinstance(image, Image.Image) and image.mode == "L" and image.size == (W, H)
    assert decode_sample(sample(png=png_gray(9)), build_decoders(None, "pilrgb"))["png"].mode \
        == "RGB"
    assert set(IMAGE_MODES) >= {"pil", "rgb8", "torchrgb", "torchrgb8", "l8"}


def test_bad_decode_fails_when_built(vision):
    with pytest.raises(ValueError, match="decode='rgb9' is not accepted; use one of True, False, 'pil'"):
        wds.StreamingDataset([vision], decode="rgb9")
    with pytest.raises(ValueError, match="decode=3 is not accepted"):
        wds.StreamingDataset([vision], decode=3)


def _in_worker(sample):
    info = torch.utils.data.get_worker_info()
    assert isinstance(sample["jpg"], torch.Tensor)  # decoded before the map
    sample["worker"] = -1 if info is None else info.id
    sample["pid"] = os.getpid()
    return sample


@pytest.mark.parametrize("mode", ["torchrgb8", "rgb8"])
def test_vision_batches_collate_into_one_tensor_in_the_workers(vision, mode):
    width = -1 if mode == "torchrgb8" else -2

    def flip(s):  # a torchvision-style transform, on the decoded image
        return _in_worker({**s, "jpg": torch.as_tensor(s["jpg"]).flip(width)})

    ds = wds.StreamingDataset([vision], decode=mode, shuffle=False, map=flip)
    batches = list(wds.DataLoader(ds, batch_size=4, num_workers=2))
    assert len(batches) == 3
    for batch in batches:
        image = batch["jpg"]
        assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8
        assert tuple(image.shape) == ((4, 3, H, W) if mode == "torchrgb8" else (4, H, W, 3))
        assert tuple(batch["mask.png"].shape)[0] == 4  # grayscale PNGs too
        assert batch["cls"].dtype == torch.int64 and isinstance(batch["txt.gz"][0], str)
        assert set(batch["worker"].tolist()) <= {0, 1}
        assert os.getpid() not in batch["pid"].tolist()
    reference = Image.open(io.BytesIO(jpeg(0))).convert("RGB")
    first = batches[0]["jpg"][0]
    first = first if mode == "rgb8" else first.permute(1, 2, 0)
    assert np.array_equal(first.numpy(), np.asarray(reference)[:, ::-1])


def test_cat_shows_gzip_members_decoded(vision):
    line = json.loads(wdstream("cat", vision, "-n", "1").stdout)
    assert line["txt.gz"] == "caption 0" and line["cls"] == 0 and line["jpg"]["bytes"] > 100


@pytest.mark.slow
def test_bench_decodes_images(vision, tmp_path):
    import shutil

    folder = tmp_path / "v"
    folder.mkdir()
    shutil.copy(vision, folder / "v.tar")
    wdstream("index", folder, "--quiet")
    result = json.loads(wdstream("bench", folder, "--images", "torchrgb8", "--json",
                                 "--workers", "1", "-b", "4").stdout)
    assert result["samples"] == 12 and result["decode"] == "torchrgb8"
    assert "--images" in wdstream("bench", folder, "--images", "nope", code=2).stderr
