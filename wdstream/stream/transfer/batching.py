"""Making batches in DataLoader workers: the default collate, the shared-memory transfer of
large ``bytes`` members (pickled bytes are copied through the worker pipe; a tensor in shared
memory crosses it as a file descriptor), and the malloc settings where payloads pass."""

from __future__ import annotations

import gc
import itertools
import os
import weakref
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import torch
import torch.utils.data

from wdstream.errors import ShardError
from wdstream.options import CHOICES
from wdstream.stream.read.decode import decode_error, json_member
from wdstream.stream.transfer.deferred import Deferred, JsonColumn
from wdstream.stream.transfer.shm import (
    FileSpan,
    MemorySegment,
    SharedSpan,
    WorkerFile,
    allocate,
    arena,
    keep_mapped,
    linux_libc,
    mapped,
    release,
    unmap,
)
from wdstream.stream.transfer.torch_internals import new_shared_storage


def collate(samples: list[dict], *, pooled: bool = False, arena_tensors: bool = False,
            json_names=()) -> dict:
    """The default collate: a dict of lists (``batch["__key__"]`` is the list of keys), where
    arrays and tensors of one shape become one stacked tensor (which travels from workers
    through shared memory) and numbers become a tensor.

    Args:
        samples: the batch's samples, dicts with the same members.
        pooled: large ``bytes`` members go into the worker's reused shared memory
            (``wdstream.DataLoader`` asks for it under ``bytes_as="tensor"``).
        arena_tensors: in a worker, stacked tensors are made in the worker's reused shared
            memory and cross as ``SharedTensor`` (``wdstream.DataLoader``'s default collate,
            whose main process turns them back into tensors with ``unpack_shared``).
        json_names: members whose ``bytes`` are JSON left for the main process to decode
            (``stream.transfer.deferred.DeferringDecoder``)."""
    if len(set(map(len, samples))) > 1:  # with a KeyError below: the members differ
        raise _members_differ(samples)
    batch = {}
    for name in samples[0]:
        try:
            values = list(map(itemgetter(name), samples))
        except KeyError:
            raise _members_differ(samples) from None
        batch[name] = _column(values, samples, name, name in json_names, (pooled, arena_tensors))
    return batch



def collate_fetch(samples: list[dict], size: int, *, pooled: bool = False,
                  json_names=()) -> list[dict]:
    """``collate`` of each ``size`` samples of a fetch in turn (the last batch may be short),
    as a worker's default collate: the same batches, with each member's column taken from the
    fetch once, and the columns every batch keeps as they are (keys, URLs, text; JSON left for
    the main process) cut from it rather than made batch by batch."""
    starts = range(0, len(samples), size)
    if len(samples) <= size or len(set(map(len, samples))) > 1:  # one batch, or an error
        return [collate(samples[start:start + size], pooled=pooled, arena_tensors=True,
                        json_names=json_names) for start in starts]
    batches: list[dict] = [{} for _ in starts]
    for name in samples[0]:
        try:
            values = list(map(itemgetter(name), samples))
        except KeyError:  # members that differ: the batch that has them says which
            return [collate(samples[start:start + size], pooled=pooled, arena_tensors=True,
                            json_names=json_names) for start in starts]
        types = set(map(type, values))
        columns: list
        if types == _TEXT:
            columns = [values[start:start + size] for start in starts]
        elif types == _BYTES_ONLY and name in json_names:
            columns = [JsonColumn(values[start:start + size]) for start in starts]
        else:
            columns = [_column(values[start:start + size], samples[start:start + size], name,
                               name in json_names, (pooled, True)) for start in starts]
        for batch, column in zip(batches, columns, strict=True):
            batch[name] = column
    return batches


def _column(values: list, samples: list[dict], name: str, json_bytes: bool,
            shared: tuple[bool, bool]):
    """Member ``name``'s column: JSON left undecoded crosses as one ``JsonColumn`` (decoded by
    the main process) unless a large member sits beside it, then it is decoded here; the
    other values are collated by their type (``_collated``)."""
    types = set(map(type, values))  # one pass in C, where each check was one
    kind = bytes if json_bytes else Deferred if Deferred in types else None
    if kind is not None and kind in types:
        if len(types) == 1:
            return JsonColumn(values if kind is bytes else [v.data for v in values])
        values = _decoded(values, samples, name, kind)
        types = set(map(type, values))
    return _collated(values, types, shared)


