"""No hidden channels: what a stream reports (positions, reader counters) and how batches are
collated travel in objects handed to the code that reads them, never in module globals, so
loaders and datasets iterated side by side in one process never see each other's."""

from __future__ import annotations

import ast
import hashlib
import io
from pathlib import Path

import pytest
import torch

import wdstream
from wdstream.shards.manifest import Manifest, ShardInfo
from wdstream.shards.tar_writer import TarWriter

pytestmark = pytest.mark.usefixtures("single_rank")

SAMPLES = 12


def _write(folder: Path, broken: set[int] = frozenset()) -> str:
    """One shard of samples with a raw ``bin`` member and a ``json`` one; the samples in
    ``broken`` have JSON that does not parse (skipped under ``on_error="skip"``)."""
    folder.mkdir()
    buffer = io.BytesIO()
    writer = TarWriter(buffer)
    for i in range(SAMPLES):
        writer.add(f"k{i:03d}.bin", bytes([i]) * (100 + i))
        writer.add(f"k{i:03d}.json", b"{broken" if i in broken else f'{{"i": {i}}}'.encode())
    writer.close()
    data = buffer.getvalue()
    (folder / "shard-000000.tar").write_bytes(data)
    info = ShardInfo("shard-000000.tar", SAMPLES, len(data), hashlib.sha256(data).hexdigest())
    (folder / "index.json").write_text(Manifest([info], ["bin", "json"]).to_json())
    return str(folder)


def _loader(source, **kwargs):
    dataset = wdstream.StreamingDataset(source, shuffle=False, on_error="skip")
    return wdstream.DataLoader(dataset, batch_size=2, num_workers=0, **kwargs)


def test_loaders_iterated_side_by_side_keep_their_own_delivery_positions_and_stats(tmp_path):
    """Two loaders in one process, one delivering tensors and skipping a broken sample, one
    delivering bytes, iterated in turns with a dataset iterated directly in between: each gets
    its own kind of values, states equal to those of a loader iterated alone, and its own
    counters."""
    broken = _write(tmp_path / "broken", broken={3})
    clean = _write(tmp_path / "clean")
    alone_tensor, alone_bytes = _loader(broken, bytes_as="tensor"), _loader(clean)
    expected_tensor, expected_bytes = [], []
    for loader, states in ((alone_tensor, expected_tensor), (alone_bytes, expected_bytes)):
        for _batch in loader:
            states.append(loader.state_dict())

    tensors, raw = _loader(broken, bytes_as="tensor"), _loader(clean)
    direct = wdstream.StreamingDataset(broken, shuffle=False, on_error="skip")
    first, second = iter(tensors), iter(raw)
    states_tensor, states_bytes, keys = [], [], []
    for step in range(max(len(expected_tensor), len(expected_bytes))):
        if step == 1:  # a direct iteration that skips a sample, while both loaders are open
            assert len(list(direct)) == SAMPLES - 1
        for iterator, loader, states in ((first, tensors, states_tensor),
                                         (second, raw, states_bytes)):
            batch = next(iterator, None)
            if batch is None:
                continue
            kind = torch.Tensor if loader is tensors else bytes
            assert all(isinstance(value, kind) for value in batch["bin"])
            keys.extend(batch["__key__"])
            states.append(loader.state_dict())
    assert states_tensor == expected_tensor and states_bytes == expected_bytes
    assert tensors.stats["skipped_samples"] == 1 and raw.stats["skipped_samples"] == 0
    assert direct.stream_context.stats.take()["skipped_samples"] == 1
    assert len(keys) == 2 * SAMPLES - 1


def test_two_iterations_of_one_loader_keep_their_own_positions(tmp_path):
    """Two iterators of one loader, open at once without workers, tag their batches with
    their own streams' positions."""
    loader = _loader(_write(tmp_path / "data"))
    first = iter(loader)
    assert next(first)["__key__"] == ["k000", "k001"]
    second = iter(loader)
    assert next(second)["__key__"] == ["k000", "k001"]
    assert next(first)["__key__"] == ["k002", "k003"]
    assert loader.state_dict()["positions"] == [4]
    assert next(second)["__key__"] == ["k002", "k003"]


# The runtime's process-wide registries, each by nature one per process: the shared-memory
# arenas of a worker and the segments the main process keeps mapped (keyed by process id),
# the iterators to close before the interpreter exits, and the tensors of the process's last
# collective (kept past any loader: the process group's thread must never free them).
PROCESS_WIDE = {("shm.py", "_arenas"), ("shm.py", "_kept"), ("positioned.py", "_open"),
                ("ranks.py", "_last_gather")}


IMMUTABLE_CALLS = {"object", "logging.getLogger", "frozenset", "tuple", "field"}


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp,
                          ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and ast.unparse(value.func) not in IMMUTABLE_CALLS


def test_the_runtime_holds_no_module_level_mutable_state():
    """Every module of ``wdstream.stream``: no ``global`` statement, no module-level name (nor
    class attribute) bound to a list, dict, set or object made at import time, apart from the
    process-wide registries above. Constants in capitals may be tables."""
    found = []
    for path in sorted(Path(wdstream.__file__).parent.joinpath("stream").rglob("*.py")):
        tree = ast.parse(path.read_text())
        found += [f"{path.name}:{node.lineno}: global {', '.join(node.names)}"
                  for node in ast.walk(tree) if isinstance(node, ast.Global)]
        scopes = [(None, tree.body)] + [(node.name, node.body) for node in tree.body
                                        if isinstance(node, ast.ClassDef)]
        for owner, body in scopes:
            for node in body:
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
                for target in targets:
                    name = ast.unparse(target)
                    if name.isupper() or name == "__all__" or (path.name, name) in PROCESS_WIDE:
                        continue
                    if _mutable(node.value):
                        found.append(f"{path.name}:{node.lineno}: "
                                     f"{owner + '.' if owner else ''}{name}")
    assert not found, "module-level mutable state:\n" + "\n".join(found)
