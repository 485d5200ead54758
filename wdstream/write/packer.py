"""``wdstream.pack``: records into reproducible WebDataset tar shards and a manifest.

How a run goes:

1. The inputs and options are checked, then the output prefix: a prefix that holds a manifest
   is refused unless ``overwrite``, in which case that manifest is deleted first, so that a run
   that later fails never leaves a manifest pointing at a mix of old and new shards.
2. The main process reads records in order, turns each into a sample (key + members) and
   assigns samples to shards. The exact tar size of every sample is known before anything is
   written (``member_size``), so shard boundaries do not depend on who writes the shards.
3. Each shard is written whole - tar, SHA-256, upload - in this process (``workers=1``) or by a
   pool of ``workers`` processes. The bytes are the same either way. A pool worker reads the
   JSON lines of a plain local file from the file itself (``ShardPiece.lines_at``).
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

Tokenizing (``tokenize``, with a ``TokenEncoder``): the column's texts are checked by the main
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
``merge_parts``) joins the part manifests (``index.part-III-of-NNN.json``) into the same
``index.json`` a single run writes. Each part parses only the records of its own shards, so a
malformed JSON line is reported by the part that owns it.
"""

from __future__ import annotations

import bisect
import datetime
import decimal
import hashlib
import io
import itertools
import json
import operator
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from wdstream.errors import InputError, OptionError, OptionTypeError, WdstreamError
from wdstream.options import CHOICES
from wdstream.shards.compress import check_compression, tar_limit
from wdstream.shards.compression import WRITE_SUFFIXES
from wdstream.shards.identity import HEAD_BYTES, head_digest
from wdstream.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, write_manifest
from wdstream.shards.samples import check_extension, check_key
from wdstream.shards.tar_writer import END_SIZE, TarWriter, member_size
from wdstream.sizes import format_size, parse_size
from wdstream.write.inputs import (
    Batch,
    FolderSample,
    ReadCounter,
    check_inputs,
    iter_batches,
    read_lines,
)
from wdstream.write.remote import read_member

DEFAULT_MAX_SIZE = 256 * 1000**2  # used when neither max_count nor max_size is given
KEY_DIGITS = 10  # generated keys: the global record index, zero-padded so that keys sort
_FLUSH_SIZE = 4 << 20  # bytes buffered before hashing and writing a chunk of a shard


# --- what a run reports ----------------------------------------------------------------------


@dataclass
class PackProgress:
    """Counters passed to the ``progress`` callback (the same object, updated)."""

    records: int = 0  # records read so far
    shards: int = 0  # shards completely written
    samples: int = 0  # samples in the shards written
    bytes: int = 0  # bytes of the shards written
    input_bytes: int = 0  # bytes of the inputs read so far (as stored, e.g. compressed)
    input_total: int = 0  # bytes of all inputs, from the listing (0: not known, e.g. stdin)


# --- samples and shard jobs ------------------------------------------------------------------


class FileMember(NamedTuple):
    """A member whose bytes are read from a file by the process that writes the shard."""

    path: str
    size: int


generated_key = f"{{:0{KEY_DIGITS}d}}".format  # index -> key; str.format: no Python frame


class GeneratedKeys:
    """The keys of records ``start`` to ``stop - 1``, as a sequence that makes each string only
    when it is used: in the process that writes the shard, not in the one that reads input."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[str]:
        return map(generated_key, range(self.start, self.stop))

    def __getitem__(self, item):
        if isinstance(item, slice):
            start, stop, _ = item.indices(len(self))
            return GeneratedKeys(self.start + start, self.start + stop)
        return generated_key(self.start + range(len(self))[item])

    def same_length(self) -> bool:
        """Whether every key has KEY_DIGITS characters (records before the 10-billionth)."""
        return self.stop <= 10**KEY_DIGITS

    def __getstate__(self):
        return (self.start, self.stop)

    def __setstate__(self, state):
        self.start, self.stop = state


Keys = list[str] | GeneratedKeys


class SampleBatch(NamedTuple):
    """Samples made from one input Batch, column by column (cheap to slice and to pickle)."""

    keys: Keys
    exts: tuple[str, ...]  # member extensions, sorted; the same for every sample of the batch
    columns: tuple[list, ...]  # per extension, the data of each sample: bytes or FileMember
    sizes: list[int] | None  # the exact bytes each sample takes in a tar; None: not known yet
    unparsed_json: bool  # columns[0] holds JSON lines that are still to be parsed
    batch: Batch  # the records, for error messages
    tokenize: tuple[int, ...] = ()  # columns that hold texts still to be tokenized


class ShardPiece(NamedTuple):
    """A run of consecutive samples of one SampleBatch, as sent to the shard writer."""

    keys: Keys
    exts: tuple[str, ...]
    columns: tuple[list, ...]
    json_lines_at: tuple[str, Sequence[int]] | None  # (source, line numbers) to parse first
    tokenize: tuple[int, ...] = ()  # columns of texts the writer tokenizes
    # JSON lines of a plain local file: (path, start, stop), the bytes they are read from
    # again by a pool worker, which is sent the piece without its columns (see _by_reference)
    lines_at: tuple[str, int, int] | None = None


class ShardJob(NamedTuple):
    name: str  # file name under the output prefix
    url: str
    pieces: list[ShardPiece]
    samples: int
    size: int | None  # the exact size of the tar; None: known once tokenized
    compress: tuple[str, int] | None = None  # (kind, level) of a compressed shard


def shard_name(name: str, index: int, suffix: str = ".tar") -> str:
    return f"{name}-{index:06d}{suffix}"


def part_manifest_name(part: tuple[int, int]) -> str:
    """``index.part-002-of-008.json``: the manifest a ``part=(2, 8)`` run writes."""
    return f"index.part-{part[0]:03d}-of-{part[1]:03d}.json"


# --- records to samples ----------------------------------------------------------------------


def _json_default(value):
    """JSON for the Parquet types that json lacks; bytes must go to their own member."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        raise TypeError("holds bytes, which JSON cannot; store it with --field COLUMN=EXT")
    raise TypeError(f"holds a {type(value).__name__}, which JSON cannot")


