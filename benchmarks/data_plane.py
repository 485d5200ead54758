"""The link benchmark's data plane: nginx serving the read path of S3 and GCS from a folder,
so that a byte read costs the simulated cloud what it costs a cloud, almost nothing of the
cores the loader runs on.

Each link is a listener of one nginx process (a master and one worker, its own config and
prefix in a temporary folder, listening on 127.0.0.1 only, ``daemon off``):

S3
    Path-style ``GET``/``HEAD /BUCKET/KEY`` of a file ``ROOT/BUCKET/KEY`` is nginx's static
    file: ``Range`` (one range; 416 with ``Content-Range: bytes */SIZE`` past the end),
    ``ETag`` (nginx's, of the file's mtime and size), ``If-Match`` (412), by ``sendfile``.
    The query string (a presigned URL's signature) is ignored. Everything else (listing,
    uploads, other methods, a key with no file) goes to the moto server behind, so one
    ``AWS_ENDPOINT_URL`` serves the whole reader.
GCS
    The JSON API's media download ``GET /download/storage/v1/b/BUCKET/o/NAME?alt=media`` (the
    name one percent-encoded segment) of ``ROOT/BUCKET/NAME``, with ``Range``; the rest
    (metadata, uploads, missing names) goes to the emulator behind. nginx does not send
    ``x-goog-generation`` nor check ``ifGenerationMatch``: the reader, as with the emulator,
    asks the emulator for the object's generation before its first part and after its last.

The folder must hold the bytes the store behind holds under the same names (``mirror``):
nginx serves the folder, the store answers only what the folder lacks.

Shaping, as ``shaped_link.py`` does it without a process in the way: a link's listening
socket is made here with the kernel's pacing rate (``SO_MAX_PACING_RATE``), which each
accepted connection inherits, and handed to nginx as an inherited socket (the ``NGINX``
variable of nginx's binary upgrade); a first-byte delay holds each request with the echo
module's ``echo_sleep`` (a timer) before an internal redirect to the location that serves
it. nginx's own ``limit_rate`` is not used: it sends in bursts between timers, the start of
each response at full speed, where the kernel spaces every packet, as the proxy does, so
that the figures of both planes compare (docs/benchmarks.md).

Set-up (Debian): ``apt-get install nginx libnginx-mod-http-echo`` (the echo module only for
links with a delay). ``missing()`` says what is not there.
"""

from __future__ import annotations

import grp
import http.client
import os
import pwd
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .local_servers import stop

NGINX = "nginx"
ECHO_MODULES = ("/usr/lib/nginx/modules/ngx_http_echo_module.so",
                "/usr/share/nginx/modules/ngx_http_echo_module.so")
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux's number
GCS_MEDIA = r"^/download/storage/v1/b/([^/]+)/o/(.+)$"
START_TIMEOUT = 30.0

__all__ = ["NginxPlane", "describe_link", "missing"]


def nginx_binary() -> str | None:
    return shutil.which(NGINX) or next(
        (path for path in (f"/usr/sbin/{NGINX}",) if os.path.exists(path)), None)


def echo_module() -> str | None:
    return next((path for path in ECHO_MODULES if os.path.exists(path)), None)


def missing(delays: bool = True) -> str | None:
    """Why the nginx data plane cannot run here, or None. ``delays``: links with a first-byte
    delay are wanted (they need the echo module)."""
    if nginx_binary() is None:
        return "no nginx binary (apt-get install nginx libnginx-mod-http-echo)"
    if delays and echo_module() is None:
        return ("nginx's echo module is not installed (apt-get install libnginx-mod-http-echo; "
                f"looked for {' and '.join(ECHO_MODULES)})")
    return None


def describe_link(rate: float, delay: float) -> str:
    """A link's parameters as the tables name them (``ShapedProxy.describe``'s words)."""
    return f"{rate / 1e6:g} MB/s a connection, {delay * 1000:g} ms to first byte"


