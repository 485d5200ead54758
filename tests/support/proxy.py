"""A TCP proxy on 127.0.0.1 in front of a local server, for tests of what a reader does when
the link misbehaves: responses throttled, every connection cut (a server that went down),
requests rewritten on their way."""

from __future__ import annotations

import socket
import threading
import time

from tests.support.servers import free_port


def shutdown(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class TcpProxy:
    """Listens on ``port`` and relays each connection to ``target_port``. Responses are
    throttled to ``rate`` bytes/s per connection (None: as fast as they come), requests pass
    through ``rewrite_request``. ``cut()`` drops every connection and refuses new ones;
    ``restore()`` listens again on the same port. ``connections`` counts those accepted."""

    def __init__(self, target_port: int, rate: float | None = None, chunk: int = 16384):
        self.port, self.target, self.rate, self.chunk = free_port(), target_port, rate, chunk
        self.connections = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.restore()

    def rewrite_request(self, data: bytes) -> bytes:
        """A chunk from the client, as sent on to the server."""
        return data

    def restore(self) -> None:
        self._stop.clear()
        listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR on POSIX
        listener.settimeout(0.05)
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()

    def _accept(self, listener) -> None:
        with listener:
            while not self._stop.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                upstream = socket.create_connection(("127.0.0.1", self.target))
                with self._lock:
                    self._pairs.append((client, upstream))
                    self.connections += 1
                for args in ((client, upstream, None, self.rewrite_request),
                             (upstream, client, self.rate, None)):
                    threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src, dst, rate, rewrite) -> None:
        """Copy ``src`` to ``dst`` until either ends, then shut both down (which ends the pump
        of the other direction too)."""
        try:
            while data := src.recv(self.chunk):
                dst.sendall(data if rewrite is None else rewrite(data))
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        finally:
            shutdown(src, dst)

    def cut(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream in pairs:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            for sock in (client, upstream):
                shutdown(sock)
                sock.close()

    def close(self) -> None:
        self.cut()