def _to_json(value, where: Callable[[], str]) -> bytes:
    # allow_nan=False: NaN and Infinity are not JSON (strict readers, orjson among them,
    # refuse them), so a record holding one is refused rather than packed unreadable
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          default=_json_default, allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where()}: holds text that is not valid Unicode (a lone "
                         "surrogate)") from None
    except RecursionError:
        raise InputError(f"{where()}: nested too deeply to store as JSON") from None
    except (TypeError, ValueError) as error:
        message = str(error)
        if "Out of range float" in message:
            message = "holds NaN or Infinity, which JSON cannot (they are refused)"
        raise InputError(f"{where()}: {message}") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (NaN and Infinity are refused)")


# json.loads minus its per-call checks on bytes; NaN and Infinity refused (see _to_json)
_decode_json = json.JSONDecoder(parse_constant=_refuse_constant).decode


def parse_json_line(line: bytes, source: str, number: int) -> dict:
    """A JSON Lines record, which must be an object; InputError names the file and line."""
    try:
        value = _decode_json(line.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InputError(f"{source} line {number}: not UTF-8: {error}") from None
    except RecursionError:
        raise InputError(f"{source} line {number}: JSON nested too deeply for this "
                         "reader") from None
    except ValueError as error:
        raise InputError(f"{source} line {number}: malformed JSON: {error}") from None
    if not isinstance(value, dict):
        raise InputError(
            f"{source} line {number}: expected a JSON object, got {type(value).__name__}"
        )
    if not _valid_unicode(line, value):
        raise InputError(f"{source} line {number}: holds a \\u escape of a lone surrogate, "
                         "which is not text (strict JSON readers refuse it)")
    return value


def _valid_unicode(line: bytes, value) -> bool:
    """Whether a parsed line holds only real text: an escaped lone surrogate (``"\\udc80"``)
    parses in Python but cannot be encoded, and strict readers (orjson) refuse it. Only lines
    with a surrogate escape (characters beyond the BMP written as escaped pairs) pay for the
    exact check, measured at about 40% of the cost of parsing them."""
    if b"\\ud" not in line and b"\\uD" not in line:  # nearly every line
        return True
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_text(value, column: str, option: str, where: str) -> InputError:
    """The error for a value to tokenize that is not a string."""
    what = "is null" if value is None else f"holds {type(value).__name__} {value!r:.40}, not text"
    return InputError(f"{where}: column {column!r} {what} (from {option})")


def _field_bytes(value, column: str, where: Callable[[], str]) -> bytes:
    if value is None:
        raise InputError(f"{where()}: column {column!r} is null")
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{where()}: column {column!r} holds text that is not valid "
                             "Unicode (a lone surrogate)") from None
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return _to_json(value, lambda: f"{where()}: column {column!r}")


_header_sizes: dict[int, int] = {}


def _header_size(name_bytes: int) -> int:
    """Tar bytes of a member before its payload, for a name of that length without "/".

    Keys never contain "/" (check_key) and neither do extensions, so the header cost depends
    on the name's length only, and the payload costs its length padded to 512.
    """
    size = _header_sizes.get(name_bytes)
    if size is None:
        size = _header_sizes[name_bytes] = member_size("k" * name_bytes, 0)
    return size


def _sample_sizes(keys: Keys, exts: tuple[str, ...], columns: tuple[list, ...]) -> list[int]:
    """The exact tar bytes of each sample: per member, header plus payload padded to 512."""
    uniform = isinstance(keys, GeneratedKeys) and keys.same_length()
    key_bytes = None if uniform else [len(key.encode("utf-8")) for key in keys]
    sizes = None
    for ext, column in zip(exts, columns, strict=True):
        extra = len(ext.encode("utf-8")) + 1
        if isinstance(column[0], FileMember):
            lengths = [member.size for member in column]
        else:
            lengths = list(map(len, column))
        if key_bytes is None:  # the common case, kept to one cheap pass
            header = _header_size(KEY_DIGITS + extra)
            member = [header + n + (-n % 512) for n in lengths]
        else:
            member = [
                _header_size(k + extra) + n + (-n % 512)
                for k, n in zip(key_bytes, lengths, strict=True)
            ]
        sizes = member if sizes is None else list(map(operator.add, sizes, member))
    return sizes


