"""``benchmark``: a dataset streamed through a real ``wdstream.DataLoader`` and timed; what
``wdstream bench`` prints. Imports torch when called."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from wdstream.errors import InputError
from wdstream.shards.locate import Shards, find_shards


@dataclass
class BenchResult:
    """What ``benchmark`` measured. ``mb_per_s`` counts shard bytes, estimated from the
    manifest's mean bytes per sample (None without a manifest). ``steady_samples_per_s``
    leaves out the first batch (None with a single batch)."""

    source: str
    workers: int
    batch_size: int | None
    opener: str
    shuffle: bool
    decode: bool | str  # a string: the image mode (decode="rgb8"...)
    bytes_as: str
    batches: int
    samples: int
    seconds: float
    first_batch_seconds: float | None
    samples_per_s: float
    steady_samples_per_s: float | None
    mb_per_s: float | None
    retries: int
    skipped_shards: list[str]
    skipped_samples: int

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (what ``wdstream bench --json`` prints)."""
        return asdict(self)


def benchmark(
    source: str | Sequence[str] | Shards,
    *,
    workers: int = 2,
    batch_size: int | None = 32,
    batches: int | None = None,
    opener: str = "auto",
    shuffle: bool = True,
    decode: bool | str = True,
    on_error: str = "raise",
    bytes_as: str = "bytes",
    progress: Callable[[int], object] | None = None,
    on_length: Callable[[int | None], object] | None = None,
    allow_external_shards: bool = False,
) -> BenchResult:
    """Stream ``source`` through a real ``wdstream.DataLoader`` (one epoch, or the first
    ``batches`` batches) and time it: samples/s, MB/s, time to the first batch, and the
    loader's retry and skip counters. ``bytes_as`` is the loader's (``"tensor"``: undecoded
    members as uint8 tensors, without a copy in this process). ``progress(1)`` is called after
    each batch; ``on_length(n)`` once before the first, with the batches of an epoch (None
    when unknown: no manifest).

    Imports torch. A worker's error is raised as the wdstream error it was (ShardError,
    StreamError...), not wrapped in torch's worker traceback.
    """
    _check_counts(workers, batch_size, batches)
    # before importing torch: a bad source fails fast
    found = find_shards(source, allow_external_shards=allow_external_shards)
    from wdstream.stream.load.dataset import StreamingDataset
    from wdstream.stream.load.loader import DataLoader

    # the resolved shards as they are: listed names are names, not patterns to expand again
    dataset = StreamingDataset(found.manifest or found, shuffle=shuffle, opener=opener,
                               decode=decode, on_error=on_error,
                               allow_external_shards=allow_external_shards)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, bytes_as=bytes_as)
    manifest = dataset.manifest
    bytes_per_sample = (manifest.bytes / manifest.samples
                        if manifest is not None and manifest.samples else None)

    if on_length is not None:
        on_length(len(loader) if dataset.has_counts else None)
    run = _timed(loader, batches, progress)
    seconds = run.seconds
    stats = loader.stats
    return BenchResult(
        source=found.source,
        workers=workers, batch_size=batch_size, opener=opener, shuffle=shuffle, decode=decode,
        bytes_as=bytes_as, batches=run.batches, samples=run.samples, seconds=seconds,
        first_batch_seconds=run.first_seconds,
        samples_per_s=run.samples / seconds if seconds > 0 else 0.0,
        steady_samples_per_s=run.steady(),
        mb_per_s=(run.samples * bytes_per_sample / seconds / 1e6
                  if bytes_per_sample is not None and seconds > 0 else None),
        retries=stats["retries"], skipped_shards=list(stats["skipped_shards"]),
        skipped_samples=stats["skipped_samples"],
    )


def _check_counts(workers: int, batch_size: int | None, batches: int | None) -> None:
    if workers < 0:
        raise InputError(f"workers must be >= 0, got {workers}")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    if batches is not None and batches < 1:
        raise InputError(f"batches must be >= 1, got {batches}")


@dataclass
class _Run:
    """What iterating the loader took: batches and samples, the seconds in all and to the
    first batch (None if there was none), and the first batch's samples."""

    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    first_seconds: float | None = None
    first_samples: int = 0

    def steady(self) -> float | None:
        """Samples per second after the first batch; None with a single batch."""
        if self.batches > 1 and self.first_seconds is not None \
                and self.seconds > self.first_seconds:
            return (self.samples - self.first_samples) / (self.seconds - self.first_seconds)
        return None


def _timed(loader, batches: int | None, progress: Callable[[int], object] | None) -> _Run:
    """Iterate ``loader`` (at most ``batches`` batches) and time it."""
    run = _Run()
    start = time.perf_counter()
    for batch in loader:
        if run.first_seconds is None:
            run.first_seconds = time.perf_counter() - start
        n = _batch_samples(batch)
        run.samples += n
        run.batches += 1
        if run.batches == 1:
            run.first_samples = n
        if progress is not None:
            progress(1)
        if batches is not None and run.batches >= batches:
            break
    run.seconds = time.perf_counter() - start
    return run


def _batch_samples(batch) -> int:
    """Samples in a batch from the default collate (a dict with a ``__key__`` list), a list
    of samples, or a single sample (``batch_size=None``)."""
    if isinstance(batch, dict):
        keys = batch.get("__key__")
        return len(keys) if isinstance(keys, (list, tuple)) else 1
    if isinstance(batch, (list, tuple)):
        return len(batch)
    return 1