def _collated(values: list, types: set, shared: tuple[bool, bool]):
    """Keys, URLs and text stay a list; tensors and numeric arrays of one shape are stacked;
    numbers of one type become a tensor; large ``bytes`` go to shared memory in a worker.
    ``shared``: ``collate``'s ``pooled`` and ``arena_tensors``."""
    import numpy as np

    first = values[0]
    pooled, arena_tensors = shared
    if len(types) == 1 and (types <= _TEXT):  # keys, URLs, text: the usual columns
        return values
    if isinstance(first, torch.Tensor) and all(v.shape == first.shape for v in values):
        return _stack(values, arena_tensors)
    if isinstance(first, np.ndarray) and first.dtype.kind in "biuf" and all(
            v.shape == first.shape and v.dtype == first.dtype for v in values):
        return _stack(values, arena_tensors)
    if isinstance(first, (int, float)) and not isinstance(first, bool) and len(types) == 1:
        return torch.tensor(values)
    if isinstance(first, bytes) and _in_worker() and all(
            isinstance(v, bytes) for v in values) and sum(map(len, values)) >= _SHARE_BYTES:
        return _SharedBytes(values, pooled=pooled)
    return values  # (payloads the reader placed go into shared memory in share_raw, after)


_TEXT = frozenset((str,))
_BYTES_ONLY = frozenset((bytes,))


def _members_differ(samples: list[dict]) -> ShardError:
    """The error of a batch whose samples do not all have the same members: the default
    collate makes one column per member, and would otherwise fail or drop one unsaid."""
    first = samples[0]
    other = next(s for s in samples if s.keys() != first.keys())

    def members(sample):
        return ", ".join(sorted(repr(n) for n in sample if not n.startswith("__"))) or "none"

    return ShardError(
        f"{other.get('__url__')}: sample {other.get('__key__')!r} has the members "
        f"{members(other)}, where sample {first.get('__key__')!r} of the same batch has "
        f"{members(first)}: the default collate needs the same members in every sample of a "
        "batch (give the others with map=, or pass a collate_fn)")


def _decoded(values: list, samples: list[dict], name: str, kind: type[Any]) -> list:
    """The column with its deferred JSON members (of type ``kind``) decoded."""
    out = []
    for value, sample in zip(values, samples, strict=True):
        if type(value) is kind:
            try:
                value = json_member(value if kind is bytes else value.data)
            except Exception as error:
                raise decode_error(sample.get("__url__"), sample.get("__key__"), name,
                                   error) from error
        out.append(value)
    return out


def _numbers(values: list):
    """The collate's rule for decoded JSON values: numbers of one type become a tensor."""
    first = values[0]
    if isinstance(first, (int, float)) and not isinstance(first, bool) and all(
            type(v) is type(first) for v in values):
        return torch.tensor(values)
    return values


def _stack(values: list, arena_tensors: bool = False):
    """One tensor of the batch from tensors, or numpy arrays of one dtype, of one shape; in a
    worker stacked straight into shared memory (as torch's default collate does), so that
    it crosses to the main process without another copy: with ``arena_tensors`` into the
    worker's arena (a ``SharedTensor``), else into a new segment of its own (which crosses
    as a file descriptor, a round trip to the worker). Arrays are stacked by numpy, at a
    third of the cost of a tensor per row."""
    import numpy as np

    first = values[0]
    arrays = isinstance(first, np.ndarray)
    native = first.dtype.newbyteorder("=") if arrays else None  # torch's byte order
    if not _in_worker() or not arrays and first.device.type != "cpu":
        return torch.from_numpy(np.stack(values).astype(native, copy=False)) if arrays \
            else torch.stack(values)
    like = torch.from_numpy(np.empty(0, native)) if arrays else first
    shape = (len(values), *first.shape)
    nbytes = len(values) * (first.nbytes if arrays else first.numel() * first.element_size())
    if arena_tensors and nbytes:
        span = arena().cut(nbytes)
        result = SharedTensor(span, like.dtype, shape)
        if arrays:  # numpy's views cost a tenth of torch's
            _stack_arrays(values, span.segment.array[span.start : span.end].view(native)
                          .reshape(shape))
        else:
            out = span.segment.tensor[span.start : span.end].view(like.dtype).view(shape)
            torch.stack(values, out=out)
        return result
    # torch's stub requires a stride, which defaults to None (set_'s docstring)
    out = like.new_empty(0).set_(new_shared_storage(nbytes), 0, shape)  # type: ignore[call-overload]
    if arrays:
        _stack_arrays(values, out.numpy())
    else:
        torch.stack(values, out=out)
    return out