class NginxPlane:
    """nginx on 127.0.0.1 serving ``root`` as S3 in front of the moto server on ``s3_port``
    and, with ``gcs_port``, as GCS in front of the emulator there. ``links``: (bytes/s per
    connection, first-byte delay in s) of each shaped link; ``endpoint(store, None)`` is the
    unshaped one (loopback). As a context manager it is started and, at the end, stopped."""

    def __init__(self, root: str | Path, s3_port: int, gcs_port: int | None = None,
                 links: Sequence[tuple[float, float]] = ()):
        for rate, delay in links:
            if rate <= 0 or delay < 0:
                raise ValueError(f"link ({rate}, {delay}): the rate must be positive and the "
                                 "delay >= 0")
        self.root = Path(root).resolve()
        self.links = list(links)
        self.upstreams = {"s3": s3_port, "gs": gcs_port}
        self.process: subprocess.Popen | None = None
        self._prefix: str | None = None
        self._listeners: dict[tuple[str, int | None], socket.socket] = {}

    # lifecycle --------------------------------------------------------------------------

    def start(self) -> NginxPlane:
        reason = missing(delays=any(delay for _rate, delay in self.links))
        if reason is not None:
            raise RuntimeError(f"the nginx data plane cannot start: {reason}")
        self._prefix = tempfile.mkdtemp(prefix="wdstream-nginx-")  # removed by stop()
        try:
            self._listen()
            config = Path(self._prefix, "nginx.conf")
            config.write_text(self._config())
            fds = [sock.fileno() for sock in self._listeners.values()]
            self.process = subprocess.Popen(
                [nginx_binary(), "-p", self._prefix, "-c", str(config)], pass_fds=fds,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "NGINX": "".join(f"{fd};" for fd in fds)})
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
        for sock in self._listeners.values():
            sock.close()
        self._listeners.clear()
        if self._prefix is not None:
            shutil.rmtree(self._prefix, ignore_errors=True)

    def __enter__(self) -> NginxPlane:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """nginx's processes (the master and its worker), for their CPU."""
        import psutil

        master = psutil.Process(self.process.pid)
        return [master.pid, *(child.pid for child in master.children())]

    # what clients use -------------------------------------------------------------------

    def endpoint(self, store: str, link: int | None) -> str:
        """The URL of ``store`` ("s3", "gs") on link number ``link`` (None: unshaped)."""
        port = self._listeners[(store, link)].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def describe(self, link: int) -> str:
        return describe_link(*self.links[link])

    def mirror(self, folder: str | Path, bucket: str, prefix: str) -> None:
        """The files of ``folder`` served as ``BUCKET/PREFIX/NAME`` (hard links where the file
        system allows, else copies): what ``LocalS3.upload`` puts in the store behind."""
        target = self.root / bucket / prefix
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                placed = target / path.name
                placed.unlink(missing_ok=True)
                try:
                    os.link(path, placed)
                except OSError:
                    shutil.copyfile(path, placed)

    # the process ------------------------------------------------------------------------

    def _listen(self) -> None:
        """A listening socket per store and link, paced as the link is (inherited by each
        connection it accepts)."""
        shaped: list[tuple[int | None, float | None]] = [(None, None)]
        shaped += [(number, rate) for number, (rate, _delay) in enumerate(self.links)]
        for store, port in self.upstreams.items():
            if port is None:
                continue
            for number, rate in shaped:
                sock = socket.create_server(("127.0.0.1", 0), backlog=512)
                if rate is not None:
                    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE,
                                    struct.pack("=Q", int(rate)))
                self._listeners[(store, number)] = sock

    def _config(self) -> str:
        temp = Path(self._prefix, "temp")
        temp.mkdir()
        delays = [0.0, *(delay for _rate, delay in self.links)]
        unchecked = Path(self._prefix, "unchecked.sock")
        servers = "\n".join(
            _server(store, sock.getsockname()[1], delays[0 if link is None else link + 1],
                    self.root, unchecked)
            for (store, link), sock in self._listeners.items())
        if self.upstreams["s3"] is not None:  # S3 reads nginx does not check (``_server``)
            servers += (f"\n  server {{\n    listen unix:{unchecked};\n"
                        f"    location / {{ root {self.root}; try_files $uri @store; }}\n"
                        "    location @store { proxy_pass http://s3_store$request_uri; }\n  }")
        upstreams = "\n".join(
            f"  upstream {store}_store {{ server 127.0.0.1:{port}; keepalive 32; }}"
            for store, port in self.upstreams.items() if port is not None)
        module = f"load_module {echo_module()};\n" if any(delays) else ""
        return (
            f"{module}{_user()}daemon off;\nmaster_process on;\nworker_processes 1;\n"
            f"pid {self._prefix}/nginx.pid;\nerror_log {self._prefix}/error.log warn;\n"
            "events { worker_connections 4096; }\n"
            "http {\n"
            "  access_log off;\n  server_tokens off;\n"
            "  types {}\n  default_type application/octet-stream;\n"
            "  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 100000;\n"
            "  client_max_body_size 0;\n"
            "  proxy_http_version 1.1;\n  proxy_set_header Connection \"\";\n"
            "  proxy_set_header Host $http_host;\n  proxy_buffering off;\n"
            "  proxy_request_buffering off;\n"
            + "".join(f"  {kind}_temp_path {temp};\n"
                      for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
            + f"{_S3_READS}{upstreams}\n{servers}\n}}\n")

    def _wait_until_serving(self) -> None:
        """Until nginx answers on every listener (they accept into their backlog from the
        start, so an open port says nothing); its error log in the message if it exits."""
        deadline = time.monotonic() + START_TIMEOUT
        for sock in self._listeners.values():
            port = sock.getsockname()[1]
            while True:
                if self.process.poll() is not None:
                    log = Path(self._prefix, "error.log")
                    text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(f"nginx exited with {self.process.returncode}: {text}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"nginx did not answer on 127.0.0.1:{port} after "
                                       f"{START_TIMEOUT:g}s")
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=min(left, 1))
                try:
                    connection.request("HEAD", "/")
                    connection.getresponse()
                    break
                except OSError:
                    time.sleep(0.05)
                finally:
                    connection.close()


