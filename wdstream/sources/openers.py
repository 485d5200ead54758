"""Read streams: ``open_read(url)`` gives a ``ByteStream`` over a ``pipe:`` command, a cloud
CLI, fsspec or the S3 SDK, and a ``LocalFile`` for a local path.

How a stream works
    A ByteStream's background thread reads the source in chunks of up to 1 MiB into a buffer
    holding up to 8 MiB, so opening the next shard while the current one is parsed prefetches
    it for free. ``read()`` waits at most ``timeout`` seconds for the next chunk; a longer stall
    raises ``StreamError(transient=True)`` and stops the source. ``open_read`` itself does no
    data I/O: a missing object or a refused connection is raised by the first ``read()``.
    A local file needs no thread (the page cache reads ahead): it is read in the caller's
    thread, is seekable (the tar reader reads a large payload whole, in one copy), and a
    missing file is raised by ``open_read``.

How a stream ends
    ``read()`` returns ``b""`` at the end. ``close()`` then checks how a command (``pipe:`` or a
    CLI) ended: a non-zero exit status raises ``StreamError`` with the tail of its stderr, also
    when the failure came after all the data was written (a truncated shard that happens to end
    on a sample boundary is only visible this way). A consumer that stops within
    ``DRAIN_BYTES`` of the end (a tar reader at the end-of-archive marker, before the padding)
    gets the same check: ``close()`` drops the rest and waits up to ``DRAIN_SECONDS`` for the
    command to end by itself. Closing earlier than that stops the command (its whole process
    group, so ``pipe:a | b`` leaves nothing behind) and raises nothing: an early close is not
    an error.

Which opener reads what (``opener="auto"``, or the ``WDSTREAM_OPENER`` environment variable)
    - local paths and ``file://``: plain ``open`` (whatever the opener).
    - ``pipe:CMD``: ``/bin/bash -o pipefail -c CMD`` (whatever the opener): the user's own shell
      command; pipefail so that ``aws ... | zcat`` fails when ``aws`` fails.
    - ``s3://``: "sdk", a streaming ``get_object`` with botocore: several times faster than
      s3fs or ``aws s3 cp URL -``, and without a process start-up per shard (figures:
      docs/benchmarks.md). One client per process; it honours ``AWS_ENDPOINT_URL``,
      ``AWS_PROFILE`` and the usual credential chain.
      An object is read as concurrent ranged GETs handed over in order (``ranged.py``).
    - ``gs://``: "fsspec" (gcsfs, in-process; there is no lighter GCS SDK to depend on, and
      ``gcloud storage cat`` costs a process start-up per shard).
    - other fsspec URLs (``memory://``, ``https://``, ...): "fsspec".
    - "cli": ``aws s3 cp --only-show-errors URL -`` for s3, ``gcloud storage cat URL`` (or
      ``gsutil cat URL`` without gcloud) for gs. Commands are argument lists, never shell
      strings: a key with spaces, ``;`` or ``$(...)`` is just a key.

Errors name the URL; ``transient`` is False for a missing object, a permission problem or
missing credentials, True for resets, timeouts, 5xx, stalls and failed commands.
"""

from __future__ import annotations

import abc
import collections
import io
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from wdstream.errors import AccessError, InputError, StreamError, WdstreamError
from wdstream.sources import urls

log = logging.getLogger(__name__)

OPENERS = ("auto", "cli", "fsspec", "sdk")

CHUNK_SIZE = 1 << 20  # largest piece the reader thread hands over
READ_AHEAD = 8 << 20  # bytes the reader thread may get ahead of the consumer; 32 MiB read no
# faster here (local or moto, 1 MiB samples) and cost ~100 MB more across two workers, each with
# the next shard open too
STDERR_TAIL = 8 << 10  # bytes of a command's stderr kept for error messages
DRAIN_BYTES = 64 << 10  # unread bytes a close may drop to reach a command's end (tar padding
DRAIN_SECONDS = 2.0  # is at most 10 KiB) and how long it waits for that end

