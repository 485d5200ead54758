"""Large manifests parsed once per node: the ranks of a node map one copy of the arrays.

``shared_manifest(url, ...)`` first asks the store for the manifest's version (a local file's
size, inode, mtime and ctime; an object's size and ETag or generation), which is one small
request instead of a download (on S3, a GET of the first bytes, which reads a manifest too
small to share whole: one round trip where a HEAD and a GET took two). A node-local entry named
by the manifest's URL and that version holds the parsed ``compact.ShardArrays`` columns, the
manifest's head (extensions, extra keys, sums) and the sha256 and size of the text they came
from. The first process to take the entry's lock (``flock``) reads and parses the manifest and
publishes the entry; the others wait on the lock, then map the entry read-only (``mmap``: the
page cache holds one copy for the whole node, and DataLoader workers share it too). The
publisher maps it as well and drops its private arrays.

Entry files: a 16-byte magic, the header's length and sha256, the header (JSON), then the
columns, each at a 64-byte aligned offset (raw arrays, numpy dtypes named in the header, whose
``columns_sha256`` covers them all).

Hostile ground: the directory is the user's own (created 0700; an existing one must belong to
the user and be writable by nobody else, as must every entry) and nothing is opened through a
symbolic link. An entry is used only when its magic, URL, version, sizes, the text's size
against the store's, the columns' dtypes and lengths and the sha256 of all its column bytes
agree, and its names pass the checks of the parser (``ShardArrays.from_columns``); anything
else (a stale, truncated, corrupt or planted file) is ignored and replaced by a fresh parse.
Entries are written to a temporary file and renamed into place; publishing an entry removes
the entries of older versions of the same URL. Sharing never makes a load fail: when the
store tells no version, or the directory cannot be used, each process loads its own copy.

``WDSTREAM_SHARE_MANIFEST``: ``0`` turns sharing off where ``share=True``, a path names the
directory (default: ``wdstream-<uid>/manifests`` in the temporary directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import stat
import struct
import tempfile
from collections.abc import Callable
from typing import cast

import numpy as np

from wdstream.errors import ManifestError, OptionTypeError
from wdstream.limits import MAX_DEPTH, json_loads
from wdstream.shards import compact
from wdstream.shards.compact import COLUMNS, ShardArrays
from wdstream.shards.manifest import Manifest
from wdstream.sources.stores import store_for, strong_version

log = logging.getLogger(__name__)

ENVIRONMENT = "WDSTREAM_SHARE_MANIFEST"
MAGIC = b"wdstream-shards\x00"
ENTRY_SUFFIX = ".shards"
_ALIGN = 64
_PREFIX = len(MAGIC) + 8 + 32  # the magic, the header's length and its sha256
_MAX_HEADER = 64 << 20  # the head's extra keys: far below this in any manifest
_OFF = ("0", "false", "no", "off")
_MIN_LINE = 50  # bytes: no shard line of to_json is shorter


def shared_manifest(url: str, base: str, read: Callable[[], bytes],
                    parse: Callable[[bytes], Manifest], directory=None) -> Manifest | None:
    """The manifest at ``url`` through the node-local entry (see the module docstring), or
    None when sharing does not apply here (the caller then reads and parses its own).
    ``read()`` returns the manifest's text, ``parse(text)`` the checked ``Manifest``; their
    errors propagate."""
    folder = shared_folder(directory)
    if folder is None:
        return None
    small = compact.SMALL * _MIN_LINE
    version, text = _version_and_text(url, small)
    if text is not None:  # read whole by the request that asked its version
        return parse(text)
    if version is None or version["size"] < small:
        return None  # too small to hold a manifest parsed into arrays: no lock, no files
    name = entry_name(url, version)
    path = os.path.join(folder, name + ENTRY_SUFFIX)
    found = open_entry(path, url, version, base)
    if found is not None:
        return found
    try:
        lock = _locked(os.path.join(folder, name + ".lock"))
    except OSError as error:
        log.warning("%s: cannot lock %s (%s); parsing the manifest here", url, folder, error)
        return None
    with lock:
        found = open_entry(path, url, version, base)  # published while this process waited
        if found is not None:
            return found
        text = read()
        manifest = parse(text)
        if not isinstance(manifest.shards, ShardArrays) or manifest.samples < 1 or \
                object_version(url) != version:
            return manifest  # small or empty (not shared), or changed while it was read
        try:
            write_entry(folder, path, url, version, manifest, text)
        except OSError as error:
            log.warning("%s: cannot write a shared copy in %s (%s)", url, folder, error)
            return manifest
        _forget_old_versions(folder, url, name)
    mapped = open_entry(path, url, version, base)
    return mapped if mapped is not None else manifest


# --------------------------------------------------------------------------- where


def check_share_option(owner: str, name: str, value) -> None:
    """OptionError unless ``value`` is True, False or a directory (str or path)."""
    if not isinstance(value, bool | str | os.PathLike) or value == "":
        raise OptionTypeError(f"{owner}: {name} must be True, False or a directory, got "
                          f"{value!r}")


def shared_folder(directory=None) -> str | None:
    """The directory entries live in, made if missing, or None when sharing is off or the
    directory is not this user's alone (with a warning)."""
    if directory is None:
        setting = os.environ.get(ENVIRONMENT, "").strip()
        if setting.lower() in _OFF:
            return None
        if setting:
            directory = setting
        else:
            top = os.path.join(tempfile.gettempdir(), f"wdstream-{os.getuid()}")
            if _private_dir(top, strict=True) is None:
                return None
            return _private_dir(os.path.join(top, "manifests"), strict=True)
    return _private_dir(os.fspath(directory), strict=False)