def _stack_arrays(values: list, out) -> None:
    """``numpy.stack(values, out=out)`` for arrays of one shape: as one concatenation along
    their first axis when they have one (the same bytes in ``out``; ``stack`` makes a view of
    each array first, a third of its cost on 32 rows of 2,048 tokens)."""
    import numpy as np

    if values[0].ndim:
        np.concatenate(values, out=out.reshape(-1, *out.shape[2:]))
    else:
        np.stack(values, out=out)


_SHARE_BYTES = 1 << 20  # below this, pickling through the worker pipe is as cheap
# a raw member: bytes, or (under wdstream.DataLoader) a large payload the reader read into
# shared memory or left in a local file
_RAW = (bytes, SharedSpan, FileSpan)


def _in_worker() -> bool:
    return torch.utils.data.get_worker_info() is not None


class _SharedBytes:
    """A batch's raw members in memory the main process can map: buffers, and each value's
    (buffer, start, end). A DataLoader worker hands tensors over through shared memory, where
    pickled bytes are copied through a pipe; the loader turns them back into
    ``bytes`` in the main process, or (``bytes_as="tensor"``) into views of the buffers.

    Payloads the reader put in the worker's arena stay where they are, payloads left in local
    files are read from the page cache by the main process (mapped, for views), and a flag in
    each arena segment used tells the worker when the main process no longer holds the batch
    (``pooled``; the other ``bytes`` of the batch are then packed into the arena too). A batch
    of only ``bytes`` copied out into ``bytes`` at once (the default ``bytes_as``) is packed
    into a fresh segment, which keeps peak memory at its lowest (pooling trades a little
    memory for speed: docs/benchmarks.md). A mapped file's pages come in as its views are
    read (the kernel maps the neighbours of each faulting page that the page cache holds:
    fewer faults than pages, and no page the batch does not read)."""

    single = False  # one value (a sample's member) rather than a batch's list

    def __init__(self, values: list, pooled: bool = False):
        # per buffer: the flag raised in its arena segment (None for a file); None: no flags
        self.holds: list[int | None] | None = None
        self.buffers: list | None = None  # per buffer: a tensor, or a WorkerFile
        if pooled and _in_worker():
            index: dict[tuple, int] = {}  # buffer key -> its number
            sources: list = []  # arena segments and FileSpans
            parts: list[tuple[int, int, int]] = []  # (buffer, start, end)
            for span in self._into_arena(values, arena()):
                key = _source_key(span)
                if key not in index:
                    index[key] = len(sources)
                    sources.append(span.segment if type(span) is SharedSpan else span)
                parts.append((index[key], *_bounds(span)))
            holds = [s.hold() if type(s) is MemorySegment else None for s in sources]
            if -1 not in holds:
                self._sources, self.parts, self.holds = sources, parts, holds
                return  # the buffers are made in the main process
            for source, flag in zip(sources, holds, strict=True):  # no flag left: copy
                if flag is not None and flag >= 0:
                    release(source.tensor, flag)
        self._pack(values)

    def _pack(self, values: list) -> None:
        """All values copied into one new buffer, back to back: shared memory in a worker."""
        ends = list(itertools.accumulate(map(len, values)))
        buffer = allocate(ends[-1]) if _in_worker() else torch.empty(ends[-1], dtype=torch.uint8)
        view = buffer.numpy()
        self.buffers = [buffer]
        self.parts = [(0, start, end) for start, end in zip([0, *ends[:-1]], ends, strict=True)]
        for value, (_buffer, start, end) in zip(values, self.parts, strict=True):
            kind = type(value)
            view[start:end] = value.memory() if kind is SharedSpan else memoryview(
                bytes(value) if kind is FileSpan else value)

    @staticmethod
    def _into_arena(values: list, shared) -> list:
        """A span per value: payloads in the arena or in local files as they are, ``bytes``
        packed into one new span."""
        packed = [len(v) for v in values if type(v) is bytes]
        holder: Any = shared.cut(sum(packed)) if packed else None  # None: no bytes value
        spans, offset = [], 0
        for value in values:
            if type(value) is not bytes:
                spans.append(value)
                continue
            start = holder.start + offset
            offset += len(value)
            holder.segment.array[start : start + len(value)] = memoryview(value)
            spans.append(SharedSpan(holder.segment, start, start + len(value)))
        return spans

    def __getstate__(self) -> dict:
        """In the worker: arena segments go as numbers, with the tensor (a file descriptor)
        only the first time, with the numbers of the segments the worker has let go since;
        files as their path and identity."""
        state = dict(self.__dict__)
        sources = state.pop("_sources", None)
        if sources is not None:
            state["sources"] = [_describe(source) for source in sources]
            for source in sources:
                if type(source) is MemorySegment:
                    source.sent = True
            dropped = arena().dropped
            state["dropped"] = [dropped.popleft() for _ in range(len(dropped))]
            state["worker"] = os.getpid()
        return state

    def __setstate__(self, state: dict) -> None:
        sources = state.pop("sources", None)
        if sources is not None:  # in the main process
            worker = state.pop("worker")
            state["buffers"] = [_buffer(worker, source) for source in sources]
            unmap(worker, state.pop("dropped"))
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.parts)

    @property
    def nbytes(self) -> int:
        return sum(end - start for _buffer, start, end in self.parts)

    def _buffers(self) -> list:
        if self.buffers is None:  # unpack() and views() hand the values out once
            raise RuntimeError("the batch's values were already taken")
        return self.buffers

    def unpack(self) -> list[bytes]:
        values: list = [None] * len(self.parts)
        buffers = self._buffers()
        for number, buffer in enumerate(buffers):
            numbers = [i for i, part in enumerate(self.parts) if part[0] == number]
            bounds = [self.parts[i][1:] for i in numbers]
            if type(buffer) is WorkerFile:
                copies = buffer.read(bounds)
            else:
                array = memoryview(buffer.numpy())
                copies = [bytes(array[start:end]) for start, end in bounds]
                del array
            for i, value in zip(numbers, copies, strict=True):
                values[i] = value
        if self.holds is not None:  # copied out: the worker may use the memory again
            for buffer, flag in zip(buffers, self.holds, strict=True):
                if flag is not None:
                    release(buffer, flag)
        self.holds = self.buffers = None
        return values

    def views(self) -> list[torch.Tensor]:
        """The values as 1-D uint8 tensors sharing this batch's memory: no copy. Arena memory
        goes back to the worker once no tensor sharing it (view, reinterpretation, nor array
        made from one) is left: each kept segment is wrapped anew for the batch in a storage
        of its own, which holds a numpy view of the segment until its last tensor goes; the
        flag is released when that numpy view is freed."""
        buffers = self._buffers()
        if self.holds is not None:
            bases = []
            for buffer, flag in zip(buffers, self.holds, strict=True):
                if flag is None:  # a file mapped for this batch alone
                    bases.append(buffer.map())
                    continue
                owner = buffer.numpy()
                weakref.finalize(owner, release, buffer, flag)
                bases.append(torch.frombuffer(owner, dtype=torch.uint8))
            buffers = bases
        values = [buffers[b][start:end] for b, start, end in self.parts]
        self.holds = self.buffers = None
        return values


