"""Reading an HTTP response's body in large pieces: the socket's low-water mark.

On a link that paces each connection, a response's bytes come in packets of tens of KiB; a
read of 1 MiB then wakes its thread once per packet, and each wake-up takes the GIL back from
the other part threads and the process's main thread. With the socket's ``SO_RCVLOWAT``
raised, the kernel wakes the reader once that many bytes are in: a few wake-ups per read.

A socket with a timeout waits in poll(), which wakes once the mark's bytes are in whatever
the read asked for; so the mark is set before each read to at most what will still be on
its way when that read ends (the body's remaining length, less the read, less what
http.client may hold in its buffer: ``MARGIN``), and a read never waits for bytes that will
not come. A body's last reads go with a mark of 1, so the connection goes back to its pool
as it came; a connection that fails or closes early is not reused.

``readinto`` fills a buffer the caller reuses straight from http.client (urllib3's own
``readinto`` reads into a new ``bytes`` and copies it), when urllib3 would hand the body over
unchanged (no decoding); once the whole body is in, the connection goes back to its pool, as
urllib3 does when its own read reaches the end.

``socket_of`` is the one place that reaches into urllib3's and http.client's objects; when they
change shape it finds nothing and bodies are read as they were (tests/test_body_reads.py
fails loudly then).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from http.client import HTTPResponse

LOW_WATER = 512 << 10
MARGIN = 256 << 10  # more than http.client's buffer holds (8 KiB; larger in newer Pythons)


def socket_of(body) -> tuple[HTTPResponse, socket.socket] | None:
    """(the http.client response, its socket) under a urllib3 response or botocore's
    ``StreamingBody`` (which wraps one); None if they cannot be found."""
    raw = getattr(body, "_raw_stream", body)  # botocore's StreamingBody
    http_response = getattr(raw, "_fp", None)  # urllib3's HTTPResponse holds http.client's
    socket_io = getattr(getattr(http_response, "fp", None), "raw", None)
    sock = getattr(socket_io, "_sock", None)
    if not isinstance(sock, socket.socket) or http_response is None \
            or not hasattr(http_response, "length"):
        return None
    return http_response, sock


class LargeReads:
    """``read(n)``, ``readinto(buffer)`` and ``close()`` of ``body`` (a urllib3 response or a
    ``StreamingBody``), with the socket's low-water mark raised while much of the body is still
    to come. Use one of ``read`` and ``readinto`` for a body, not both."""

    __slots__ = ("_close", "_http", "_mark", "_read", "_sock", "_urllib3")
    _http: HTTPResponse | None
    _sock: socket.socket | None

    def __init__(self, body):
        self._read = body.read
        self._close = body.close
        found = socket_of(body)
        self._http, self._sock = found if found is not None else (None, None)
        self._mark = 1
        urllib3_response = getattr(body, "_raw_stream", body)
        headers = getattr(urllib3_response, "headers", None) or {}
        encoding = str(headers.get("Content-Encoding") or "identity").strip().lower()
        # straight from http.client only where urllib3 would hand the bytes over as they come
        passes_through = encoding == "identity" \
            or getattr(urllib3_response, "decode_content", True) is False
        self._urllib3 = urllib3_response if found is not None and passes_through \
            and hasattr(urllib3_response, "release_conn") else None

    def read(self, amount: int) -> bytes:
        self._mark_for(amount)
        return self._read(amount)

    def readinto(self, buffer: memoryview) -> int:
        """Fill ``buffer`` from the body (less only at its end); 0 at the end."""
        http = self._http
        if self._urllib3 is None or http is None:
            data = self._read(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        self._mark_for(len(buffer))
        count = http.readinto(buffer)
        if http.isclosed() and http.length == 0:  # all of it: the connection can be reused
            self._urllib3.release_conn()
        return count

    def _mark_for(self, amount: int) -> None:
        if self._sock is not None and self._http is not None:
            left = self._http.length
  # None: read to the end, or chunked
            mark = 1 if not left else max(1, min(LOW_WATER, amount, left - amount - MARGIN))
            if mark != self._mark:
                self._set(mark)

    def close(self) -> None:
        if self._sock is not None and self._mark != 1:
            self._set(1)
        self._close()

    def _set(self, mark: int) -> None:
        if self._sock is None:
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
            self._mark = mark
        except OSError:  # the connection is gone: its read fails or ends on its own
            self._sock = None
