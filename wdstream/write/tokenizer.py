"""One wrapper of a Hugging Face ``tokenizers`` tokenizer, for ``wdstream pack --tokenize`` and
``PackedSequences``: read from a ``tokenizer.json`` (a local path or any URL wdstream reads),
built lazily once per process (picklable: DataLoader and pool workers rebuild it from its
JSON), ids of ``encode(text, add_special_tokens=False)`` without EOS.

``tokenizers`` and numpy are imported when a tokenizer is used, not with ``wdstream``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from wdstream.errors import InputError, WdstreamError
from wdstream.limits import json_loads
from wdstream.sources.objects import read_bytes

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

_NPY_HEADERS_MAX = 1 << 16  # .npy headers kept, by array length


def read_tokenizer_file(path: str | os.PathLike) -> bytes:
    """The bytes of a ``tokenizer.json``, local or remote, at most the "tokenizer" size limit
    (``wdstream.limits``); InputError names the file."""
    path = os.fspath(path)
    try:
        return read_bytes(path, limit="tokenizer")
    except WdstreamError as error:
        raise InputError(f"{path}: cannot read the tokenizer ({error})") from None


class Tokenizer:
    """A picklable tokenizer: a ``tokenizer.json`` path, its JSON text, a
    ``tokenizers.Tokenizer``, or (``PackedSequences`` only) any callable ``str -> list[int]``.

    ``tokenizer(text)`` gives the ids as an ``int64`` array; ``encode_npy(texts)`` the bytes
    of ``.npy`` members (``vocab_size`` and ``dtype``: ``uint16`` when every id of the
    vocabulary is below 65,536, else ``uint32``). ``label`` names it in errors.
    """

    def __init__(self, tokenizer, *, label: str = "tokenizer"):
        self._callable: Callable[[str], Sequence[int]] | None = None
        self._json: str | None = None
        self.label = label
        self.file: str | None = None
        self.sha256: str | None = None
        if isinstance(tokenizer, str | os.PathLike):
            self.file = os.fspath(tokenizer)
            data = read_tokenizer_file(self.file)
            self.sha256 = hashlib.sha256(data).hexdigest()
            try:
                self._json = data.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{label}: not a usable tokenizer.json (not UTF-8 "
                                 "text)") from None
        elif hasattr(tokenizer, "to_str") and hasattr(tokenizer, "encode"):
            self._json = tokenizer.to_str()
        elif callable(tokenizer):
            self._callable = tokenizer
        else:
            raise InputError(f"tokenizer: expected a tokenizer.json path, a tokenizers."
                             f"Tokenizer or a callable, not {type(tokenizer).__name__}")
        self._hf: HFTokenizer | None = None
        self._headers: dict[int, bytes] = {}
        if self._json is not None:
            self._loaded()  # a broken tokenizer.json fails now, not at the first text
        self.identity = self._identity()

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """From a ``tokenizer.json`` file, errors naming the file (``wdstream pack``)."""
        return cls(os.fspath(path), label=os.fspath(path))

    def _identity(self) -> str:
        """What a fingerprint records: the tokenizer's JSON digest, or the callable's name
        (a callable's behaviour cannot be hashed; keep it stable across a resume)."""
        if self._json is not None:
            try:  # the same tokenizer saved pretty-printed or compact hashes the same
                canonical = json.dumps(json_loads(self._json), sort_keys=True)
            except ValueError as error:
                raise InputError(f"{self.label}: not a tokenizer.json: {error}") from error
            return hashlib.sha256(canonical.encode()).hexdigest()[:16]
        f = self._callable
        return f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', type(f).__name__)}"

    def _loaded(self) -> HFTokenizer:
        if self._hf is None:
            if self._json is None:  # a callable: no tokenizer.json to load
                raise InputError(f"{self.label}: not a tokenizer.json")
            try:
                from tokenizers import Tokenizer as HFTokenizer
            except ImportError:
                raise InputError("a tokenizer.json needs the 'tokenizers' package: "
                                 "pip install 'wdstream[llm]'") from None
            try:
                self._hf = HFTokenizer.from_str(self._json)
            except Exception as error:  # tokenizers raises a bare Exception ("Model missing")
                raise InputError(f"{self.label}: not a usable tokenizer.json: {error}") from None
        return self._hf

    @property
    def vocab_size(self) -> int:
        """One more than the largest id of the vocabulary (added tokens included)."""
        vocab = self._loaded().get_vocab(with_added_tokens=True)
        return max(vocab.values(), default=-1) + 1

    @property
    def dtype(self) -> str:
        """The dtype of the ``.npy`` members: ``uint16`` if every id fits, else ``uint32``."""
        if "_dtype" not in self.__dict__:
            self._dtype = "uint16" if self.vocab_size <= 1 << 16 else "uint32"
        return self._dtype

    def token_id(self, token: str) -> int:
        if self._json is None:
            raise InputError(f"eos {token!r}: a token string needs a tokenizer.json to look it "
                             "up; give the id as an integer")
        found = self._loaded().token_to_id(token)
        if found is None:
            raise InputError(f"eos {token!r} is not in the tokenizer's vocabulary")
        return int(found)

    def __call__(self, text: str):
        import numpy as np

        if self._callable is not None:
            return np.asarray(self._callable(text), dtype=np.int64)
        ids = self._loaded().encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.int64)

    def encode_npy(self, texts: list[str]) -> list[bytes]:
        """Each text's ids as the bytes ``np.save(allow_pickle=False)`` writes, little-endian
        ``dtype`` whatever the host."""
        import numpy as np

        tokenizer = self._loaded()
        if _threads_off():
            encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        else:  # one text at a time: no thread pool, one core per process (--workers N: N)
            encodings = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        dtype = np.dtype("<u2" if self.dtype == "uint16" else "<u4")
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

    def describe(self, columns: Mapping[str, str]) -> dict:
        """The manifest's ``tokenizer`` entry for a packed dataset."""
        return {"file": os.path.basename((self.file or "").rstrip("/")), "sha256": self.sha256,
                "dtype": self.dtype, "vocab_size": self.vocab_size, "columns": dict(columns)}

    def __getstate__(self):
        return {**self.__dict__, "_hf": None, "_headers": {}}  # rebuilt in each process


def _threads_off() -> bool:
    """Whether ``tokenizers`` runs batches on this thread only (TOKENIZERS_PARALLELISM off):
    set in the pool workers; in a user's process, their choice stands."""
    value = os.environ.get("TOKENIZERS_PARALLELISM", "").lower()
    return value in ("0", "false", "off", "no", "n", "f")