_DEFAULT_OPENERS = {"s3": "sdk", "gs": "fsspec"}  # anything else remote: "fsspec"


# --------------------------------------------------------------------------- choosing a reader


def resolve_opener(opener: str | None, url: str) -> str:
    """The reader ``open_read`` uses for ``url``: "file", "pipe", "cli", "fsspec" or "sdk".

    ``None`` or "auto" means ``$WDSTREAM_OPENER`` if set (read now, not at import), else the
    default for the URL's scheme (see the module docstring).
    """
    if opener in (None, "auto"):
        opener = os.environ.get("WDSTREAM_OPENER") or "auto"
        if opener not in OPENERS:
            raise InputError(f"WDSTREAM_OPENER={opener!r}: expected one of {', '.join(OPENERS)}")
    elif opener not in OPENERS:
        raise InputError(f"opener {opener!r}: expected one of {', '.join(OPENERS)}")
    kind = urls.scheme(url)
    if kind in ("file", "pipe"):
        return kind
    if opener == "auto":
        return _DEFAULT_OPENERS.get(kind, "fsspec")
    if opener == "cli" and kind not in CLI_READ_COMMANDS:
        raise InputError(f"{url}: no command-line reader for {kind}:// (cli reads s3:// and gs://)")
    if opener == "sdk" and kind != "s3":
        raise InputError(f"{url}: the sdk opener reads s3:// only; use fsspec for {kind}://")
    return opener


def _timeout_arg(timeout: float) -> str:
    return str(max(1, math.ceil(timeout)))  # the CLIs take whole seconds; 0 would mean "never"


def cli_url(url: str) -> str:
    """The URL spelled as the CLIs want it: ``s3a://`` -> ``s3://``, ``gcs://`` -> ``gs://``."""
    bucket, key = urls.bucket_key(url)
    return f"{urls.scheme(url)}://{bucket}/{key}"


def _aws_read_command(url: str, timeout: float) -> list[str]:
    seconds = _timeout_arg(timeout)
    return ["aws", "s3", "cp", "--only-show-errors", "--cli-connect-timeout", seconds,
            "--cli-read-timeout", seconds, cli_url(url), "-"]


def _gcs_read_command(url: str, timeout: float) -> list[str]:
    # gcloud has no per-request timeout flag; the stream's own stall timeout stops it.
    if shutil.which("gcloud") or not shutil.which("gsutil"):
        return ["gcloud", "storage", "cat", cli_url(url)]
    return ["gsutil", "cat", cli_url(url)]


# scheme -> function(url, timeout) building the argument list that writes the object to stdout
CLI_READ_COMMANDS: dict[str, Callable[[str, float], list[str]]] = {
    "s3": _aws_read_command,
    "gs": _gcs_read_command,
}


def open_read(
    url: str, *, opener: str | None = None, timeout: float = 60.0, start: int = 0
) -> ByteStream | LocalFile:
    """Open ``url`` for streaming, from byte ``start`` on. See the module docstring.

    ``timeout`` is the longest wait for data (and the connect/read timeout of the SDK client).
    For pipes and CLIs ``start`` bytes are read and dropped; other readers seek or ask for a range.
    """
    if timeout <= 0:
        raise InputError(f"{url}: timeout must be positive, got {timeout}")
    if start < 0:
        raise InputError(f"{url}: start must be >= 0, got {start}")
    reader = resolve_opener(opener, url)
    if reader == "file":
        path = urls.to_local_path(url)
        try:
            file = open(path, "rb", buffering=0)  # the stream closes it
        except OSError as exc:
            raise stream_error(url, exc) from None
        try:
            file.seek(start)
        except OSError as exc:
            file.close()
            raise stream_error(url, exc) from None
        return LocalFile(url, file)  # positions count from ``start``
    source: ChunkSource
    if reader == "pipe":
        argv = ["/bin/bash", "-o", "pipefail", "-c", url[len("pipe:"):]]
        source = _ProcessSource(url, argv, start)
    elif reader == "cli":
        source = _ProcessSource(url, CLI_READ_COMMANDS[urls.scheme(url)](url, timeout), start)
    elif reader == "sdk":
        from wdstream.sources.ranged import RangedS3Source  # it imports this module

        source = RangedS3Source(url, start, timeout)
    else:
        source = _FsspecSource(url, start, timeout)
    return ByteStream(url, source, timeout)