class SampleMaker:
    """Turns batches of records into samples following the layout options.

    Default: the whole record is one ``.json`` member (a JSON line byte for byte, a row as
    compact JSON). ``fields`` ({column: extension}) stores those columns as members instead,
    and ``tokenize`` ({column: extension}) stores text columns as token ids: their columns of
    the SampleBatch hold the texts (checked here) for a ``TokenEncoder`` to turn into ``.npy``
    members later, in a pool worker (see ``pack``). ``key_field`` takes keys from a column; otherwise keys are
    the global record index.
    """

    def __init__(self, fields: Mapping[str, str] | None, key_field: str | None,
                 tokenize: Mapping[str, str] | None = None):
        members = [(column, ext, False) for column, ext in (fields or {}).items()]
        members += [(column, ext, True) for column, ext in (tokenize or {}).items()]
        # (column, extension, tokenize?) by extension; None: the default layout
        self.fields = sorted(members, key=lambda item: item[1]) if members else None
        self.key_field = key_field
        # Keys from data can repeat; generated keys cannot, which spares the duplicate check.
        self.keys_are_generated = key_field is None

    def make(self, batch: Batch, first_index: int) -> SampleBatch:
        """Samples for ``batch``, whose first record has global index ``first_index``."""
        values = batch.values
        if isinstance(values[0], FolderSample):
            return self._folder_sample(batch)
        if self.keys_are_generated:
            # Generated keys have no "/" or "." and are unique: no check_key needed.
            keys = GeneratedKeys(first_index, first_index + len(values))
        if isinstance(values[0], bytes):  # JSON lines
            if self.fields is None and self.keys_are_generated:
                # Packed as they are and parsed by the shard writer (see the inputs module).
                return self._batch(keys, ("json",), (values,), True, batch)
            rows = [parse_json_line(line, batch.source, n) for line, n in zip(values, batch.numbers, strict=True)]
        else:
            rows = values
        if not self.keys_are_generated:
            keys = [self._key(row, i, batch) for i, row in enumerate(rows)]
        if self.fields is None:
            if isinstance(values[0], bytes):
                return self._batch(keys, ("json",), (values,), False, batch)
            members = [_to_json(row, lambda i=i: batch.where(i)) for i, row in enumerate(rows)]
            return self._batch(keys, ("json",), (members,), False, batch)
        columns = []
        for column, ext, tokenize in self.fields:
            option = f"--tokenize {column}={ext}" if tokenize else f"--field {column}={ext}"
            data = []
            for i, row in enumerate(rows):
                if column not in row:
                    raise InputError(f"{batch.where(i)}: no column {column!r} (from {option})")
                if tokenize:
                    value = row[column]
                    if not isinstance(value, str):
                        raise _not_text(value, column, option, batch.where(i))
                    data.append(value)
                else:
                    data.append(_field_bytes(row[column], column, lambda i=i: batch.where(i)))
            columns.append(data)
        exts = tuple(ext for _, ext, _ in self.fields)
        texts = tuple(i for i, (_, _, tokenize) in enumerate(self.fields) if tokenize)
        return self._batch(keys, exts, tuple(columns), False, batch, texts)

    @staticmethod
    def _batch(keys, exts, columns, unparsed_json, batch, tokenize=()) -> SampleBatch:
        # Members still to be tokenized have no size yet: with_tokens computes them.
        sizes = None if tokenize else _sample_sizes(keys, exts, columns)
        return SampleBatch(keys, exts, columns, sizes, unparsed_json, batch, tokenize)

    def _folder_sample(self, batch: Batch) -> SampleBatch:
        (sample,) = batch.values
        if "/" in sample.key:
            raise InputError(
                f"{batch.where(0)}: files in a subfolder would give the key {sample.key!r}, and a "
                "key must not contain '/'; give each subfolder as its own input, or flatten it"
            )
        check_key(sample.key, batch.where(0))
        exts = tuple(ext for ext, _, _ in sample.files)
        for ext in exts:
            check_extension(ext, batch.where(0))
        columns = tuple([FileMember(path, size)] for _, path, size in sample.files)
        return self._batch([sample.key], exts, columns, False, batch)

    def _key(self, row: dict, i: int, batch: Batch) -> str:
        if self.key_field not in row:
            raise InputError(f"{batch.where(i)}: no column {self.key_field!r} for the key (--key)")
        value = row[self.key_field]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InputError(
                f"{batch.where(i)}: key column {self.key_field!r} holds {value!r}; "
                "a key must be a string or an integer"
            )
        key = str(value)
        check_key(key, batch.where(i))
        return key


class Sharder:
    """Cuts the sample stream into shards by count and by real tar size (headers included)."""

    def __init__(self, max_count: int | None, max_size: int | None, check_duplicates: bool):
        self.max_count = max_count
        self.max_size = max_size
        self.check_duplicates = check_duplicates
        self._start_shard()

    def _start_shard(self) -> None:
        self._pieces: list[ShardPiece] = []
        self._count = 0
        self._size = END_SIZE
        self._keys: dict[str, str] = {}  # key -> where it was used, for the duplicate check

    def add(self, samples: SampleBatch) -> Iterator[tuple[list[ShardPiece], int, int]]:
        """Add a batch of samples; yield each shard it completes as (pieces, samples, size).

        A shard is closed when the next sample would exceed a limit. Cut points are found
        with running sums and bisection, so the cost is per shard rather than per sample.
        """
        max_count, max_size = self.max_count, self.max_size
        sizes = samples.sizes  # None (texts not tokenized yet) only without max_size
        count = usable = len(samples.keys)  # usable: samples before one too big for any shard
        if max_size is not None and max(sizes) + END_SIZE > max_size:
            usable = next(i for i, size in enumerate(sizes) if size + END_SIZE > max_size)
        # ends[j] = sum(sizes[:j])
        ends = None if sizes is None else list(itertools.accumulate(sizes, initial=0))
        i = 0
        while i < usable:
            stop = usable if max_count is None else min(usable, i + max_count - self._count)
            if max_size is not None:
                room = ends[i] + max_size - self._size
                stop = min(stop, bisect.bisect_right(ends, room, i, usable + 1) - 1)
            if stop == i:  # the next sample does not fit: the shard is complete
                yield self.finish()
                continue
            if self.check_duplicates:
                self._check_keys(samples, i, stop)
            self._pieces.append(_piece(samples, i, stop))
            self._count += stop - i
            if ends is None:
                self._size = None
            else:
                self._size += ends[stop] - ends[i]
            i = stop
        if usable < count:
            size = sizes[usable] + END_SIZE
            raise InputError(
                f"{samples.batch.where(usable)}: sample {samples.keys[usable]!r} takes {size} "
                f"bytes as a tar, more than the maximum shard size {max_size} "
                f"({format_size(max_size)})"
            )

    def _check_keys(self, samples: SampleBatch, start: int, stop: int) -> None:
        seen = self._keys
        for i in range(start, stop):
            key = samples.keys[i]
            if key in seen:
                raise InputError(
                    f"{samples.batch.where(i)}: key {key!r} is already used in this shard by "
                    f"{seen[key]}"
                )
            seen[key] = samples.batch.where(i)

    def finish(self) -> tuple[list[ShardPiece], int, int | None] | None:
        """The shard in progress as (pieces, samples, tar size or None if not known yet), None
        if empty; then a new one."""
        finished = (self._pieces, self._count, self._size) if self._count else None
        self._start_shard()
        return finished


