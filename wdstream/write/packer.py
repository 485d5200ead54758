"""``wdstream.pack``: records into reproducible WebDataset tar shards and a manifest.

How a run goes:

1. The inputs and options are checked, then the output prefix: a prefix that holds a manifest
   is refused unless ``overwrite``, in which case that manifest is deleted first, so that a run
   that later fails never leaves a manifest pointing at a mix of old and new shards.
2. The main process reads records in order, turns each into a sample (key + members) and
   assigns samples to shards. The exact tar size of every sample is known before anything is
   written (``tar_sizes``), so shard boundaries do not depend on who writes the shards.
3. Each shard is written whole - tar, SHA-256, upload - in this process (``workers=1``) or by a
   pool of ``workers`` processes. The bytes are the same either way. A pool worker reads the
   JSON lines of a plain local file from the file itself (``jobs.ShardPiece.lines_at``), and
   with ``workers > 1`` compressed and remote JSON Lines are read and decompressed by a pool
   worker rather than this process (``worker_reads``), the records in the same order.
4. The manifest is written last, after every shard is complete. If anything fails (a bad
   record, an upload error, Ctrl-C), the shards this run wrote are deleted and no manifest is
   written; the error is raised again.

Keys: with ``key`` they come from a column and must pass the key rules (no ".", no "/", not
empty; ``shards.samples.check_key``), and a key used twice in one shard is an error naming both
records. Otherwise a record's key is its index among all records of all inputs, zero-padded to
10 digits (``0000000042``), unique across the dataset and the same in every part.

``overwrite``: the old manifest is deleted before the first shard is written; shards of the new
run replace old ones of the same name, and old shards beyond the new run's count stay in place,
unlisted. A failed overwrite therefore leaves no dataset rather than a mixed one.

Tokenizing (``tokenize``, with a ``wdstream.write.tokenizer.Tokenizer``): the column's texts are checked by the main
process and tokenized by the pool workers (or this process, ``workers=1``), so ``workers``
parallelises tokenizing. With ``max_size`` the members' sizes decide the shard boundaries, so
batches are tokenized before they are cut into shards (a few batches ahead, in the pool); with
``max_count`` alone the boundaries are known without tokenizing, and the shard writer
tokenizes its pieces (a part then tokenizes only its own shards' records).

Memory: one shard is assembled in memory before it is written, so ``workers=N`` holds up to
about ``2N + 1`` shards' worth of data (``max_size`` each; 256 MB by default).

``part=(i, n)`` splits the work by shard, not by record: every part reads the whole input and
computes the same shard boundaries as a single run, and part ``i`` writes the shards whose index
``% n == i``. The parts' shards are therefore byte-identical to a single run's whatever ``n``,
they can share one output prefix without name clashes, and ``wdstream index --merge`` (see
``merge.merge_parts``) joins the part manifests (``index.part-III-of-NNN.json``) into the same
``index.json`` a single run writes. Each part parses only the records of its own shards, so a
malformed JSON line is reported by the part that owns it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from wdstream import __version__
from wdstream.errors import InputError, OptionTypeError, WdstreamError
from wdstream.shards.compression import WRITE_SUFFIXES
from wdstream.shards.compression.writing import check_compression, tar_limit
from wdstream.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, write_manifest
from wdstream.sizes import parse_size
from wdstream.sources import urls
from wdstream.sources.objects import delete, exists, settle_uploads
from wdstream.write.inputs import Input, check_inputs, iter_batches, read_in_worker
from wdstream.write.jobs import (
    SampleBatch,
    ShardJob,
    ShardPiece,
    part_manifest_name,
    shard_name,
)
from wdstream.write.pack_options import DEFAULT_MAX_SIZE, check_options
from wdstream.write.pool import InlineWriter, PoolWriter
from wdstream.write.record_batches import MAX_RECORD, ReadCounter
from wdstream.write.records_to_samples import SampleMaker
from wdstream.write.sharder import Sharder
from wdstream.write.tokenizer import Tokenizer


@dataclass
class PackProgress:
    """Counters passed to the ``progress`` callback (the same object, updated)."""

    records: int = 0  # records read so far
    shards: int = 0  # shards completely written
    samples: int = 0  # samples in the shards written
    bytes: int = 0  # bytes of the shards written
    input_bytes: int = 0  # bytes of the inputs read so far (as stored, e.g. compressed)
    input_total: int = 0  # bytes of all inputs, from the listing (0: not known, e.g. stdin)


@dataclass
class PackSettings:
    """``pack``'s arguments, checked and resolved (defaults filled in, inputs listed)."""

    paths: list[str]  # the inputs as named
    inputs: list[Input]  # after glob expansion
    output: str
    fields: dict[str, str] | None
    key: str | None
    max_count: int | None
    max_size: int | None
    name: str
    via: str
    workers: int
    part: tuple[int, int] | None
    overwrite: bool
    tokenize: dict[str, str] | None
    tokenizer: str | None
    compress: str | None
    level: int | None
    follow_links: bool  # a folder's links out of it are read
    max_record: int  # the largest record read: MAX_RECORD, or max_size if smaller

    @classmethod
    def check(cls, inputs, output, *, fields, key, max_count, max_size, name, via, workers,
              part, overwrite, tokenize, tokenizer, compress, level,
              follow_links) -> PackSettings:
        """Every option and input checked; InputError (or an option error) before anything
        is written."""
        paths = input_paths(inputs)
        if max_size is not None:
            max_size = parse_size(max_size)
        max_record = MAX_RECORD if max_size is None else min(MAX_RECORD, max_size)
        fields = dict(fields) if fields is not None else None
        tokenize = dict(tokenize) if tokenize is not None else None
        check_options(fields, key, max_count, max_size, name, workers, part, via, tokenize,
                      tokenizer)
        if not isinstance(follow_links, bool):
            raise OptionTypeError(f"pack: follow_links must be True or False, not "
                                  f"{follow_links!r:.80}")
        checked = check_inputs(paths, follow_links)
        if (fields or key or tokenize) and any(item.kind == "folder" for item in checked):
            folder = next(item.path for item in checked if item.kind == "folder")
            raise InputError(f"{folder}: --field, --tokenize and --key do not apply to a "
                             "folder, whose files are the members")
        if max_size is None and max_count is None:
            max_size = DEFAULT_MAX_SIZE
        level = check_compression(compress, level)
        return cls(paths, checked, os.fspath(output), fields, key, max_count, max_size, name,
                   via, workers, tuple(part) if part else None, overwrite, tokenize,
                   os.fspath(tokenizer) if tokenizer is not None else None, compress, level,
                   follow_links, max_record)

    @property
    def manifest_name(self) -> str:
        return part_manifest_name(self.part) if self.part else MANIFEST_NAME

    @property
    def tar_max(self) -> int | None:
        """The most bytes a tar may take (less than ``max_size`` for compressed shards)."""
        if self.compress and self.max_size is not None:
            return tar_limit(self.compress, self.max_size)
        return self.max_size

    def keys_from_data(self) -> bool:
        """Generated keys are unique by construction; keys from a column or file names may
        repeat."""
        return self.key is not None or any(item.kind == "folder" for item in self.inputs)

    def packed_by(self, tokenizer: dict | None = None) -> dict:
        """The manifest's extra keys: how it was packed, the ``tokenizer`` entry, the
        compression."""
        options: dict[str, Any] = {"fields": self.fields, "key": self.key,
                                   "max_count": self.max_count, "max_size": self.max_size,
                                   "name": self.name}
        packed: dict[str, Any] = {"tool": "wdstream", "version": __version__,
                  "inputs": ["<stdin>" if p == "-" else p for p in self.paths],
                  "options": options}
        extra: dict[str, Any] = {"packed_by": packed}
        if self.tokenize:
            options.update(tokenize=self.tokenize, tokenizer=self.tokenizer)
            extra["tokenizer"] = tokenizer
        if self.part:
            packed["part"] = list(self.part)
        if self.compress:
            options.update(compress=self.compress, level=self.level)
            extra["compression"] = {"codec": self.compress, "level": self.level}
        return extra


