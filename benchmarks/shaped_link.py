"""A shaped link on 127.0.0.1: a TCP proxy in front of a local server (the moto S3 server) that
behaves like a cloud connection.

Each connection's responses are capped at ``rate`` bytes/s by the kernel's TCP pacing
(``SO_MAX_PACING_RATE`` on the socket towards the client) and every request reaches the server
``delay`` seconds after the client sent it, so each response's first byte comes at least
``delay`` later than on loopback. Connections do not share the cap: as on a cloud link, more
connections carry more, up to what the server behind can serve. Responses are moved with
``splice`` (socket to pipe to socket, never through Python): on a cloud link the network costs
the training machine's cores nothing, and the proxy, which shares them here, should cost them
as little.

For tests it can also break responses: ``cut={n: nbytes}`` closes the connection of the n-th
request (counted from 1, in the order they reach the proxy) after ``nbytes`` bytes of its
response; the client sees a short body or a reset. ``drop_range=True`` strips ``Range``
headers, as a server that ignores them. With ``cut``, responses go through Python, to be
counted.

``python -m benchmarks.shaped_link UPSTREAM_PORT RATE_MB_S DELAY_MS`` runs one in the foreground
and prints its port.
"""

from __future__ import annotations

import collections
import fcntl
import os
import re
import socket
import struct
import sys
import threading
import time

from .data_plane import describe_link

CHUNK = 64 << 10
PIPE_SIZE = 1 << 20
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux's number
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class ShapedProxy:
    def __init__(self, upstream_port: int, rate: float, delay: float, *,
                 cut: dict[int, int] | None = None, drop_range: bool = False,
                 host: str = "127.0.0.1"):
        if rate <= 0 or delay < 0:
            raise ValueError("rate must be positive and delay >= 0")
        self.upstream = (host, upstream_port)
        self.rate, self.delay, self.host = rate, delay, host
        self.cut = dict(cut or {})
        self.drop_range = drop_range  # strip Range headers: a server that ignores them
        self.port: int | None = None
        self.requests = 0  # GET/HEAD/PUT... requests seen
        self.connections = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()
        self._stopped = False

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        return describe_link(self.rate, self.delay)

    # lifecycle --------------------------------------------------------------------------

    def start(self) -> ShapedProxy:
        self._listener = socket.create_server((self.host, 0), backlog=128)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="shaped-link", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            sockets = list(self._open)
        if self._listener is not None:
            _shut(self._listener)  # wakes accept()
            self._listener.close()
        for sock in sockets:
            _shut(sock)  # wakes the threads blocked on it
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ShapedProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._stopped:
                    client.close()
                    return
                self.connections += 1
                self._open.add(client)
            threading.Thread(target=self._connection, args=(client,), daemon=True,
                             name="shaped-link connection").start()

    # one connection ---------------------------------------------------------------------

    def _connection(self, client: socket.socket) -> None:
        upstream = None
        try:
            client.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE,
                              struct.pack("=Q", int(self.rate)))
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                return
            with self._lock:
                self._open.add(upstream)
            due: collections.deque[int] = collections.deque()  # requests awaiting a response
            threading.Thread(target=self._requests, args=(client, upstream, due), daemon=True,
                             name="shaped-link requests").start()
            try:
                if self.cut:
                    self._copy_responses(upstream, client, due)
                else:
                    self._splice_responses(upstream, client)
            except OSError:  # the client went away (a reader closed early): nothing to relay
                pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    _shut(sock)
                    sock.close()

    def _requests(self, client: socket.socket, upstream: socket.socket,
                  due: collections.deque) -> None:
        """Client to server: each new request is held back ``delay`` seconds."""
        try:
            while data := client.recv(CHUNK):
                if _starts_request(data):
                    if self.drop_range:
                        data = _RANGE_HEADER.sub(b"", data)
                    with self._lock:
                        self.requests += 1
                        due.append(self.requests)
                    if self.delay:
                        time.sleep(self.delay)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    @staticmethod
    def _splice_responses(upstream: socket.socket, client: socket.socket) -> None:
        """Server to client through a pipe, in the kernel; the client's socket paces them."""
        read_end, write_end = os.pipe()
        try:
            try:
                fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:
                pass  # the default pipe size moves less per call, as correctly
            source, target = upstream.fileno(), client.fileno()
            while moved := os.splice(source, write_end, PIPE_SIZE):
                while moved:
                    moved -= os.splice(read_end, target, moved)
        finally:
            os.close(read_end)
            os.close(write_end)

    def _copy_responses(self, upstream: socket.socket, client: socket.socket,
                        due: collections.deque) -> None:
        """Server to client through Python: a cut closes the connection mid-response."""
        cut_after = None
        while data := upstream.recv(CHUNK):
            if _starts_response(data):
                number = due.popleft() if due else None
                with self._lock:
                    cut_after = self.cut.pop(number, None) if number is not None else None
            if cut_after is not None:
                if len(data) >= cut_after:
                    client.sendall(data[:cut_after])
                    return
                cut_after -= len(data)
            client.sendall(data)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_RANGE_HEADER = re.compile(rb"\r\n[Rr]ange: [^\r]*(?=\r\n)")
_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


def _starts_request(data: bytes) -> bool:
    return data.startswith(_METHODS)


def _starts_response(data: bytes) -> bool:
    return data.startswith(b"HTTP/1.")


def main(argv: list[str]) -> int:
    upstream, rate, delay = int(argv[0]), float(argv[1]) * 1e6, float(argv[2]) / 1000
    proxy = ShapedProxy(upstream, rate, delay).start()
    print(proxy.port, proxy.describe(), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