def _piece(samples: SampleBatch, start: int, stop: int) -> ShardPiece:
    batch = samples.batch
    return ShardPiece(
        samples.keys[start:stop],
        samples.exts,
        tuple(column[start:stop] for column in samples.columns),
        (batch.source, batch.numbers[start:stop]) if samples.unparsed_json else None,
        samples.tokenize,
        (batch.source, batch.offsets[start], batch.offsets[stop])
        if samples.unparsed_json and batch.offsets is not None else None,
    )


def _by_reference(job: ShardJob) -> ShardJob:
    """``job`` without the bytes of lines its writer can read from their file itself: a pool
    worker reading them from the page cache costs less than their pickling and piping."""
    if not any(piece.lines_at for piece in job.pieces):
        return job
    return job._replace(pieces=[piece._replace(columns=()) if piece.lines_at else piece
                                for piece in job.pieces])


# --- tokenizing ------------------------------------------------------------------------------


_NPY_HEADERS_MAX = 1 << 16  # .npy headers kept, by array length


class TokenEncoder:
    """Texts to token ids stored as ``.npy`` bytes, with a Hugging Face ``tokenizers`` tokenizer.

    Ids are those of ``encode(text, add_special_tokens=False)``, the same as
    ``PackedSequences`` computes on the fly, and no EOS is stored: ``PackedSequences`` appends
    it when it packs. The dtype is little-endian ``uint16`` when every id of the vocabulary is
    below 65,536, else ``uint32``; the bytes are what ``np.save(allow_pickle=False)`` writes.
    Picklable (the tokenizer is rebuilt from its JSON in each process that needs it).
    """

    def __init__(self, json_text: str, file: str, sha256: str):
        self.json_text, self.file, self.sha256 = json_text, file, sha256
        self._hf = None
        self._headers: dict[int, bytes] = {}
        try:
            vocab = self._loaded().get_vocab(with_added_tokens=True)
        except InputError:
            raise
        except Exception as error:  # tokenizers raises its own exception types
            raise InputError(f"{file}: not a valid tokenizer.json ({error})") from None
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self.dtype = "uint16" if self.vocab_size <= 1 << 16 else "uint32"

    @classmethod
    def load(cls, path: str | os.PathLike) -> TokenEncoder:
        """From a ``tokenizer.json`` (a local path or a URL wdstream reads); InputError names
        the file when it is missing, unreadable or not a tokenizer."""
        from wdstream.sources import urls
        from wdstream.sources.objects import read_bytes

        path = os.fspath(path)
        local = urls.to_local_path(path)
        try:
            if local is not None:
                with open(local, "rb") as file:
                    data = file.read()
            else:
                data = read_bytes(path)
        except OSError as error:
            raise InputError(f"{path}: cannot read the tokenizer ({error.strerror})") from None
        except WdstreamError as error:
            raise InputError(f"{path}: cannot read the tokenizer ({error})") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}: not a valid tokenizer.json (not UTF-8 text)") from None
        return cls(text, path, hashlib.sha256(data).hexdigest())

    def _loaded(self):
        if self._hf is None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise InputError("--tokenizer needs the 'tokenizers' package: "
                                 "pip install 'wdstream[llm]'") from None
            try:
                self._hf = Tokenizer.from_str(self.json_text)
            except Exception as error:  # a JSON or a schema error, as tokenizers reports it
                raise InputError(f"{self.file}: not a valid tokenizer.json ({error})") from None
        return self._hf

    def describe(self, columns: Mapping[str, str]) -> dict:
        """The manifest's ``tokenizer`` entry."""
        return {"file": os.path.basename(self.file.rstrip("/")), "sha256": self.sha256,
                "dtype": self.dtype, "vocab_size": self.vocab_size, "columns": dict(columns)}

    def __call__(self, texts: list[str]) -> list[bytes]:
        import numpy as np

        tokenizer = self._loaded()
        if _tokenizers_threads_off():
            encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        else:  # one text at a time: no thread pool, one core per process (--workers N: N)
            encodings = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        dtype = np.dtype("<u2" if self.dtype == "uint16" else "<u4")  # the same on any host
        headers = self._headers
        out = []
        for encoding in encodings:
            ids = np.array(encoding.ids, dtype=dtype)
            header = headers.get(len(ids)) or self._npy_header(ids)
            out.append(header + ids.tobytes())
        return out

    def _npy_header(self, ids) -> bytes:
        """The bytes ``np.save`` writes before the data of a 1-d array like ``ids``."""
        from numpy.lib import format as npy

        buffer = io.BytesIO()
        npy.write_array_header_1_0(buffer, npy.header_data_from_array_1_0(ids))
        header = buffer.getvalue()
        if len(self._headers) < _NPY_HEADERS_MAX:
            self._headers[len(ids)] = header
        return header

    def __getstate__(self):
        return {**self.__dict__, "_hf": None, "_headers": {}}