class PackRun:
    """One run of ``pack``: reads the inputs, cuts and writes the shards, then publishes the
    manifest; on any failure it deletes what it wrote (see the module docstring)."""

    def __init__(self, settings: PackSettings, progress: Callable[[PackProgress], object] | None):
        self.settings = settings
        self.progress = progress
        # Checked before the output is touched (--overwrite deletes the old manifest).
        self.encoder = Tokenizer.load(settings.tokenizer) \
            if settings.tokenize and settings.tokenizer is not None else None
        self.maker = SampleMaker(settings.fields, settings.key, settings.tokenize)
        self.sharder = Sharder(settings.max_count, settings.tar_max,
                               check_duplicates=settings.keys_from_data())
        self.read_counter = ReadCounter(sum(item.size for item in settings.inputs))
        self.status = PackProgress(input_total=self.read_counter.total)
        self.shards: list[ShardInfo] = []
        self.extensions: set[str] = set()
        self.started: list[str] = []  # URLs of shards this run began to write
        self.next_index = 0  # of the next shard cut, counting other parts' shards
        self.suffix = WRITE_SUFFIXES[settings.compress] if settings.compress else ".tar"
        self.writer: InlineWriter | PoolWriter | None = None  # while the shards are written

    def run(self) -> Manifest:
        settings = self.settings
        # A part replaces neither the merged manifest nor another part's.
        names = [MANIFEST_NAME, settings.manifest_name] if settings.part else [MANIFEST_NAME]
        prepare_output(settings.output, names, settings.overwrite)
        self._write_shards()
        self.status.input_bytes = self.read_counter.read
        self._report()
        extra = settings.packed_by(
            self.encoder.describe(settings.tokenize)
            if self.encoder is not None and settings.tokenize is not None else None)
        manifest = Manifest(shards=self.shards, extensions=sorted(self.extensions),
                            extra=extra, base=settings.output)
        try:
            manifest.url = write_manifest(manifest, settings.output, via=settings.via,
                                          name=settings.manifest_name)
        except BaseException:
            delete_quietly([*self.started, urls.join(settings.output, settings.manifest_name)])
            raise
        return manifest

    def _write_shards(self) -> None:
        settings = self.settings
        writer: PoolWriter | InlineWriter
        if settings.workers > 1:
            reads = any(read_in_worker(item) for item in settings.inputs)
            writer = PoolWriter(settings.via, settings.workers, self.encoder, reads=reads)
        else:
            writer = InlineWriter(settings.via, self.encoder)
        self.writer = writer
        failed = True
        try:
            for job in self._shard_jobs(writer):
                self.started.append(job.url)
                for info in writer.submit(job):
                    self._done(info)
            for info in writer.drain():
                self._done(info)
            failed = False
        finally:
            writer.close(failed)
            if failed:
                delete_quietly(self.started)

    def _sample_batches(self) -> Iterator[SampleBatch]:
        first_index = 0  # of the batch's first record among all records
        for batch in iter_batches(self.settings.inputs, max_record=self.settings.max_record,
                                  counter=self.read_counter,
                                  worker_reader=None if self.writer is None
                                  else self.writer.read_batches,
                                  follow_links=self.settings.follow_links):
            yield self.maker.make(batch, first_index)
            first_index += len(batch.values)

    def _shard_jobs(self, writer: InlineWriter | PoolWriter) -> Iterator[ShardJob]:
        batches = self._sample_batches()
        if self.settings.tokenize and self.settings.max_size is not None:
            # Shard boundaries depend on the members' sizes: tokenize first (in the pool),
            # several batches ahead. Without max_size, the shard writers tokenize, and a part
            # tokenizes only the records of its own shards.
            batches = writer.tokenized(batches)
        for samples in batches:
            self.extensions.update(samples.exts)
            for finished in self.sharder.add(samples):
                if job := self._job(finished):
                    yield job
            self.status.records += len(samples.batch.values)
            self.status.input_bytes = self.read_counter.read
            self._report()
        last = self.sharder.finish()
        if last and (job := self._job(last)):
            yield job

    def _job(self, finished: tuple[list[ShardPiece], int, int | None]) -> ShardJob | None:
        """The job for the shard the sharder finished, None if another part writes it."""
        index, part = self.next_index, self.settings.part
        self.next_index += 1
        if part and index % part[1] != part[0]:
            return None
        file_name = shard_name(self.settings.name, index, self.suffix)
        compress, level = self.settings.compress, self.settings.level
        codec = (compress, level) if compress and level is not None else None  # level: checked
        return ShardJob(file_name, urls.join(self.settings.output, file_name), *finished, codec)

    def _done(self, info: ShardInfo) -> None:
        self.shards.append(info)
        self.status.shards += 1
        self.status.samples += info.samples
        self.status.bytes += info.bytes
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.status)


