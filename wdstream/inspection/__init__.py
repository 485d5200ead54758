"""Looking at a dataset from Python: what it holds, whether its shards are intact, its samples.

The ``wdstream ls``, ``verify``, ``cat`` and ``bench`` commands are thin wrappers over these
functions::

    from wdstream.inspection import describe, verify, read_samples, sample_to_json

    summary = describe("s3://bucket/prefix/")          # shards, counts, sizes, extensions, extra
    report = verify("s3://bucket/prefix/", deep=True)  # report.ok, report.problems
    for sample in read_samples("s3://bucket/prefix/", limit=3):
        print(sample_to_json(sample))                   # {"__key__": ..., "jpg": {"bytes": 1234}}

A *source* is what ``StreamingDataset`` accepts: a dataset prefix (with ``index.json``, or else
the ``*.tar`` files directly under it), a manifest URL ending in ``.json``, a brace pattern
(``s3://b/shard-{000000..000009}.tar``), a single ``.tar`` URL, or a list of shard URLs.
``allow_external_shards`` is ``StreamingDataset``'s: a manifest may then name shards outside
its prefix (never a ``pipe:`` command).
Only ``benchmark`` imports torch, when it is called.

One module per question: ``summary`` (``describe``), ``verification`` (``verify``,
``check_shard``), ``contents`` (``read_samples``, ``sample_to_json``), ``throughput``
(``benchmark``), and ``raw_files`` for raw Parquet, JSON Lines and Arrow files; ``parallel``
runs their per-shard work in threads.
"""

from wdstream.inspection.contents import member_to_json, read_samples, sample_to_json
from wdstream.inspection.summary import DatasetSummary, ShardSummary, describe
from wdstream.inspection.throughput import BenchResult, benchmark
from wdstream.inspection.verification import ShardCheck, VerifyReport, check_shard, verify
from wdstream.shards.locate import Shards, find_shards

__all__ = [
    "BenchResult",
    "DatasetSummary",
    "ShardCheck",
    "ShardSummary",
    "Shards",
    "VerifyReport",
    "benchmark",
    "check_shard",
    "describe",
    "find_shards",
    "member_to_json",
    "read_samples",
    "sample_to_json",
    "verify",
]
