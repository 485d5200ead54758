"""What the inspection functions share: per-shard work in threads that a Ctrl-C stops
promptly, a thread-safe progress callback, and problem texts without the shard's URL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from wdstream.errors import InputError, WdstreamError

Progress = Callable[[int], object]  # called with a number of bytes just read


class Cancelled(Exception):
    """Raised in worker threads at their next read once the main thread was interrupted."""


def parallel(function: Callable, items: Sequence, workers: int,
             stop: threading.Event | None = None) -> list:
    """``[function(item) for item in items]`` in ``workers`` threads, in order. If the main
    thread is interrupted (Ctrl-C), ``stop`` is set so that readers give up promptly."""
    if workers < 1:
        raise InputError(f"workers must be at least 1, got {workers}")
    if workers == 1 or len(items) <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(function, item) for item in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            if stop is not None:
                stop.set()
            for f in futures:
                f.cancel()
            raise


def reporter(progress: Progress | None, stop: threading.Event) -> Progress:
    """A per-chunk callback for reader threads: ``progress`` made thread-safe, and the place
    where a reader notices that the run was interrupted."""
    lock = threading.Lock()

    def report(nbytes: int) -> None:
        if stop.is_set():
            raise Cancelled()
        if progress is not None:
            with lock:
                progress(nbytes)

    return report

def problem_text(error: WdstreamError, url: str) -> str:
    """An error's message without the shard URL in front (tables name the shard already)."""
    text = str(error)
    return text[len(url) + 2:] if text.startswith(url + ": ") else text

