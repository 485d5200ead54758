"""JSON Lines read by a pool worker rather than the main process: compressed (``.gz``,
``.zst``) and remote inputs, whose decompressing and reading would otherwise be the main
process's work, with ``workers > 1``.

One worker at a time reads one input, as ``read_jsonl`` would, and sends each batch to the
main process through a pipe: the batch's line numbers, its lines joined by newlines (a
stripped line holds none) and the input bytes read so far. The main process splits them
again and goes on as with any batch, so the records, their order, their line numbers and
the shards are the same as when it reads the input itself. The pipe holds one batch at a
time: a reader that gets ahead waits, and memory stays bounded whatever the input's size.
An error (``s3://raw/part-3.jsonl.zst:1234: ...``) is sent as it was raised.
"""

from __future__ import annotations

from collections.abc import Iterator

from wdstream.errors import WdstreamError
from wdstream.write.jsonl_inputs import read_jsonl
from wdstream.write.record_batches import Batch, ReadCounter, source_name

_POLL_SECONDS = 0.2  # how often the main process checks that the reading worker still runs


def send_batches(connection, path: str, max_record: int) -> None:
    """In the worker: read ``path`` and send its batches, then ``("end", bytes read)``; an
    error is sent as ``("error", error)`` and raised again."""
    counter = ReadCounter()
    try:
        for batch in read_jsonl(path, max_record, counter):
            connection.send(("batch", batch.numbers, b"\n".join(batch.values), counter.read))
    except WdstreamError as error:
        connection.send(("error", error))
        raise
    connection.send(("end", counter.read))


def receive_batches(connection, future, path: str, counter: ReadCounter) -> Iterator[Batch]:
    """In the main process: the batches a worker sends for ``path`` (``future``: its job),
    the bytes it has read added to ``counter``."""
    source = source_name(path)
    before = counter.read
    while True:
        while not connection.poll(_POLL_SECONDS):
            if future.done():  # ended without its last message: its own error, or a crash
                if connection.poll(0):
                    break
                future.result()
                raise WdstreamError(f"{source}: the worker reading it stopped early")
        message = connection.recv()
        if message[0] == "error":
            raise message[1]
        counter.read = before + message[-1]
        if message[0] == "end":
            future.result()
            return
        _, numbers, lines, _ = message
        yield Batch(source, "line", numbers, lines.split(b"\n"))
