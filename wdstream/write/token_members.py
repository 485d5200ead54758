"""Tokenizing while packing: the ``.npy`` members of token ids (``wdstream.write.tokenizer``) put into
a SampleBatch, whose sizes the sharder then knows, or into a shard's columns."""

from __future__ import annotations

from wdstream.write.jobs import SampleBatch
from wdstream.write.tar_sizes import sample_sizes
from wdstream.write.tokenizer import Tokenizer


def tokenize_columns(columns: tuple[list, ...], tokenize: tuple[int, ...],
                      encoder: Tokenizer) -> tuple[list, ...]:
    """``columns`` with the texts of the ``tokenize`` columns replaced by ``.npy`` bytes."""
    encoded = list(columns)
    for i in tokenize:
        encoded[i] = encoder.encode_npy(columns[i])
    return tuple(encoded)


def with_tokens(samples: SampleBatch, encoded: list[list[bytes]]) -> SampleBatch:
    """``samples`` with the ``.npy`` members of its ``tokenize`` columns, and so with the
    sizes the Sharder needs."""
    columns = list(samples.columns)
    for i, data in zip(samples.tokenize, encoded, strict=True):
        columns[i] = data
    members = tuple(columns)
    return samples._replace(columns=members, tokenize=(),
                            sizes=sample_sizes(samples.keys, samples.exts, members))

