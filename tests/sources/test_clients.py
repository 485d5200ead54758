"""sources/clients.py: one client per process and environment, across forks."""

from __future__ import annotations

import multiprocessing
import threading

from wdstream.sources import clients


def _make_a_client(done) -> None:
    clients.cached_client("test-fork", "s3", 1.0, object)
    done.set()


def test_a_child_forked_while_a_thread_makes_a_client_makes_its_own(monkeypatch):
    # a reader thread of the parent holds the lock while it connects, at the fork
    monkeypatch.setattr(clients, "_clients", {})  # this test's clients stay its own
    holding, release = threading.Event(), threading.Event()

    def slow_make():
        holding.set()
        release.wait(10)
        return object()

    maker = threading.Thread(target=clients.cached_client,
                             args=("test-slow", "s3", 1.0, slow_make))
    maker.start()
    child = None
    try:
        assert holding.wait(10)
        context = multiprocessing.get_context("fork")
        done = context.Event()
        child = context.Process(target=_make_a_client, args=(done,))
        child.start()
        assert done.wait(20), "the forked child waited for its parent's thread"
        child.join(10)
        assert child.exitcode == 0
    finally:
        release.set()
        maker.join(10)
        if child is not None and child.is_alive():
            child.kill()