def _tokenizers_threads_off() -> bool:
    """Whether ``tokenizers`` runs batches on this thread only (TOKENIZERS_PARALLELISM off):
    set in the pool workers; in a user's process, their choice stands."""
    value = os.environ.get("TOKENIZERS_PARALLELISM", "").lower()
    return value in ("0", "false", "off", "no", "n", "f")


def _tokenize_columns(columns: tuple[list, ...], tokenize: tuple[int, ...],
                      encoder: TokenEncoder) -> tuple[list, ...]:
    """``columns`` with the texts of the ``tokenize`` columns replaced by ``.npy`` bytes."""
    encoded = list(columns)
    for i in tokenize:
        encoded[i] = encoder(columns[i])
    return tuple(encoded)


def _with_tokens(samples: SampleBatch, encoded: list[list[bytes]]) -> SampleBatch:
    """``samples`` with the ``.npy`` members of its ``tokenize`` columns, and so with the
    sizes the Sharder needs."""
    columns = list(samples.columns)
    for i, data in zip(samples.tokenize, encoded, strict=True):
        columns[i] = data
    columns = tuple(columns)
    return samples._replace(columns=columns, tokenize=(),
                            sizes=_sample_sizes(samples.keys, samples.exts, columns))


# --- writing one shard (in this process or a pool worker) ------------------------------------


class _ShardSink:
    """The file object TarWriter writes to: an in-memory buffer (``write`` is the buffer's own
    C method, called three times per member) that ``flush`` compresses (if asked), hashes and
    sends on in chunks. ``size`` and ``sha256`` are the stored bytes', ``tar_size`` the tar's."""

    def __init__(self, out, compress: tuple[str, int] | None = None):
        from wdstream.shards.compress import ShardCompressor

        self._out = out
        self._buffer = io.BytesIO()
        self.write = self._buffer.write
        self.sha256 = hashlib.sha256()
        self.size = self.tar_size = 0
        self.first = b""  # the tar's first HEAD_BYTES (before compression), for ``head``
        self._compressor = ShardCompressor(*compress) if compress else None

    def flush(self, at_least: int = 1) -> None:
        if self._buffer.tell() >= at_least:
            chunk = self._buffer.getvalue()
            self._buffer = io.BytesIO()
            self.write = self._buffer.write
            if self.tar_size < HEAD_BYTES:
                self.first += chunk[: HEAD_BYTES - self.tar_size]
            self.tar_size += len(chunk)
            if self._compressor is not None:
                chunk = self._compressor.compress(chunk)
            self._store(chunk)

    def finish(self) -> None:
        self.flush()
        if self._compressor is not None:
            self._store(self._compressor.flush())

    def _store(self, chunk: bytes) -> None:
        if chunk:
            self.sha256.update(chunk)
            self.size += len(chunk)
            self._out.write(chunk)


def _file_bytes(member: FileMember) -> bytes:
    return read_member(member.path, member.size)  # local path or URL; size checked


def _check_json_lines(lines: list[bytes], source: str, numbers: Sequence[int]) -> None:
    """Parse every line; on the first bad one, raise the error that names it."""
    decode = _decode_json
    try:
        for line in lines:
            value = decode(line.decode("utf-8"))
            if type(value) is not dict or not _valid_unicode(line, value):
                raise ValueError
    except (ValueError, RecursionError):  # also UnicodeDecodeError; find the line again
        for line, number in zip(lines, numbers, strict=True):
            parse_json_line(line, source, number)
        raise


def write_shard(job: ShardJob, via: str, encoder: TokenEncoder | None = None) -> ShardInfo:
    """Write one shard and return its manifest entry (URL relative to the output prefix).

    Pieces with texts still to tokenize (``pack(max_count=...)`` without ``max_size``) are
    tokenized here, with ``encoder``."""
    from wdstream.sources.objects import open_write

    with open_write(job.url, via=via) as out:
        sink = _ShardSink(out, job.compress)
        tar = TarWriter(sink)
        add = tar.add
        for keys, exts, columns, json_lines_at, tokenize, lines_at in job.pieces:
            if not columns:  # sent by reference (_by_reference)
                columns = (read_lines(*lines_at, len(keys)),)
            if json_lines_at is not None:
                _check_json_lines(columns[0], *json_lines_at)
            if tokenize:
                columns = _tokenize_columns(columns, tokenize, encoder)
            if len(exts) == 1 and not isinstance(columns[0][0], FileMember):  # the common case
                suffix = "." + exts[0]
                for key, data in zip(keys, columns[0], strict=True):
                    add(key + suffix, data)
            else:
                for i, key in enumerate(keys):
                    for ext, column in zip(exts, columns, strict=True):
                        data = column[i]
                        add(f"{key}.{ext}", _file_bytes(data) if isinstance(data, FileMember) else data)
                    sink.flush(_FLUSH_SIZE)
            sink.flush(_FLUSH_SIZE)
        tar.close()
        sink.finish()
        if job.size is not None and sink.tar_size != job.size:  # boundaries rely on exact sizes
            raise AssertionError(f"{job.url}: wrote {sink.tar_size} bytes, expected {job.size}")
    last = job.pieces[-1][0] if job.pieces else ()
    return ShardInfo(job.name, job.samples, sink.size, sink.sha256.hexdigest(),
                     head_digest(sink.first), last[len(last) - 1] if len(last) else None)


