"""Tokenizing while packing: ``TokenEncoder`` turns texts into ``.npy`` members of token ids,
and the helpers put them into a SampleBatch or a shard's columns."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping

from wdstream.errors import InputError, WdstreamError
from wdstream.write.jobs import SampleBatch
from wdstream.write.tar_sizes import sample_sizes

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


def tokenize_columns(columns: tuple[list, ...], tokenize: tuple[int, ...],
                      encoder: TokenEncoder) -> tuple[list, ...]:
    """``columns`` with the texts of the ``tokenize`` columns replaced by ``.npy`` bytes."""
    encoded = list(columns)
    for i in tokenize:
        encoded[i] = encoder(columns[i])
    return tuple(encoded)


def with_tokens(samples: SampleBatch, encoded: list[list[bytes]]) -> SampleBatch:
    """``samples`` with the ``.npy`` members of its ``tokenize`` columns, and so with the
    sizes the Sharder needs."""
    columns = list(samples.columns)
    for i, data in zip(samples.tokenize, encoded, strict=True):
        columns[i] = data
    columns = tuple(columns)
    return samples._replace(columns=columns, tokenize=(),
                            sizes=sample_sizes(samples.keys, samples.exts, columns))

