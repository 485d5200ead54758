"""Local paths and ``file://`` URLs: ``os`` calls, writes to a temporary name renamed over the
file (``writers.LocalWriter``). ``local`` is set: a reader of data checks what a path is
(``local_files``) before reading it."""

from __future__ import annotations

import os
import stat

from wdstream.sources import urls
from wdstream.sources.failures import stream_error
from wdstream.sources.stores.store import Store, listing
from wdstream.sources.writers import LocalWriter


class LocalStore(Store):
    local = True
    remote = False
    fixed_reader = "file"

    def describe(self, url):
        info = os.stat(urls.local_path(url))
        return {"size": info.st_size, "mtime_ns": info.st_mtime_ns,
                "ctime_ns": info.st_ctime_ns, "inode": info.st_ino, "device": info.st_dev,
                "regular": stat.S_ISREG(info.st_mode)}

    def version(self, url):
        """The file's size, times, inode and device; None for what is not a regular file."""
        try:
            described = self.describe(url)
        except Exception:  # noqa: BLE001 - no version: the caller reads the file itself
            return None
        return described if described.pop("regular") else None

    def list(self, prefix, recursive=False, on_page=None):
        """The folder's entries (links followed, as ``os.scandir`` tells), named under
        ``folder_path(prefix)``."""
        root, named = urls.to_local_path(prefix) or ".", self.folder_path(prefix)
        return listing(prefix, lambda: _scanned(root, named, recursive), on_page)

    def folder_path(self, prefix):
        return (urls.to_local_path(prefix) or ".").rstrip("/")

    def open_write(self, url, via):
        return LocalWriter(url, urls.local_path(url))

    def exists(self, url):
        return os.path.exists(urls.local_path(url))

    def delete(self, url):
        try:
            os.unlink(urls.local_path(url))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise stream_error(url, exc) from exc

    def size(self, url):
        try:
            return os.stat(urls.local_path(url)).st_size
        except Exception as exc:
            raise stream_error(url, exc) from exc


def _scanned(root: str, named: str, recursive: bool) -> list[dict]:
    """fsspec-like entries of the folder ``root`` (names ``named/NAME``); with ``recursive``
    the files at any depth."""
    entries = []
    with os.scandir(root) as listing:
        for entry in listing:
            name = f"{named}/{entry.name}"
            if entry.is_file():
                entries.append({"name": name, "type": "file", "size": entry.stat().st_size})
            elif recursive and entry.is_dir(follow_symlinks=False):
                entries += _scanned(entry.path, name, True)
            elif not recursive:
                entries.append({"name": name, "type": "directory" if entry.is_dir()
                                else "other", "size": 0})
    return entries
