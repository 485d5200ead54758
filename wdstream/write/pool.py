"""Who writes the shards: ``InlineWriter`` (this process, ``workers=1``) or ``PoolWriter`` (a
pool of processes, results in submission order). Both also tokenize batches ahead of the
sharder when tokens decide the shard boundaries; the pool's workers also read compressed and
remote JSON Lines inputs (``worker_reads``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from wdstream.errors import InputError
from wdstream.shards.manifest import ShardInfo
from wdstream.sources.objects import settle_uploads
from wdstream.write.jobs import SampleBatch, ShardJob, by_reference
from wdstream.write.record_batches import Batch, ReadCounter
from wdstream.write.shard_writer import write_shard
from wdstream.write.token_members import with_tokens
from wdstream.write.tokenizer import Tokenizer
from wdstream.write.worker_reads import receive_batches, send_batches

if TYPE_CHECKING:
    from concurrent.futures import Future

# A pool worker's tokenizer and the pipe it sends the batches of an input it reads into, set
# by _init_worker in each worker process (a pool initializer's only way to hand them on).
_worker_encoder: Tokenizer | None = None
_worker_batches = None


def _init_worker(encoder: Tokenizer | None, batches=None) -> None:
    """Pool initializer: Ctrl-C is handled by the main process, which stops the pool; a worker
    interrupted while idle would only print a traceback. A worker tokenizes on one thread:
    ``--workers`` sets how many cores tokenize."""
    global _worker_encoder, _worker_batches
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_encoder, _worker_batches = encoder, batches
    if encoder is not None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _interrupt_once(signum, frame):
    """A worker's first SIGINT in a job aborts it; more (Ctrl-C pressed again, and the main
    process passing its signal on) must not interrupt the abort itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _write_shard_in_worker(job: ShardJob, via: str) -> ShardInfo:
    # Within a job, Ctrl-C (or the main process stopping the pool) aborts the upload; the CLI
    # child processes, which get the default handler back when they start, stop with it.

    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        return write_shard(job, via, _worker_encoder)
    except BaseException:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        settle_uploads()  # the main process deletes the shard once this job has returned
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _read_in_worker(path: str, max_record: int) -> None:
    """Read a JSON Lines input and send its batches to the main process (``worker_reads``)."""
    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        send_batches(_worker_batches, path, max_record)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tokenize_in_worker(texts: list[list[str]]) -> list[list[bytes]]:
    encoder = _worker_encoder
    if encoder is None:
        raise InputError("texts to tokenize, and no tokenizer")
    return [encoder.encode_npy(column) for column in texts]


class InlineWriter:
    """Tokenizes and writes each shard as it comes, in this process."""

    read_batches = None  # every input is read by this process

    def __init__(self, via: str, encoder: Tokenizer | None = None):
        self.via = via
        self.encoder = encoder

    def tokenized(self, batches: Iterable[SampleBatch]) -> Iterator[SampleBatch]:
        """``batches`` in order, their texts tokenized."""
        for samples in batches:
            if samples.tokenize:
                encoder = self.encoder
                if encoder is None:
                    raise InputError("texts to tokenize, and no tokenizer")
                samples = with_tokens(
                    samples, [encoder.encode_npy(samples.columns[i]) for i in samples.tokenize]
                )
            yield samples

    def submit(self, job: ShardJob) -> Iterator[ShardInfo]:
        yield write_shard(job, self.via, self.encoder)

    def drain(self) -> Iterator[ShardInfo]:
        return iter(())

    def close(self, failed: bool) -> None:
        pass


class PoolWriter:
    """Tokenizes batches and writes shards in a process pool; results come back in submission
    order.

    At most ``workers + 1`` shards, and as many batches to tokenize, are in flight, which
    bounds memory to a few shards.

    ``reads``: some inputs are read by a worker (``read_batches``); the pool then has one
    process more, so that ``workers`` processes still write shards while one reads. A shard
    writer also waits on its upload, and the reader on the main process: with the reader
    taking one of only ``workers`` processes, ``--workers 2`` would write one shard at a time.
    """

    def __init__(self, via: str, workers: int, encoder: Tokenizer | None = None,
                 reads: bool = False):
        import multiprocessing
        import threading
        from concurrent.futures import ProcessPoolExecutor

        self.via = via
        self.limit = workers + 1
        self._pending: list[Future[ShardInfo]] = []
        # fork starts workers in milliseconds, but is safe only in a single-threaded process
        # (and on Linux); checking a cloud prefix starts fsspec's I/O thread: then forkserver.
        fork_is_safe = sys.platform == "linux" and threading.active_count() == 1
        context = multiprocessing.get_context("fork" if fork_is_safe else "forkserver")
        if not fork_is_safe:  # workers fork from a server that has imported what they run
            context.set_forkserver_preload([__name__])
        # Batches of inputs a worker reads (read_batches) come back through this pipe.
        self._batches, self._batches_sender = context.Pipe(duplex=False)
        self._pool = ProcessPoolExecutor(
            max_workers=workers + 1 if reads else workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(encoder, self._batches_sender),
        )

    def read_batches(self, path: str, max_record: int, counter: ReadCounter) -> Iterator[Batch]:
        """The batches of the JSON Lines input ``path`` as ``read_jsonl`` gives them, read and
        decompressed by a worker (one input at a time)."""
        future = self._pool.submit(_read_in_worker, path, max_record)
        yield from receive_batches(self._batches, future, path, counter)

    def tokenized(self, batches: Iterable[SampleBatch]) -> Iterator[SampleBatch]:
        """``batches`` in order, their texts tokenized by the workers, several at a time."""
        pending: list[tuple[SampleBatch, Future[list[list[bytes]]] | None]] = []

        def first_done() -> SampleBatch:
            samples, future = pending.pop(0)
            return samples if future is None else with_tokens(samples, future.result())

        for samples in batches:
            future = None
            if samples.tokenize:  # only the texts travel to the worker, and their tokens back
                texts = [samples.columns[i] for i in samples.tokenize]
                future = self._pool.submit(_tokenize_in_worker, texts)
            pending.append((samples, future))
            while len(pending) > self.limit:
                yield first_done()
        while pending:
            yield first_done()

    def submit(self, job: ShardJob) -> Iterator[ShardInfo]:
        self._pending.append(self._pool.submit(_write_shard_in_worker, by_reference(job),
                                               self.via))
        while len(self._pending) >= self.limit:
            yield self._pending.pop(0).result()

    def drain(self) -> Iterator[ShardInfo]:
        while self._pending:
            yield self._pending.pop(0).result()

    def close(self, failed: bool) -> None:
        # On failure, queued jobs are cancelled and running ones are interrupted (a SIGINT
        # aborts a job's upload, see _write_shard_in_worker); shutdown waits for every worker
        # to end, so nothing is still writing when the caller deletes shards.
        if failed:
            for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                try:
                    os.kill(process.pid, signal.SIGINT)
                except (ProcessLookupError, PermissionError, AttributeError):
                    pass
        self._pool.shutdown(wait=True, cancel_futures=failed)
        self._batches.close()
        self._batches_sender.close()