def _private_dir(path: str, strict: bool) -> str | None:
    """``path`` as a directory of this user that no one else may write (``strict``: that no
    one else may read either), made with mode 0700 if missing."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as error:
        log.warning("%s: cannot use it for shared manifests (%s)", path, error)
        return None
    others = 0o077 if strict else 0o022
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & others:
        log.warning("%s: not a directory of this user alone (owner %d, mode %o); manifests are "
                    "not shared through it", path, info.st_uid, stat.S_IMODE(info.st_mode))
        return None
    return path


def _version_and_text(url: str, small: int) -> tuple[dict | None, bytes | None]:
    """``object_version(url)``, and the object's bytes when it is shorter than ``small``
    and one request tells both (the store's ``head_and_start``: on S3 and GCS, one ranged
    GET of its first ``small`` bytes rather than asking its version and then reading it; the
    bytes are dropped when the object is longer)."""
    store = store_for(url)
    try:
        found = store.head_and_start(url, small)
    except Exception:  # noqa: BLE001 - no version: the caller's read reports the failure
        return None, None
    if found is None:
        return store.version(url), None
    described, start = found
    size = described.get("size")
    whole = start if isinstance(size, int) and len(start) == size < small else None
    return strong_version(described), whole


def object_version(url: str) -> dict | None:
    """What changes whenever the object at ``url`` does, asked of the store without reading
    it (``Store.version``: S3 through the reader's botocore client, GCS through its JSON API
    client, a local file's size, times, inode and device); None when the store tells nothing
    that reliable (or the request fails)."""
    return store_for(url).version(url)


def entry_name(url: str, version: dict) -> str:
    """The URL's digest, then the version's: entries of one URL share the first part."""
    return (hashlib.sha256(url.encode("utf-8")).hexdigest()[:24] + "-" +
            hashlib.sha256(json.dumps(version, sort_keys=True).encode()).hexdigest()[:24])


@contextlib.contextmanager
def _locked(path: str):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# --------------------------------------------------------------------------- entries


def write_entry(folder: str, path: str, url: str, version: dict, manifest: Manifest,
                text: bytes) -> None:
    """Publish ``manifest``'s arrays at ``path``: a temporary file renamed into place."""
    columns = cast(ShardArrays, manifest.shards).columns  # the caller checked it is
    layout, offset = {}, 0
    digest = hashlib.sha256()
    for name in COLUMNS:
        column = np.ascontiguousarray(columns[name])
        layout[name] = [column.dtype.str, list(column.shape), offset, column.nbytes]
        # numpy's stub declares ndarray.__buffer__ only for Python >= 3.12
        digest.update(memoryview(column).cast("B"))  # type: ignore[arg-type]
        offset += -(-column.nbytes // _ALIGN) * _ALIGN
    head = {"samples": manifest.samples, "bytes": manifest.bytes,
            "extensions": manifest.extensions, "extra": manifest.extra}
    header = json.dumps({"url": url, "version": version, "text_bytes": len(text),
                         "text_sha256": hashlib.sha256(text).hexdigest(),
                         "fingerprint": manifest.fingerprint(), "head": head,
                         "columns": layout, "columns_sha256": digest.hexdigest()}).encode()
    start = -(-(_PREFIX + len(header)) // _ALIGN) * _ALIGN
    temporary = os.path.join(folder, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC + struct.pack("<Q", len(header)) + hashlib.sha256(header).digest())
            out.write(header)
            out.write(bytes(start - out.tell()))
            for name in COLUMNS:
                column = np.ascontiguousarray(columns[name])
                # numpy's stub declares ndarray.__buffer__ only for Python >= 3.12
                out.write(memoryview(column).cast("B"))  # type: ignore[arg-type]
                out.write(bytes(-column.nbytes % _ALIGN))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def open_entry(path: str, url: str, version: dict, base: str) -> Manifest | None:
    """The manifest an entry holds, its columns mapped read-only, or None unless the entry is
    there, this user's, and right in every check of the module docstring."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or \
                info.st_mode & 0o022 or info.st_size < _PREFIX:
            return _refused(path, "not a file of this user alone")
        # read whole at once (the digest reads every page): one call, not a fault per page
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapping = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    try:
        return _read_entry(mapping, path, url, version, base)
    except (ValueError, TypeError, KeyError, OverflowError, ManifestError) as error:
        return _refused(path, f"unreadable ({error})")


def _read_entry(mapping: mmap.mmap, path: str, url: str, version: dict,
                base: str) -> Manifest | None:
    if mapping[:len(MAGIC)] != MAGIC:
        return _refused(path, "not an entry")
    (length,) = struct.unpack("<Q", mapping[len(MAGIC):len(MAGIC) + 8])
    if length > min(_MAX_HEADER, len(mapping) - _PREFIX):
        return _refused(path, "a header longer than the file")
    text = mapping[_PREFIX:_PREFIX + length]
    if hashlib.sha256(text).digest() != mapping[len(MAGIC) + 8:_PREFIX]:
        return _refused(path, "its header differs from its digest")
    # the manifest's extra keys sit two levels down; deeper is a NestingError: refused
    header = json_loads(text, MAX_DEPTH + 2)
    if header["url"] != url or header["version"] != version:
        return _refused(path, "of another manifest")
    if header["text_bytes"] != version["size"]:
        return _refused(path, "made from a text of another size")
    start = -(-(_PREFIX + length) // _ALIGN) * _ALIGN
    data = memoryview(mapping)[start:]
    layout = header["columns"]
    if set(layout) != set(COLUMNS):
        return _refused(path, "columns missing")
    columns, digest = {}, hashlib.sha256()
    for name, (dtype, _width) in COLUMNS.items():
        kind, shape, offset, nbytes = layout[name]
        expected = np.dtype(dtype)
        if np.dtype(kind) != expected:
            return _refused(path, f"column {name} of type {kind}")
        count = int(np.prod(shape, dtype=np.int64))
        if offset % _ALIGN or nbytes != count * expected.itemsize or \
                offset + nbytes > len(data) or offset < 0 or min(shape, default=0) < 0:
            return _refused(path, f"column {name} outside the file")
        piece = data[offset:offset + nbytes]
        digest.update(piece)
        columns[name] = np.frombuffer(piece, dtype=expected).reshape(shape)
    if digest.hexdigest() != header["columns_sha256"]:
        return _refused(path, "its columns differ from their digest")
    shards = ShardArrays.from_columns(columns)
    head = header["head"]
    if shards is None or head["samples"] != shards.total_samples or head["samples"] < 1 or \
            head["bytes"] != shards.total_bytes:
        return _refused(path, "shards that are not a manifest's")
    manifest = Manifest.from_doc(
        {"format": "wdstream", "version": 1, "samples": head["samples"],
         "bytes": head["bytes"], "extensions": head["extensions"], **head["extra"],
         "shards": shards}, base=base, where=url)
    if isinstance(header["fingerprint"], str) and len(header["fingerprint"]) == 16:
        shards._fingerprint = header["fingerprint"]
    shards.mapped_from = path
    return manifest


def _refused(path: str, why: str) -> Manifest | None:
    """No manifest (None): the entry at ``path`` is ignored, for ``why``."""
    log.warning("%s: shared manifest copy ignored: %s", path, why)
    return None


def _forget_old_versions(folder: str, url: str, name: str) -> None:
    """Remove the entries of other versions of the same URL (and their locks)."""
    prefix = name.split("-", 1)[0] + "-"
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            if entry.startswith(prefix) and not entry.startswith(name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, entry))
