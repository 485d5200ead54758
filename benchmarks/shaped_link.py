"""A shaped link on 127.0.0.1: a TCP proxy in front of a local server (the moto S3 server) that
behaves like a cloud connection.

Each connection's responses are capped at ``rate`` bytes/s (a pacing clock per connection,
chunks of at most 64 KiB, one chunk of credit: a token bucket one chunk deep, so that the
proxy's own loop waking late on a busy machine does not lower the rate) and every request
reaches the server ``delay`` seconds after the client sent it, so each response's first byte
comes at least ``delay`` later than on loopback. Connections do not share the cap: as on a
cloud link, more connections carry more, up to what the server behind can serve.

For tests it can also break responses: ``cut={n: nbytes}`` closes the connection of the n-th
request (counted from 1, in the order they reach the proxy) after ``nbytes`` bytes of its
response; the client sees a short body or a reset. ``drop_range=True`` strips ``Range``
headers, as a server that ignores them.

``python -m benchmarks.shaped_link UPSTREAM_PORT RATE_MB_S DELAY_MS`` runs one in the foreground
and prints its port.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time

CHUNK = 64 << 10


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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        return (f"{self.rate / 1e6:g} MB/s per connection, first byte delayed "
                f"{self.delay * 1000:g} ms")

    # lifecycle --------------------------------------------------------------------------

    def start(self) -> ShapedProxy:
        self._thread = threading.Thread(target=self._serve, name="shaped-link", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the shaped proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        if self._thread is not None:
            self._thread.join(5)

    async def _close(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().stop()

    def __enter__(self) -> ShapedProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _serve(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(
            asyncio.start_server(self._connection, self.host, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    # one connection ---------------------------------------------------------------------

    async def _connection(self, client_reader, client_writer) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        requests = asyncio.Queue()  # numbers of the requests whose responses are due
        upward = asyncio.ensure_future(self._requests(client_reader, up_writer, requests))
        try:
            await self._responses(up_reader, client_writer, requests)
        except OSError:  # the client went away (a reader closed early): nothing to relay
            pass
        finally:
            upward.cancel()
            for writer in (client_writer, up_writer):
                writer.close()

    async def _requests(self, reader, writer, requests: asyncio.Queue) -> None:
        """Client to server: each new request is held back ``delay`` seconds."""
        try:
            while data := await reader.read(CHUNK):
                if _starts_request(data):
                    if self.drop_range:
                        data = _RANGE_HEADER.sub(b"", data)
                    self.requests += 1
                    await requests.put(self.requests)
                    if self.delay:
                        await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.write_eof()
            except (OSError, RuntimeError):
                pass

    async def _responses(self, reader, writer, requests: asyncio.Queue) -> None:
        """Server to client, paced at ``rate``; a cut closes the connection mid-response."""
        clock = time.monotonic()
        cut_after = None
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            if _starts_response(data):
                number = requests.get_nowait() if not requests.empty() else None
                cut_after = self.cut.pop(number, None) if number is not None else None
            if cut_after is not None:
                if len(data) >= cut_after:
                    writer.write(data[:cut_after])
                    await writer.drain()
                    writer.transport.abort()
                    return
                cut_after -= len(data)
            now = time.monotonic()
            # a chunk's worth of credit: the loop waking late (a busy machine) is caught up
            # instead of lowering the connection's rate; an idle connection bursts no more
            clock = max(clock, now - CHUNK / self.rate) + len(data) / self.rate
            writer.write(data)
            await writer.drain()
            wait = clock - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)


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
