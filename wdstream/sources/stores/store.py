"""``Store``: what wdstream does with the objects of one kind of storage. ``store_for(url)``
(``stores/__init__.py``) picks the store once from a URL's scheme; the rest of wdstream calls
its methods and asks its properties, and never compares schemes itself."""

from __future__ import annotations

from collections.abc import Callable

from wdstream.errors import InputError
from wdstream.sources import urls
from wdstream.sources.failures import stream_error
from wdstream.sources.ranged import shared_link
from wdstream.sources.writers import Writer

# the fields of a store's description that change whenever the object does
STRONG_VERSION = ("ETag", "etag", "generation", "md5Hash", "crc32c", "VersionId")


class Store:
    """One kind of storage (``scheme``: "file", "pipe", "s3", "gs" or an fsspec protocol).

    Reads go through ``openers.open_read`` and ``range_reads.read_at``, which choose a reader
    by the opener and ask the store what it offers: ``fixed_reader`` (the one reader of a
    local path or a command, whatever the opener), ``ranged_source`` and ``range_fetcher``
    (the sdk reader's concurrent and one-request ranged GETs), ``cli_reader`` (the command
    the cli opener runs). A store implements the rest, failures raised as wdstream's
    errors naming the URL: ``describe``, ``list``, ``folder_path``, ``open_write``, ``exists``,
    ``delete``, ``size``, ``filesystem`` (where fsspec reaches it); ``version``,
    ``head_and_start`` and ``quick_size`` have defaults."""

    local = False  # a path on this machine: special files and links are the reader's to check
    runs_command = False  # the URL is a shell command (``pipe:``), never taken from data
    remote = True  # reached over a network (not a local path, not a command)
    buckets = False  # "bucket/key" URLs (s3, gs): a prefix without objects is empty
    chains_names = False  # fsspec chains URLs at "::": a listed name must not hold one
    paths_are_urls = False  # fsspec's paths are whole URLs ("?" starts a query: http)
    version_fields: tuple[str, ...] = ()  # the tags the store checks on every ranged GET
    fixed_reader: str | None = None  # "file", "pipe": the reader whatever the opener
    ranged_source: type | None = None  # the sdk reader's source (``ranged.RangedSource``)
    range_fetcher: type | None = None  # its one range's GET (``range_fetchers.Fetcher``)
    cli_reader: Callable[[str, float], list[str]] | None = None  # (url, timeout) -> argv

    def __init__(self, scheme: str):
        self.scheme = scheme

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scheme!r})"

    def cli_command(self, url: str, timeout: float) -> list[str]:
        """The command the cli opener runs to read ``url`` (``cli_reader``)."""
        if self.cli_reader is None:
            raise no_reader(url, self.scheme, "cli")
        return self.cli_reader(url, timeout)

    def sdk_source(self, url: str, start: int, timeout: float, **options):
        """The sdk opener's source of ``url`` from ``start`` (``ranged_source``: concurrent
        ranged GETs over the process's link to the store)."""
        if self.ranged_source is None:
            raise no_reader(url, self.scheme, "sdk")
        return self.ranged_source(url, start, timeout, link=shared_link(timeout, self.scheme),
                                  **options)

    def sdk_fetcher(self, url: str, timeout: float):
        """The sdk opener's GET of one range of ``url`` (``range_fetcher``)."""
        if self.range_fetcher is None:
            raise no_reader(url, self.scheme, "sdk")
        return self.range_fetcher(url, timeout)

    def open_read(self, url: str, **options):
        """The object's body, read (``openers.open_read``'s options)."""
        from wdstream.sources.openers import open_read  # openers asks the stores

        return open_read(url, **options)

    def read_at(self, url: str, start: int, length: int, **options) -> bytes:
        """``length`` bytes from ``start`` (``range_reads.read_at``'s options)."""
        from wdstream.sources.range_reads import read_at  # range_reads asks the stores

        return read_at(url, start, length, **options)

    def filesystem(self, url: str, timeout: float = 60.0):
        """``(fs, path)``: the URL's fsspec filesystem and its path there."""
        raise InputError(f"{url}: not an fsspec URL")

    def describe(self, url: str) -> dict:
        """What the store says of the object: ``size`` and its version fields (raises the
        store's own errors, a missing object included)."""
        raise NotImplementedError

    def version(self, url: str) -> dict | None:
        """What changes whenever the object does, asked without reading it; None when the
        store tells nothing that reliable (or the request fails)."""
        try:
            described = self.describe(url)
        except Exception:  # noqa: BLE001 - no version: the caller reads the object itself
            return None
        return strong_version(described)

    def head_and_start(self, url: str, nbytes: int) -> tuple[dict, bytes] | None:
        """``describe`` and the first ``nbytes`` bytes by one request, where the store has
        one (raises its errors); None where it has not."""
        return None

    def quick_size(self, url: str) -> int | None:
        """The object's size by one request of the store's own client, without fsspec;
        None when there is no such object, or no such request."""
        return None

    def list(self, prefix: str, recursive: bool = False,
             on_page: Callable[[list[dict]], None] | None = None) -> list[dict]:
        """fsspec's entries (``name``, ``type``, ``size``, version fields) of what lies in the
        folder ``prefix`` (``recursive``: at any depth, files only); ``on_page`` called with
        the entries as they come."""
        raise NotImplementedError

    def folder_path(self, prefix: str) -> str:
        """The folder ``prefix``'s path as ``list``'s entries name what lies in it."""
        raise NotImplementedError

    def open_write(self, url: str, via: str) -> Writer:
        """A ``Writer``: the object appears whole on commit, nothing on abort."""
        raise NotImplementedError

    def exists(self, url: str) -> bool:
        raise NotImplementedError

    def delete(self, url: str) -> None:
        """Delete the object; a missing one is fine."""
        raise NotImplementedError

    def size(self, url: str) -> int | None:
        """The size in bytes, None when the store does not tell; StreamError (not transient)
        if it does not exist."""
        raise NotImplementedError