def input_paths(inputs: Iterable[str | os.PathLike] | str | os.PathLike) -> list[str]:
    """``pack``'s ``inputs`` as a list: one path or URL, or several."""
    if isinstance(inputs, str | os.PathLike):
        return [os.fspath(inputs)]
    return [os.fspath(path) for path in inputs]


def prepare_output(output: str, manifest_names: list[str], overwrite: bool) -> None:
    """Refuse a prefix that holds a manifest, or (overwrite) delete it before any shard."""
    for manifest_name in manifest_names:
        url = urls.join(output, manifest_name)
        if exists(url):
            if not overwrite:
                raise InputError(f"{url} already exists; use --overwrite to replace the dataset")
            delete(url)
    local = urls.to_local_path(output)
    if local is not None:  # fail now rather than after reading the first shard's records
        try:
            os.makedirs(local, exist_ok=True)
        except OSError as error:
            raise InputError(f"{output}: cannot create the output folder ({error.strerror})") from None


def delete_quietly(urls_to_delete: Iterable[str]) -> None:
    """Delete what a failed run wrote, once its uploads have ended (one interrupted in this
    thread goes on in fsspec's I/O loop, and would land after the delete)."""
    settle_uploads()
    for url in urls_to_delete:
        try:
            delete(url)  # a shard that never appeared is fine
        except WdstreamError:
            pass  # best effort: the original error is the one to report
        local = urls.to_local_path(url)
        if local is not None:  # a writer interrupted before its own clean-up: its temporary
            folder, name = os.path.split(local)
            for temporary in glob.glob(os.path.join(glob.escape(folder),
                                                    f".{glob.escape(name)}.*.tmp")):
                try:
                    os.remove(temporary)
                except OSError:
                    pass



