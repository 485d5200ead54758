"""JSON members decode with orjson by default, with the standard library's leniency kept."""

import math

import orjson
import pytest

from wdstream.errors import ShardError
from wdstream.stream.read import decode


def test_json_is_parsed_by_orjson_by_default():
    assert decode._fast_loads is orjson.loads
    table = decode.build_decoders(None)
    sample = {"__key__": "k", "__url__": "u", "json": b'{"a": [1, 2.5, "x"]}'}
    assert decode.decode_sample(sample, table)["json"] == {"a": [1, 2.5, "x"]}


def test_json_that_only_the_standard_library_accepts_still_decodes():
    value = decode.decode_sample({"__key__": "k", "json": b'{"x": NaN}'},
                                 decode.build_decoders(None))["json"]["x"]
    assert math.isnan(value)


def test_bad_json_names_the_sample():
    with pytest.raises(ShardError, match=r"shard\.tar: sample 'k7'.*cannot decode \.json"):
        decode.decode_sample({"__key__": "k7", "__url__": "shard.tar", "json": b"{bad"},
                             decode.build_decoders(None))