def _user() -> str:
    """The ``user`` directive: the worker reads the folder as this process's user (as root,
    nginx would otherwise switch its worker to an unprivileged user)."""
    if os.geteuid() != 0:
        return ""
    return f"user {pwd.getpwuid(0).pw_name} {grp.getgrgid(os.getegid()).gr_name};\n"


# S3 reads of a file whose If-Match holds moto's kind of ETag (an MD5; a multipart upload's
# MD5 of its parts' then "-N") go unchecked
_S3_READS = ("  map $http_if_match $s3_reads {\n"
             "    '~^\"[0-9a-f]{32}(-[0-9]+)?\"$' @unchecked;\n    default @file;\n  }\n")


def _server(store: str, port: int, delay: float, root: Path, unchecked: Path) -> str:
    """One listener's ``server`` block: the files it serves, the rest to the store behind,
    each request held ``delay`` seconds first. An S3 GET whose ``If-Match`` names an ETag of
    the store behind (an MD5, as its listing gives it: ``$s3_reads``) rather than nginx's own
    is served without it by the server on the socket ``unchecked``, and answered with that
    ETag (the files here do not change); nginx checks any other (412 unless it is its own)."""
    upstream = (f"    location @store {{ proxy_pass http://{store}_store$request_uri; }}\n"
                # a path ending in "/" names no object: a file's directory is not listed
                f"    location ~ /$ {{ {_hold(delay, '@store')} }}\n")
    if store == "s3":
        reads = (f"    location / {{ {_hold(delay, '$s3_reads')} }}\n"
                 f"    location @file {{ root {root}; try_files $uri @store; }}\n"
                 "    location @unchecked { proxy_set_header If-Match \"\"; "
                 "proxy_hide_header ETag; add_header ETag $http_if_match always; "
                 f"proxy_pass http://unix:{unchecked}; }}\n")
    else:
        reads = (f"    location ~ {GCS_MEDIA} {{ {_hold(delay, '@file')} }}\n"
                 f"    location @file {{ rewrite {GCS_MEDIA} /$1/$2 break; root {root}; "
                 "try_files $uri @store; }\n"
                 f"    location / {{ {_hold(delay, '@store')} }}\n")
    return f"  server {{\n    listen 127.0.0.1:{port};\n{reads}{upstream}  }}"


def _hold(delay: float, target: str) -> str:
    """Directives that hand a request to the named location ``target``, ``delay`` s later
    (to the millisecond, echo_sleep's precision)."""
    if round(delay, 3):
        return f"echo_sleep {delay:.3f}; echo_exec {target};"
    return f"error_page 418 = {target}; return 418;"