# --------------------------------------------------------------------------- the stream


class _ChunkBuffer:
    """Chunks handed from the reader thread to the consumer, bounded by total bytes."""

    def __init__(self, limit: int):
        self._limit = limit
        self._chunks: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self.ended = False  # the producer finished: end of data, or an error
        self.error: BaseException | None = None  # how it finished, if it failed
        self.closed = False  # the consumer is gone

    def put(self, chunk: bytes) -> bool:
        """Wait for room and append; False once the consumer has closed."""
        with self._cond:
            while self._bytes >= self._limit and not self.closed:
                self._cond.wait()
            if self.closed:
                return False
            self._chunks.append(chunk)
            self._bytes += len(chunk)
            self._cond.notify_all()
            return True

    def end(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.ended, self.error = True, error
            self._cond.notify_all()

    def get(self, timeout: float) -> bytes | None:
        """The next chunk; None at the end. Raises the producer's error, or TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._chunks and not self.ended:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self._cond.wait(remaining)
            if self._chunks:
                chunk = self._chunks.popleft()
                self._bytes -= len(chunk)
                self._cond.notify_all()
                return chunk
            if self.error is not None:
                raise self.error
            return None

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._chunks.clear()
            self._bytes = 0
            self._cond.notify_all()


class ByteStream(io.BufferedIOBase):
    """A read-only binary stream of one URL, filled by a background thread.

    ``read(n)`` returns exactly ``n`` bytes unless the data ends first (``read1(n)`` returns what
    is at hand); ``url`` is the URL, ``bytes_read`` the bytes handed out so far.
    """

    def __init__(self, url: str, source: ChunkSource, timeout: float):
        super().__init__()
        self.url = url
        self.bytes_read = 0
        self._source = source
        self._timeout = timeout
        self._buffer = _ChunkBuffer(READ_AHEAD)
        self._chunk = b""  # the chunk being handed out, from self._offset on
        self._offset = 0
        self._at_end = False
        self._failed: WdstreamError | None = None  # an error already raised to the consumer
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._produce, name=f"wdstream-read {url[:80]}", daemon=True
        )
        self._thread.start()

    def _produce(self) -> None:
        try:
            self._source.run(self._buffer.put)
        except BaseException as exc:  # handed to the consumer as a StreamError
            if not self._buffer.closed:
                self._buffer.end(stream_error(self.url, exc))
        else:
            self._buffer.end()

    # reading --------------------------------------------------------------------------------

    def _next_chunk(self) -> bool:
        """Make ``self._chunk`` non-empty; False at the end of the data."""
        if self._failed is not None:
            raise self._failed
        while self._offset >= len(self._chunk):
            if self._at_end:
                return False
            try:
                chunk = self._buffer.get(self._timeout)
            except TimeoutError:
                raise self._fail(StreamError(
                    self.url, f"no data for {self._timeout:g} s", transient=True)) from None
            except WdstreamError as exc:
                raise self._fail(exc) from None
            if chunk is None:
                self._at_end = True
                return False
            self._chunk, self._offset = chunk, 0
        return True

    def _fail(self, error: WdstreamError) -> WdstreamError:
        """Remember the error raised to the consumer and stop the source."""
        self._failed = error
        self._source.stop()
        return error

    def _take(self, n: int) -> bytes:
        """Up to ``n`` bytes of the current chunk (which must be non-empty)."""
        if self._offset == 0 and n >= len(self._chunk):
            piece = self._chunk
        else:
            piece = self._chunk[self._offset : self._offset + n]
        self._offset += len(piece)
        self.bytes_read += len(piece)
        return piece

    def read(self, n: int | None = -1) -> bytes:
        self._check_open()
        if n is None or n < 0:
            n = sys.maxsize
        parts = []
        while n > 0 and self._next_chunk():
            piece = self._take(n)
            parts.append(piece)
            n -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read1(self, n: int | None = -1) -> bytes:
        self._check_open()
        if n == 0 or not self._next_chunk():
            return b""
        return self._take(sys.maxsize if n is None or n < 0 else n)

    def readinto(self, buffer) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and self._next_chunk():
            piece = self._take(len(view) - filled)
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        return filled

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        """The position in the object (``start`` plus the bytes read)."""
        return self._source.start + self.bytes_read

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed stream")

    # closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the source, or check how it ended (see the module docstring)."""
        if self.closed:
            return
        try:
            if self._source.has_exit_status and self._failed is None and self._ends_soon():
                self._source.check_end(self._timeout)  # may raise StreamError
        finally:
            self._shutdown()

    def _ends_soon(self) -> bool:
        """Whether the data ends by itself within DRAIN_BYTES of what the consumer read, and
        within DRAIN_SECONDS; the bytes in between are dropped."""
        if self.bytes_read == 0 and not self._at_end:
            return False  # nothing read: the consumer did not want this stream
        unread = len(self._chunk) - self._offset
        deadline = time.monotonic() + min(DRAIN_SECONDS, self._timeout)
        while unread <= DRAIN_BYTES:
            try:
                chunk = self._buffer.get(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, WdstreamError):
                return False
            if chunk is None:
                return True
            unread += len(chunk)
        return False

    def _shutdown(self) -> None:
        if not self._buffer.ended:
            self._source.stop()
        self._buffer.close()  # wakes the reader thread if it waits for room
        self._source.release()
        if self._source.stops_promptly:
            self._thread.join(5.0)
        self._chunk = b""
        super().close()

    def __del__(self):
        # Garbage collection cleans up but never raises (io.IOBase.__del__ would call close()).
        # A forked copy owns neither the thread nor the process: it must not kill anything.
        if not self.closed and os.getpid() == self._pid:
            self._shutdown()

    def __repr__(self) -> str:
        return f"<ByteStream {self.url!r} bytes_read={self.bytes_read}>"


class LocalFile(io.BufferedIOBase):
    """A local file read in the caller's thread, with the attributes of a ``ByteStream``.

    No reader thread: the page cache already reads ahead. It is seekable, so the tar reader
    takes a large payload with one exact read (one copy) instead of joining chunks."""

    def __init__(self, url: str, file):
        super().__init__()
        self.url, self.bytes_read = url, 0
        self._file = file
        self._start = file.tell()

    def _call(self, method, *args):
        try:
            return method(*args)
        except OSError as exc:
            raise stream_error(self.url, exc) from None

    def read(self, n: int | None = -1) -> bytes:
        data = self._call(self._file.read, n)
        self.bytes_read += len(data)
        return data

    read1 = read  # a raw file's read returns what the file holds, without joining

    def readinto(self, buffer) -> int:
        count = self._call(self._file.readinto, buffer)
        self.bytes_read += count
        return count

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._file.seekable()

    def region(self, position: int) -> tuple[str, int, int, int, int] | None:
        """Where stream position ``position`` lies on disk, for a reader that maps the file
        rather than reading it: ``(path, file offset, file size, st_dev, st_ino)``; None when
        the file has no path."""
        name = getattr(self._file, "name", None)
        if not isinstance(name, str):
            return None
        status = self._call(os.fstat, self._file.fileno())
        return (os.path.abspath(name), self._start + position, status.st_size,
                status.st_dev, status.st_ino)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Positions count from where the stream started (``start`` of ``open_read``)."""
        if whence == io.SEEK_SET:
            offset += self._start
        position = self._call(self._file.seek, offset, whence) - self._start
        self.bytes_read = position
        return position

    def tell(self) -> int:
        return self.bytes_read

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()

    def __repr__(self) -> str:
        return f"<LocalFile {self.url!r} bytes_read={self.bytes_read}>"


# --------------------------------------------------------------------------- sources


class ChunkSource(abc.ABC):
    """What a ByteStream reads: ``run`` produces chunks in the reader thread."""

    start = 0
    # True when, once stopped, run() returns at once (a killed process, a local file): close()
    # then waits for the reader thread. A network read instead ends by itself within the
    # client's read timeout, and close() does not wait for it.
    stops_promptly = False
    has_exit_status = False  # True: check_end() has something to check

    @abc.abstractmethod
    def run(self, put: Callable[[bytes], bool]) -> None:
        """Pass chunks to ``put`` until the end; return early when ``put`` returns False."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Make ``run`` return soon (called from the consumer's thread)."""

    def check_end(self, timeout: float) -> None:  # noqa: B027 - optional hook
        """After ``run`` returned by itself: raise StreamError if the source failed."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """Free what the source holds (processes, threads); called once, last."""


class _S3Source(ChunkSource):
    """A streaming ``get_object``; reads are bounded by the client's read timeout."""

    def __init__(self, url: str, start: int, timeout: float):
        self.url, self.start, self.timeout = url, start, timeout
        self.bucket, self.key = urls.bucket_key(url)

    def run(self, put):
        from botocore.exceptions import ClientError

        request = {"Bucket": self.bucket, "Key": self.key}
        if self.start:
            request["Range"] = f"bytes={self.start}-"
        try:
            response = s3_client(self.timeout).get_object(**request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            if error.get("Code") == "InvalidRange" and error.get("ActualObjectSize") == str(self.start):
                return  # starting exactly at the end: no data
            raise
        body = response["Body"]
        try:
            # botocore checks the length at the end: a short body raises IncompleteReadError.
            while chunk := body.read(CHUNK_SIZE):
                if not put(chunk):
                    return
        finally:
            body.close()


class _FsspecSource(ChunkSource):
    def __init__(self, url: str, start: int, timeout: float):
        self.url, self.start, self.timeout = url, start, timeout

    def run(self, put):
        fs, path = filesystem(self.url, self.timeout)
        with fs.open(path, "rb") as file:
            if self.start:
                file.seek(self.start)
            while chunk := file.read(CHUNK_SIZE):
                if not put(chunk):
                    return


class _ProcessSource(ChunkSource):
    """A command's stdout. Started at open so that a missing executable fails right away."""

    stops_promptly = True
    has_exit_status = True

    def __init__(self, url: str, argv: list[str], start: int):
        self.url, self.start = url, start
        self.process = ChildProcess(url, argv, stdout=subprocess.PIPE)
        self._stopped = False

    def run(self, put):
        stdout = self.process.popen.stdout
        skip = self.start
        while chunk := stdout.read(CHUNK_SIZE):  # unbuffered: returns what the pipe holds
            if skip:
                dropped = min(skip, len(chunk))
                chunk, skip = chunk[dropped:], skip - dropped
                if not chunk:
                    continue
            if not put(chunk):
                return

    def stop(self):
        self._stopped = True
        self.process.kill()

    def check_end(self, timeout):
        if self._stopped:
            return
        status = self.process.wait(timeout)
        if status is None:
            self.stop()
            raise StreamError(self.url, f"command still running {timeout:g} s after its output "
                              "ended", stderr=self.process.stderr_tail(), transient=True)
        if status != 0:
            raise command_failed(self.url, f"command exited with status {status}",
                                 self.process.stderr_tail())

    def release(self):
        self.process.release()


_MISSING_MARKERS = ("404", "not found", "does not exist", "nosuchkey", "nosuchbucket",
                    "matched no objects", "no urls matched", "no such file")
_DENIED_MARKERS = ("403", "accessdenied", "access denied", "forbidden",
                   "unable to locate credentials")


def command_failed(url: str, message: str, stderr: str) -> StreamError:
    """The error for a command that exited non-zero: permanent when its stderr says why
    (not found, access denied...), else transient."""
    what = permanent_failure(stderr)
    kind = AccessError if what in _ACCESS_PROBLEMS else StreamError
    return kind(url, f"{what} ({message})" if what else message, stderr=stderr,
                transient=what is None)


def permanent_failure(stderr: str) -> str | None:
    """"not found" or "access denied" when a command's stderr says so (a retry will not help),
    else None. Shared with the CLI upload in ``writers``."""
    text = stderr.lower()
    if any(marker in text for marker in _MISSING_MARKERS):
        return "not found"
    if any(marker in text for marker in _DENIED_MARKERS):
        return "access denied"
    return None


# --------------------------------------------------------------------------- child processes


class ChildProcess:
    """A command in its own process group, with the last ``STDERR_TAIL`` bytes of its stderr.

    Own process group, so that ``kill`` also stops what the command started: killing only the
    ``bash`` of ``pipe:yes | head`` would leave ``yes`` holding the pipe open. Shared with the
    CLI upload in ``writers``.
    """

    def __init__(self, url: str, argv: list[str], *, stdin=None, stdout=None):
        try:
            self.popen = subprocess.Popen(
                argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                bufsize=0, start_new_session=True,
            )
        except OSError as exc:
            raise StreamError(url, f"cannot run {argv[0]}: {exc}") from exc
        self._tail = bytearray()
        self._stderr_thread = threading.Thread(
            target=self._collect_stderr, name=f"wdstream-stderr {argv[0]}", daemon=True
        )
        self._stderr_thread.start()

    def _collect_stderr(self) -> None:
        stderr = self.popen.stderr
        while chunk := stderr.read(4096):
            self._tail += chunk
            del self._tail[:-STDERR_TAIL]

    def stderr_tail(self) -> str:
        self._stderr_thread.join(2.0)  # the process has ended: its stderr is closing
        return self._tail.decode("utf-8", "replace")

    def wait(self, timeout: float | None) -> int | None:
        """The exit status (negative: killed by that signal), or None if still running."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the process group (nothing to clean up in a download; an upload must not
        complete). Only while the leader is not reaped: until then its pid, which names the
        group, cannot be reused."""
        if self.popen.returncode is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the whole group has already exited

    def release(self) -> None:
        """Kill what is left of the group, reap the process, close the pipes."""
        self.kill()
        self.popen.wait()
        for pipe in (self.popen.stdin, self.popen.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # e.g. a broken pipe flushing stdin
        self._stderr_thread.join(2.0)
        self.popen.stderr.close()


# --------------------------------------------------------------------------- clients


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()

# Settings that change which client we need: a new one is made when one of them changes.
_CLIENT_SETTINGS = {
    "s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_DEFAULT_REGION",
           "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"),
    "gs": ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
           "CLOUDSDK_CONFIG"),
}


def _cached_client(kind: str, scheme: str, timeout: float, make: Callable[[], object]):
    """One client per process (clients do not survive a fork), kind, timeout and environment."""
    key = (os.getpid(), kind, timeout, tuple(os.environ.get(n) for n in _CLIENT_SETTINGS[scheme]))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = make()
    return client


def s3_client(timeout: float):
    """The process's botocore S3 client with connect and read timeouts of ``timeout``.

    botocore resolves the endpoint (``AWS_ENDPOINT_URL``), region and credentials the usual way.
    """

    def make():
        import botocore.config

        config = botocore.config.Config(
            connect_timeout=timeout, read_timeout=timeout, max_pool_connections=32
        )
        return _botocore_session().create_client("s3", config=config)

    return _cached_client("botocore", "s3", timeout, make)


_sessions: dict[tuple, object] = {}


def _botocore_session():
    """A botocore session per environment (called with ``_clients_lock`` held).

    Unlike clients, sessions are kept across a fork: a session holds no connection, only the
    loaded service models and the resolved configuration, so a DataLoader worker makes its
    client from the session the main process already loaded (the manifest read) in ~20 ms
    instead of ~100-250 ms of parsing the S3 model again."""
    import botocore.session

    key = tuple(os.environ.get(n) for n in _CLIENT_SETTINGS["s3"])
    session = _sessions.get(key)
    if session is None:
        session = _sessions[key] = botocore.session.Session()
    return session


def filesystem(url: str, timeout: float = 60.0):
    """``(fs, path)`` for an fsspec URL.

    Listing caches are off: a shard written meanwhile, by us or by another process, must show
    up. s3fs and gcsfs instances are cached here rather than by fsspec so that a changed
    endpoint or identity in the environment gets a new one; s3fs gets botocore timeouts of
    ``timeout``.
    """
    import fsspec

    kind = urls.scheme(url)
    if kind in ("file", "pipe"):
        raise InputError(f"{url}: not an fsspec URL")
    try:
        if kind == "s3":
            fs = _cached_client("s3fs", "s3", timeout, lambda: fsspec.filesystem(
                "s3", skip_instance_cache=True, use_listings_cache=False,
                config_kwargs={"connect_timeout": timeout, "read_timeout": timeout}))
        elif kind == "gs":
            fs = _cached_client("gcsfs", "gs", timeout, lambda: fsspec.filesystem(
                "gs", skip_instance_cache=True, use_listings_cache=False))
        else:
            return fsspec.core.url_to_fs(url, use_listings_cache=False)
    except ImportError as exc:
        raise StreamError(url, f"cannot open {kind}:// URLs: {exc}") from exc
    return fs, fs._strip_protocol(url)


# --------------------------------------------------------------------------- errors


def stream_error(url: str, exc: BaseException) -> WdstreamError:
    """``exc`` as a StreamError naming ``url``, with ``transient`` set from its kind.

    wdstream's own errors are returned unchanged. Used by the readers and by ``writers``.
    """
    if isinstance(exc, WdstreamError):
        return exc
    transient, what = _classify(exc)
    detail = str(exc) or type(exc).__name__
    kind = AccessError if what in _ACCESS_PROBLEMS else StreamError
    error = kind(url, f"{what} ({detail})" if what else detail, transient=transient)
    error.__cause__ = exc
    return error


_ACCESS_PROBLEMS = ("access denied", "no usable AWS credentials")
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException",
                    "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed"}


