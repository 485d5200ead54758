"""Commands as sources: a ``pipe:`` command or a cloud CLI writing the object to stdout, run in
its own process group (``ChildProcess``, shared with the CLI uploads in ``objects``).

Commands are argument lists, never shell strings (a key with spaces, ``;`` or ``$(...)`` is
just a key), except ``pipe:CMD``, the user's own command, run as
``/bin/bash -o pipefail -c CMD`` so that ``aws ... | zcat`` fails when ``aws`` fails.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import threading
from typing import IO, cast

from wdstream.errors import StreamError
from wdstream.sources import urls
from wdstream.sources.bodies import CHUNK_SIZE, BodySource
from wdstream.sources.failures import command_failed

STDERR_TAIL = 8 << 10  # bytes of a command's stderr kept for error messages


def _timeout_arg(timeout: float) -> str:
    return str(max(1, math.ceil(timeout)))  # the CLIs take whole seconds; 0 would mean "never"


def cli_url(url: str) -> str:
    """The URL spelled as the CLIs want it: ``s3a://`` -> ``s3://``, ``gcs://`` -> ``gs://``."""
    bucket, key = urls.bucket_key(url)
    return f"{urls.scheme(url)}://{bucket}/{key}"


def aws_read_command(url: str, timeout: float) -> list[str]:
    """The command the cli opener reads an S3 object with: it writes the object to stdout."""
    seconds = _timeout_arg(timeout)
    return ["aws", "s3", "cp", "--only-show-errors", "--cli-connect-timeout", seconds,
            "--cli-read-timeout", seconds, cli_url(url), "-"]


def gcs_read_command(url: str, timeout: float) -> list[str]:
    """The command the cli opener reads a GCS object with: it writes the object to stdout."""
    # gcloud has no per-request timeout flag; the body's own stall timeout stops it.
    if shutil.which("gcloud") or not shutil.which("gsutil"):
        return ["gcloud", "storage", "cat", cli_url(url)]
    return ["gsutil", "cat", cli_url(url)]


class ProcessSource(BodySource):
    """A command's stdout. Started at open so that a missing executable fails right away."""

    stops_promptly = True
    has_exit_status = True

    def __init__(self, url: str, argv: list[str], start: int):
        self.url, self.start = url, start
        self.process = ChildProcess(url, argv, stdout=subprocess.PIPE)
        self._stopped = False

    def run(self, put):
        stdout = cast(IO[bytes], self.process.popen.stdout)  # stdout=PIPE: never None
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



class ChildProcess:
    """A command in its own process group, with the last ``STDERR_TAIL`` bytes of its stderr.

    Own process group, so that ``kill`` also stops what the command started: killing only the
    ``bash`` of ``pipe:yes | head`` would leave ``yes`` holding the pipe open. Shared with the
    CLI upload in ``objects``.
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
        stderr = cast(IO[bytes], self.popen.stderr)  # stderr=PIPE: never None
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
        cast(IO[bytes], self.popen.stderr).close()  # stderr=PIPE: never None