_worker_encoder: TokenEncoder | None = None  # a pool worker's, set by _init_worker


def _init_worker(encoder: TokenEncoder | None) -> None:
    """Pool initializer: Ctrl-C is handled by the main process, which stops the pool; a worker
    interrupted while idle would only print a traceback. A worker tokenizes on one thread:
    ``--workers`` sets how many cores tokenize."""
    global _worker_encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_encoder = encoder
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
    from wdstream.sources.objects import settle_uploads

    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        return write_shard(job, via, _worker_encoder)
    except BaseException:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        settle_uploads()  # the main process deletes the shard once this job has returned
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tokenize_in_worker(texts: list[list[str]]) -> list[list[bytes]]:
    return [_worker_encoder(column) for column in texts]


class _InlineWriter:
    """Tokenizes and writes each shard as it comes, in this process."""

    def __init__(self, via: str, encoder: TokenEncoder | None = None):
        self.via = via
        self.encoder = encoder

    def tokenized(self, batches: Iterable[SampleBatch]) -> Iterator[SampleBatch]:
        """``batches`` in order, their texts tokenized."""
        for samples in batches:
            if samples.tokenize:
                samples = _with_tokens(
                    samples, [self.encoder(samples.columns[i]) for i in samples.tokenize]
                )
            yield samples

    def submit(self, job: ShardJob) -> Iterator[ShardInfo]:
        yield write_shard(job, self.via, self.encoder)

    def drain(self) -> Iterator[ShardInfo]:
        return iter(())

    def close(self, failed: bool) -> None:
        pass