def _classify(exc: BaseException) -> tuple[bool, str]:
    """(transient, what happened) for an exception from the OS, botocore, s3fs or gcsfs."""
    botocore_errors = sys.modules.get("botocore.exceptions")
    if botocore_errors is not None:
        if isinstance(exc, botocore_errors.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
                return False, "not found"
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch") \
                    or status in (401, 403):
                return False, "access denied"
            if code in _TRANSIENT_CODES or status >= 500 or status == 429:
                return True, "server error"
            return False, "request failed"
        if isinstance(exc, botocore_errors.NoCredentialsError | botocore_errors.PartialCredentialsError):
            return False, "no usable AWS credentials"
        if isinstance(exc, botocore_errors.HTTPClientError | botocore_errors.ConnectionError
                      | botocore_errors.IncompleteReadError):
            return True, "connection failed"
    status = getattr(exc, "code", None)  # gcsfs.retry.HttpError, aiohttp response errors
    if isinstance(status, int) and not isinstance(exc, OSError):
        if status == 404:
            return False, "not found"
        if status in (401, 403):
            return False, "access denied"
        return status >= 500 or status == 429, f"HTTP status {status}"
    if isinstance(exc, FileNotFoundError):
        return False, "not found"
    if isinstance(exc, PermissionError):
        return False, "access denied"
    if isinstance(exc, IsADirectoryError | NotADirectoryError):
        return False, "not a file"
    if isinstance(exc, OSError):  # resets, timeouts, refused connections, s3fs's other errors
        return True, "I/O error"
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return True, "connection failed"
    return False, type(exc).__name__