class SharedTensor(_SharedBytes):
    """A batch's stacked tensor made in a worker's arena: it crosses to the main process as
    its segment's number and bounds (the segment itself the first time), and ``tensor()``
    there is a view of the shared memory, which goes back to the worker once no view of it
    is left. Torch's ``pin_memory`` thread makes it a pinned tensor (a copy)."""

    def __init__(self, span: SharedSpan, dtype: torch.dtype, shape: tuple[int, ...]):
        super().__init__([span], pooled=True)
        self.dtype, self.shape = dtype, shape

    def tensor(self) -> torch.Tensor:
        return self.views()[0].view(self.dtype).view(self.shape)

    def pin_memory(self, *args, **kwargs) -> torch.Tensor:
        return self.tensor().pin_memory(*args, **kwargs)


def _source_key(span) -> tuple:
    if type(span) is SharedSpan:
        return "segment", id(span.segment)
    return "file", span.path, span.identity


def _bounds(span) -> tuple[int, int]:
    if type(span) is SharedSpan:
        return span.start, span.end
    return span.offset, span.offset + span.size


def _describe(source) -> tuple:
    """A batch's buffer as it crosses to the main process."""
    if type(source) is MemorySegment:
        return "segment", source.uid, None if source.sent else source.tensor
    return "file", source.path, source.identity, source.file_size


def _buffer(worker: int, source: tuple) -> torch.Tensor | WorkerFile:
    """In the main process: the tensor a described buffer is, or the file."""
    if source[0] == "segment":
        _kind, uid, tensor = source
        if tensor is not None:
            keep_mapped(worker, uid, tensor)
        return mapped(worker, uid)
    _kind, path, identity, file_size = source
    return WorkerFile(path, identity, file_size)