class _PoolWriter:
    """Tokenizes batches and writes shards in a process pool; results come back in submission
    order.

    At most ``workers + 1`` shards, and as many batches to tokenize, are in flight, which
    bounds memory to a few shards.
    """

    def __init__(self, via: str, workers: int, encoder: TokenEncoder | None = None):
        import multiprocessing
        import threading
        from concurrent.futures import ProcessPoolExecutor

        self.via = via
        self.limit = workers + 1
        self._pending = []
        # fork starts workers in milliseconds, but is safe only in a single-threaded process
        # (and on Linux); checking a cloud prefix starts fsspec's I/O thread: then forkserver.
        fork_is_safe = sys.platform == "linux" and threading.active_count() == 1
        method = "fork" if fork_is_safe else "forkserver"
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context(method),
            initializer=_init_worker,
            initargs=(encoder,),
        )

    def tokenized(self, batches: Iterable[SampleBatch]) -> Iterator[SampleBatch]:
        """``batches`` in order, their texts tokenized by the workers, several at a time."""
        pending: list[tuple[SampleBatch, object]] = []

        def first_done() -> SampleBatch:
            samples, future = pending.pop(0)
            return samples if future is None else _with_tokens(samples, future.result())

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
        self._pending.append(self._pool.submit(_write_shard_in_worker, _by_reference(job),
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


# --- the run ---------------------------------------------------------------------------------


def _check_options(fields, key, max_count, max_size, name, workers, part, via, tokenize=None,
                   tokenizer=None):
    seen: dict[str, str] = {}  # extension -> "--field COLUMN=EXT"
    for option, members in (("--field", fields), ("--tokenize", tokenize)):
        if members is None:
            continue
        if not members:
            raise InputError(f"{option}: give at least one COLUMN=EXT")
        for column, ext in members.items():
            if not isinstance(column, str) or not isinstance(ext, str):
                raise OptionTypeError(f"{option}: columns and extensions are strings, not "
                                      f"{column!r:.40}: {ext!r:.40}")
            if not column or not ext or "/" in ext or ext.startswith(".") or ext.endswith("."):
                example = "tokens.npy" if option == "--tokenize" else "txt"
                raise InputError(f"{option} {column}={ext}: need COLUMN=EXT with an extension "
                                 f"like {example}")
            check_extension(ext, f"{option} {column}={ext}")
            if option == "--tokenize" and ext.split(".")[-1].lower() != "npy":
                raise InputError(f"--tokenize {column}={ext}: token ids are stored as .npy; "
                                 f"name the member like tokens.npy")
            other = seen.setdefault(ext.lower(), f"{option} {column}={ext}")
            if other != f"{option} {column}={ext}":
                raise InputError(f"{other} and {option} {column}={ext} both make a .{ext} member")
    if tokenize is not None and tokenizer is None:
        raise InputError("--tokenize needs --tokenizer PATH (a tokenizer.json)")
    if tokenizer is not None and tokenize is None:
        raise InputError("--tokenizer: name the text columns to tokenize with --tokenize "
                         "COLUMN=EXT, e.g. --tokenize text=tokens.npy")
    _check_types(key, max_count, name, workers, part)
    if key is not None and not key:
        raise InputError("--key: give a column name")
    if max_count is not None and max_count < 1:
        raise InputError(f"--max-count must be at least 1, got {max_count}")
    if max_size is not None and max_size < 2 * 512 + END_SIZE:
        raise InputError(f"--max-size {max_size} is smaller than the smallest tar with one member")
    if not name or "/" in name or name.startswith(".") \
            or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InputError(f"--name {name!r}: need a file name prefix without '/' or control "
                         "characters")
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    if part is not None:
        index, count = part
        if count < 1 or not 0 <= index < count:
            raise InputError(f"--part {index}/{count}: need 0 <= I < N")
    if via not in CHOICES["via"]:
        raise OptionError(f"--via {via!r}: choose auto, cli or fsspec")


def _check_types(key, max_count, name, workers, part) -> None:
    """The Python API's arguments of the wrong type, as the options' errors (not a
    TypeError from a comparison deep in the run)."""
    from wdstream import options

    options.integer("pack", "max_count", max_count, allow_none=True)
    options.integer("pack", "workers", workers)
    if key is not None and not isinstance(key, str):
        raise OptionTypeError(f"pack: key must be a column name, not {key!r:.80}")
    if not isinstance(name, str):
        raise OptionTypeError(f"pack: name must be a string, not {name!r:.80}")
    if part is not None and (not isinstance(part, tuple | list) or len(part) != 2):
        raise OptionTypeError(f"pack: part must be (index, count), not {part!r:.80}")
    if part is not None:
        for value in part:
            options.integer("pack", "part", value)


def _prepare_output(output: str, manifest_names: list[str], overwrite: bool) -> None:
    """Refuse a prefix that holds a manifest, or (overwrite) delete it before any shard."""
    from wdstream.sources import urls
    from wdstream.sources.objects import delete, exists

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


def _delete_quietly(urls_to_delete: Iterable[str]) -> None:
    """Delete what a failed run wrote, once its uploads have ended (one interrupted in this
    thread goes on in fsspec's I/O loop, and would land after the delete)."""
    from wdstream.sources.objects import delete, settle_uploads

    settle_uploads()
    for url in urls_to_delete:
        try:
            delete(url)  # a shard that never appeared is fine
        except WdstreamError:
            pass  # best effort: the original error is the one to report


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
) -> Manifest:
    """Pack records from ``inputs`` into tar shards under ``output`` and write the manifest.

    ``inputs``: paths of JSON Lines (also .gz/.zst), Parquet, CSV/TSV files, folders, or "-"
    for JSON Lines on stdin, read in order; each may also be an s3://, gs://, https:// or
    other fsspec URL or a glob pattern (matches in sorted order), streamed (``remote``). ``fields``: {column: extension} to store columns as
    members (default: the whole record as ``.json``). ``key``: the column keys come from
    (default: generated, unique across the dataset). ``max_count``/``max_size``: shard limits;
    ``max_size`` bounds the real tar bytes and defaults to 256 MB when neither is given.
    ``via``: "auto", "cli" or "fsspec" for s3:// and gs:// uploads. ``workers``: processes
    writing shards (same bytes as 1). ``part``: (i, n) to write only every n-th shard from i
    (see the module docstring). ``tokenize``: {column: extension ending in ``npy``} to store
    text columns as token ids (see below), with ``tokenizer``, the path of a Hugging Face
    ``tokenizer.json``. ``progress``: called with a PackProgress now and then.
    ``compress``: ``"zstd"`` or ``"gzip"`` writes ``.tar.zst``/``.tar.gz`` shards at
    ``level`` (default 3 and 6); the manifest's ``bytes`` and ``sha256`` are then the stored
    bytes', and ``max_size`` bounds them by bounding each tar to the most that can never
    compress to more than ``max_size`` (so text shards come out a few times smaller).

    Tokenized members hold the ids of ``encode(text, add_special_tokens=False)``, without
    EOS (``PackedSequences`` appends it), as a ``.npy`` array of ``uint16`` (vocabularies up
    to 65,536) or ``uint32``. They are computed in the processes that write the shards, so
    ``workers`` parallelises tokenizing too; the manifest's ``tokenizer`` key records the
    tokenizer's file name, SHA-256 and vocabulary size, the dtype and the columns.

    Returns the manifest written (``index.json``, or the part's manifest).
    """
    from wdstream import __version__
    from wdstream.sources import urls

    paths = [os.fspath(inputs)] if isinstance(inputs, str | os.PathLike) else [
        os.fspath(path) for path in inputs
    ]
    output = os.fspath(output)
    if max_size is not None:
        max_size = parse_size(max_size)
    fields = dict(fields) if fields is not None else None
    tokenize = dict(tokenize) if tokenize is not None else None
    _check_options(fields, key, max_count, max_size, name, workers, part, via, tokenize, tokenizer)
    checked = check_inputs(paths)
    if (fields or key or tokenize) and any(item.kind == "folder" for item in checked):
        folder = next(item.path for item in checked if item.kind == "folder")
        raise InputError(f"{folder}: --field, --tokenize and --key do not apply to a folder, "
                         "whose files are the members")
    if max_size is None and max_count is None:
        max_size = DEFAULT_MAX_SIZE
    level = check_compression(compress, level)
    codec = (compress, level) if compress else None
    suffix = WRITE_SUFFIXES[compress] if compress else ".tar"
    # Checked before the output is touched (--overwrite deletes the old manifest).
    encoder = TokenEncoder.load(tokenizer) if tokenize else None

    maker = SampleMaker(fields, key, tokenize)
    # Generated keys are unique by construction; keys from a column or file names may repeat.
    keys_from_data = key is not None or any(item.kind == "folder" for item in checked)
    tar_max = tar_limit(compress, max_size) if compress and max_size is not None else max_size
    sharder = Sharder(max_count, tar_max, check_duplicates=keys_from_data)
    final_manifest = part_manifest_name(part) if part else MANIFEST_NAME
    # A part replaces neither the merged manifest nor another part's.
    _prepare_output(output, [MANIFEST_NAME, final_manifest] if part else [MANIFEST_NAME], overwrite)

    read_counter = ReadCounter(sum(item.size for item in checked))
    status = PackProgress(input_total=read_counter.total)
    shards: list[ShardInfo] = []
    extensions: set[str] = set()
    started: list[str] = []  # URLs of shards this run began to write
    writer = _PoolWriter(via, workers, encoder) if workers > 1 else _InlineWriter(via, encoder)

    def sample_batches() -> Iterator[SampleBatch]:
        first_index = 0  # of the batch's first record among all records
        for batch in iter_batches(checked, counter=read_counter):
            yield maker.make(batch, first_index)
            first_index += len(batch.values)

    def shard_jobs() -> Iterator[ShardJob]:
        index = -1
        batches = sample_batches()
        if tokenize and max_size is not None:
            # Shard boundaries depend on the members' sizes: tokenize first (in the pool),
            # several batches ahead. Without max_size, the shard writers tokenize, and a part
            # tokenizes only the records of its own shards.
            batches = writer.tokenized(batches)

        def job(finished: tuple[list[ShardPiece], int, int | None]) -> ShardJob | None:
            nonlocal index
            index += 1
            if part and index % part[1] != part[0]:
                return None
            file_name = shard_name(name, index, suffix)
            return ShardJob(file_name, urls.join(output, file_name), *finished, codec)

        for samples in batches:
            extensions.update(samples.exts)
            for finished in sharder.add(samples):
                if next_job := job(finished):
                    yield next_job
            status.records += len(samples.batch.values)
            status.input_bytes = read_counter.read
            if progress is not None:
                progress(status)
        last = sharder.finish()
        if last and (next_job := job(last)):
            yield next_job

    def done(info: ShardInfo) -> None:
        shards.append(info)
        status.shards += 1
        status.samples += info.samples
        status.bytes += info.bytes
        if progress is not None:
            progress(status)

    failed = True
    try:
        for job in shard_jobs():
            started.append(job.url)
            for info in writer.submit(job):
                done(info)
        for info in writer.drain():
            done(info)
        failed = False
    finally:
        writer.close(failed)
        if failed:
            _delete_quietly(started)

    status.input_bytes = read_counter.read
    if progress is not None:
        progress(status)
    extra = {
        "packed_by": {
            "tool": "wdstream",
            "version": __version__,
            "inputs": ["<stdin>" if p == "-" else p for p in paths],
            "options": {
                "fields": fields,
                "key": key,
                "max_count": max_count,
                "max_size": max_size,
                "name": name,
            },
        }
    }
    if tokenize:
        extra["packed_by"]["options"]["tokenize"] = tokenize
        extra["packed_by"]["options"]["tokenizer"] = os.fspath(tokenizer)
        extra["tokenizer"] = encoder.describe(tokenize)
    if part:
        extra["packed_by"]["part"] = list(part)
    if compress:
        extra["packed_by"]["options"].update(compress=compress, level=level)
        extra["compression"] = {"codec": compress, "level": level}
    manifest = Manifest(shards=shards, extensions=sorted(extensions), extra=extra, base=output)
    try:
        manifest.url = write_manifest(manifest, output, via=via, name=final_manifest)
    except BaseException:
        _delete_quietly([*started, urls.join(output, final_manifest)])
        raise
    return manifest


def _is_part(value) -> bool:
    """``packed_by.part`` as ``pack(part=...)`` writes it: ``[index, count]``."""
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _shard_index(url: str) -> int | None:
    """The index a shard name ends in (``...-000012.tar`` -> 12), or None."""
    digits = url.rsplit("-", 1)[-1].split(".")[0]
    return int(digits) if digits.isdigit() and digits.isascii() else None


def merge_parts(manifests: list[Manifest], output: str) -> Manifest:
    """Join manifests into one for ``output`` (``wdstream index --merge``).

    When the manifests are all the parts of one ``pack(part=...)`` run, the shards are put back
    in their global order and the packing options kept, so the result equals the manifest of a
    single run. Other manifests are joined in the order given.
    """
    from wdstream.shards.index import merge_manifests

    merged = merge_manifests(manifests, output)
    packed = [m.extra.get("packed_by") or {} for m in manifests]
    packed = [p if isinstance(p, dict) else {} for p in packed]  # read from storage: any JSON
    parts = [p.get("part") for p in packed]
    if parts and all(_is_part(p) for p in parts) and all(
            _shard_index(shard.url) is not None for shard in merged.shards):
        count = parts[0][1]
        same_run = all(
            {k: v for k, v in p.items() if k != "part"}
            == {k: v for k, v in packed[0].items() if k != "part"}
            for p in packed
        )
        in_order = count == len(parts) and sorted(i for i, _ in parts) == list(range(count))
        if same_run and in_order and all(n == count for _, n in parts):
            # Shard names end in -{index:06d}.tar, the shard's index in a single run.
            merged.shards.sort(key=lambda shard: _shard_index(shard.url))
            merged.extra["packed_by"] = {k: v for k, v in packed[0].items() if k != "part"}
            for key, value in manifests[0].extra.items():  # e.g. "tokenizer"
                if key != "packed_by" and all(m.extra.get(key) == value for m in manifests):
                    merged.extra.setdefault(key, value)
    return merged