def pack(
    inputs: Iterable[str | os.PathLike] | str | os.PathLike,
    output: str | os.PathLike,
    *,
    fields: Mapping[str, str] | None = None,
    key: str | None = None,
    max_count: int | None = None,
    max_size: int | str | None = None,
    name: str = "shard",
    via: str = "auto",
    workers: int = 1,
    part: tuple[int, int] | None = None,
    overwrite: bool = False,
    tokenize: Mapping[str, str] | None = None,
    tokenizer: str | os.PathLike | None = None,
    progress: Callable[[PackProgress], object] | None = None,
    compress: str | None = None,
    level: int | None = None,
    follow_links: bool = False,
) -> Manifest:
    """Pack records from ``inputs`` into tar shards under ``output`` and write the manifest.

    Args:
        inputs (path | URL | list): JSON Lines (also .gz/.zst), Parquet, CSV/TSV files,
            folders, or "-" for JSON Lines on stdin, read in order; each may also be an
            s3://, gs://, https:// or other fsspec URL or a glob pattern (matches in sorted
            order), streamed.
        output (path | URL): the folder or prefix the shards and ``index.json`` go to.
        fields (dict | None): ``{column: extension}`` to store columns as members; default
            the whole record as ``.json``.
        key (str | None): the column keys come from; default generated, unique across the
            dataset.
        max_count (int | None): samples per shard at most.
        max_size (int | str | None): the real tar bytes of a shard at most; 256 MB when
            neither limit is given.
        name (str, default "shard"): shards are ``NAME-000000.tar``...
        via (str, default "auto"): ``"auto"``, ``"cli"`` or ``"fsspec"`` for s3:// and gs://
            uploads.
        workers (int, default 1): processes writing shards (the same bytes as 1).
        part (tuple[int, int] | None): ``(i, n)`` writes only every n-th shard from i, and a
            part manifest (see the module docstring).
        overwrite (bool, default False): replace a dataset already at ``output``.
        tokenize (dict | None): ``{column: extension ending in npy}`` stores text columns as
            token ids (see below), with ``tokenizer``.
        tokenizer (path | None): the Hugging Face ``tokenizer.json`` ``tokenize`` uses.
        progress (callable | None): called with a ``PackProgress`` now and then.
        compress (str | None): ``"zstd"`` or ``"gzip"`` writes ``.tar.zst``/``.tar.gz``
            shards; the manifest's ``bytes`` and ``sha256`` are then the stored bytes', and
            ``max_size`` bounds them by bounding each tar to the most that can never compress
            to more than ``max_size`` (so text shards come out a few times smaller).
        level (int | None): the compression level; default 3 for zstd, 6 for gzip.
        follow_links (bool, default False): follow symbolic links in folder inputs wherever
            they point (FIFOs and devices are still refused).

    Records larger than 256 MiB, or than ``max_size`` when it is given and smaller (a JSON
    line, a CSV/TSV record, a Parquet row, a folder's file), are refused with an InputError
    naming the record before they are read whole. A folder input is read as its regular
    files: a symbolic link is followed only to a file or folder inside it, and a link out of
    it, a FIFO, a device or a socket is an InputError naming it, unless ``follow_links``
    (links are then followed wherever they point; FIFOs and devices are still refused).

    Tokenized members hold the ids of ``encode(text, add_special_tokens=False)``, without
    EOS (``PackedSequences`` appends it), as a ``.npy`` array of ``uint16`` (vocabularies up
    to 65,536) or ``uint32``. They are computed in the processes that write the shards, so
    ``workers`` parallelises tokenizing too; the manifest's ``tokenizer`` key records the
    tokenizer's file name, SHA-256 and vocabulary size, the dtype and the columns.

    Returns the manifest written (``index.json``, or the part's manifest).
    """
    settings = PackSettings.check(
        inputs, output, fields=fields, key=key, max_count=max_count, max_size=max_size,
        name=name, via=via, workers=workers, part=part, overwrite=overwrite, tokenize=tokenize,
        tokenizer=tokenizer, compress=compress, level=level, follow_links=follow_links)
    return PackRun(settings, progress).run()