# glibc's malloc where large payloads pass: blocks under 4 MiB (a payload, a read chunk) come
# from the heap, and up to 64 MiB of freed heap stays mapped. By default each 1 MiB payload is a
# fresh mmap whose pages fault in one by one, or freed heap is trimmed and faulted in again
# (figures: docs/benchmarks.md). Applied in every DataLoader worker, and in the training process
# once a loader copies payloads out of shared memory into ``bytes`` (unless the loader was built
# with ``tune_malloc=False``): glibc's own dynamic threshold reaches the same heap sizes there
# after the first large free, but trims the freed heap after every batch.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MALLOC_SETTINGS = {_M_TRIM_THRESHOLD: 64 << 20, _M_MMAP_THRESHOLD: 4 << 20}


def tune_allocator() -> None:
    """Apply ``MALLOC_SETTINGS`` in this process (again: the same settings); nothing where
    malloc is not glibc's."""
    libc = linux_libc()
    if libc is not None and hasattr(libc, "mallopt"):  # glibc's; musl has none
        for option, value in MALLOC_SETTINGS.items():
            libc.mallopt(option, value)


def tune_worker_process() -> None:
    """A DataLoader worker's settings: ``MALLOC_SETTINGS``, and the objects it inherited
    (torch's modules, the dataset...) moved out of the garbage collector's sight. A worker
    holds a shuffle window of samples, whose dicts outlive the young generations; each full
    collection they set off would walk every inherited object (the cost on small samples:
    docs/decisions.md). What the worker allocates later is collected as usual."""
    tune_allocator()
    gc.freeze()


BYTES_AS = CHOICES["bytes_as"]


def share_raw(batch, all_bytes: bool, json_names=()):
    """In the worker, after the collate: payloads the reader placed in shared memory or left
    in a local file (a single one, or a list holding one) go as ``_SharedBytes``; with
    ``all_bytes`` (``bytes_as="tensor"``) every raw member, or list of them, does, whatever
    its size. ``json_names``: as for ``collate``."""
    if isinstance(batch, dict):
        for name, value in batch.items():
            kind = type(value)
            if kind is Deferred:  # a sample of its own (batch_size=None)
                batch[name] = JsonColumn([value.data], single=True)
            elif kind is bytes and name in json_names:  # the same, left as bytes
                batch[name] = JsonColumn([value], single=True)
            elif kind in _RAW and (all_bytes or kind is not bytes):
                batch[name] = _SharedBytes([value], pooled=True)
                batch[name].single = True
            elif kind is list and value and all(type(v) in _RAW for v in value) and (
                    all_bytes or not all(type(v) is bytes for v in value)):
                batch[name] = _SharedBytes(value, pooled=True)
    return batch


def unpack_shared(batch, bytes_as: str = "bytes", before_copy: Callable[[], None] | None = None):
    """In the main process: batches' shared-memory bytes back into lists of ``bytes``, or
    (``bytes_as="tensor"``) into uint8 tensors that share the memory. ``before_copy`` is
    called before payloads are copied into ``bytes``."""
    if isinstance(batch, dict):
        for name, value in batch.items():
            if type(value) is SharedTensor:
                batch[name] = value.tensor()
            elif isinstance(value, _SharedBytes):
                if before_copy is not None and bytes_as != "tensor":
                    before_copy()
                values = value.views() if bytes_as == "tensor" else value.unpack()
                batch[name] = values[0] if value.single else values
            elif type(value) is JsonColumn:
                values = value.decode(name, batch.get("__url__"), batch.get("__key__"))
                batch[name] = values[0] if value.single else _numbers(values)
    return batch


def approximate_bytes(value, depth: int = 3) -> tuple[int, int]:
    """A cheap estimate of the bytes a collated batch carries (lists estimated from their
    first item), as ``(pickled, shared)``: bytes copied through the worker's result pipe, and
    bytes that cross in shared memory (tensors and raw members) with only a handle in the pipe.
    Sizes the loader's fetches."""
    if isinstance(value, (torch.Tensor, _SharedBytes)):
        return 0, value.nbytes
    if isinstance(value, JsonColumn):
        return value.nbytes, 0
    if isinstance(value, (bytes, SharedSpan, FileSpan, bytearray, str, memoryview)):
        return len(value), 0
    nbytes = getattr(value, "nbytes", None)  # numpy arrays
    if isinstance(nbytes, int):
        return nbytes, 0
    if depth and isinstance(value, dict):
        parts = [approximate_bytes(v, depth - 1) for v in value.values()]
        return sum(p for p, _ in parts), sum(s for _, s in parts)
    if depth and isinstance(value, (list, tuple)) and value:
        pickled, shared = approximate_bytes(value[0], depth - 1)
        return len(value) * pickled, len(value) * shared
    return 8, 0