def strong_version(described: dict) -> dict | None:
    """The size and the strong version fields of a store's description of an object; None
    without them."""
    version = {name: str(described[name]) for name in STRONG_VERSION if described.get(name)}
    size = described.get("size")
    if not version or not isinstance(size, int) or isinstance(size, bool):
        return None
    return {"size": size, **version}


def listing(prefix: str, entries_of: Callable[[], list[dict]],
            on_page: Callable[[list[dict]], None] | None) -> list[dict]:
    """``entries_of()``, a store's listing of ``prefix`` made at once (its failures as
    wdstream's errors naming ``prefix``), handed to ``on_page`` whole."""
    try:
        entries = entries_of()
    except Exception as exc:
        raise stream_error(prefix, exc) from exc
    if on_page is not None:
        on_page(entries)
    return entries


def listed_size(found) -> int | None:
    """A size as a store gives it, None when it gives none that is a size."""
    if isinstance(found, bool) or not isinstance(found, int | float) or found < 0:
        return None
    return int(found)


def is_object(url: str) -> bool:
    """Whether the bucket URL ``url`` names an object (not the bucket, not a "folder/")."""
    return urls.object_key(url) is not None


def no_reader(url: str, scheme: str, opener: str) -> InputError:
    """The refusal of an opener (``cli``, ``sdk``) that has no reader for the store."""
    if opener == "cli":
        return InputError(f"{url}: no command-line reader for {scheme}:// (cli reads s3:// "
                          "and gs://)")
    return InputError(f"{url}: the sdk opener reads s3:// and gs:// only; use fsspec for "
                      f"{scheme}://")


def not_stored(url: str) -> InputError:
    return InputError(f"{url}: a pipe: source is not a stored object")
