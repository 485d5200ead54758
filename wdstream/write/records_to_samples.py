"""Records to samples: ``SampleMaker`` turns each batch of records into a ``SampleBatch``
(keys + members, column by column) following ``pack``'s layout options."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from wdstream.errors import InputError
from wdstream.shards.samples import check_extension, check_key
from wdstream.write.jobs import FileMember, GeneratedKeys, Keys, SampleBatch
from wdstream.write.json_records import field_bytes, not_text, parse_json_line, to_json
from wdstream.write.record_batches import Batch, FolderSample
from wdstream.write.tar_sizes import sample_sizes


class SampleMaker:
    """Turns batches of records into samples following the layout options.

    Default: the whole record is one ``.json`` member (a JSON line byte for byte, a row as
    compact JSON). ``fields`` ({column: extension}) stores those columns as members instead,
    and ``tokenize`` ({column: extension}) stores text columns as token ids: their columns of
    the SampleBatch hold the texts (checked here) for a ``Tokenizer`` to turn into ``.npy``
    members later, in a pool worker (see ``pack``). ``key_field`` takes keys from a column;
    otherwise keys are the global record index.
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
        json_lines = isinstance(values[0], bytes)
        keys: Keys
        if self.keys_are_generated:
            # Generated keys have no "/" or "." and are unique: no check_key needed.
            keys = GeneratedKeys(first_index, first_index + len(values))
            if json_lines and self.fields is None:
                # Packed as they are and parsed by the shard writer (see the inputs module).
                return self._batch(keys, ("json",), (values,), True, batch)
        rows = [parse_json_line(line, batch.source, n)
                for line, n in zip(values, batch.numbers, strict=True)] if json_lines else values
        if not self.keys_are_generated:
            keys = [self._key(row, i, batch) for i, row in enumerate(rows)]
        if self.fields is None:
            members = values if json_lines else [
                to_json(row, functools.partial(batch.where, i)) for i, row in enumerate(rows)]
            return self._batch(keys, ("json",), (members,), False, batch)
        columns = tuple(self._column(rows, column, ext, tokenize, batch)
                        for column, ext, tokenize in self.fields)
        exts = tuple(ext for _, ext, _ in self.fields)
        texts = tuple(i for i, (_, _, tokenize) in enumerate(self.fields) if tokenize)
        return self._batch(keys, exts, columns, False, batch, texts)

    @staticmethod
    def _column(rows: list, column: str, ext: str, tokenize: bool, batch: Batch) -> list:
        """The member ``ext`` of each row: the column's bytes, or its text to tokenize."""
        option = f"--tokenize {column}={ext}" if tokenize else f"--field {column}={ext}"
        data: list[str | bytes] = []
        for i, row in enumerate(rows):
            if column not in row:
                raise InputError(f"{batch.where(i)}: no column {column!r} (from {option})")
            if tokenize:
                value = row[column]
                if not isinstance(value, str):
                    raise not_text(value, column, option, batch.where(i))
                data.append(value)
            else:
                data.append(field_bytes(row[column], column, functools.partial(batch.where, i)))
        return data

    @staticmethod
    def _batch(keys, exts, columns, unparsed_json, batch, tokenize=()) -> SampleBatch:
        # Members still to be tokenized have no size yet: with_tokens computes them.
        sizes = None if tokenize else sample_sizes(keys, exts, columns)
        return SampleBatch(keys, exts, columns, sizes, unparsed_json, batch, tokenize)

    def _folder_sample(self, batch: Batch) -> SampleBatch:
        (sample,) = batch.values
        if "/" in sample.key:
            raise InputError(
                f"{batch.where(0)}: files in a subfolder would give the key {sample.key!r}, and a "
                "key must not contain '/'; give each subfolder as its own input, or flatten it"
            )
        check_key(sample.key, batch.where(0))
        exts = tuple(file[0] for file in sample.files)
        for ext in exts:
            check_extension(ext, batch.where(0))
        columns = tuple([FileMember(*file[1:])] for file in sample.files)
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

