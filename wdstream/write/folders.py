"""Folder inputs, local or remote: the files that share a key form one sample."""

from __future__ import annotations

from collections.abc import Iterator

from wdstream.errors import InputError
from wdstream.write.local_inputs import folder_files
from wdstream.write.record_batches import MAX_RECORD, Batch, FolderSample, ReadCounter, limit_text
from wdstream.write.remote import is_remote, list_folder


def read_folder(path: str, max_record: int = MAX_RECORD, counter: ReadCounter | None = None,
                follow_links: bool = False) -> Iterator[Batch]:
    """Files sharing a key form one sample, in key order.

    The key is the path relative to the folder up to the first dot of the basename (WebDataset's
    rule). Files in subfolders therefore give keys with "/" (``cats/a``), which the packer
    refuses under the key rules rather than renaming them silently. Hidden files and folders
    (a name starting with ".") are skipped; a file without an extension is an error, since its
    member would have no name, and so is a file larger than ``max_record`` (by its listed
    size, before it is read). A local folder is read as ``local_files`` lists it: its regular
    files, and links only within it unless ``follow_links``. A remote folder is every object
    under the prefix; the files' bytes are read by the process that writes their shard.
    """
    counter = counter if counter is not None else ReadCounter()
    entries: list[tuple[str, str, str, int, tuple[int, int] | None]] = []
    for relative, file_path, size, identity in _folder_files(path, follow_links):
        folder, _, name = relative.rpartition("/")
        base, dot, ext = name.partition(".")
        if not dot or not ext:
            raise InputError(
                f"{file_path}: a file without an extension cannot be a sample member "
                "(the extension names the member)"
            )
        if size > max_record:
            raise InputError(f"{path.rstrip('/')}/{relative}: {size:,} bytes, more than "
                             f"{limit_text(max_record)}, the largest record pack accepts")
        entries.append(((folder + "/" if folder else "") + base, ext, file_path, size, identity))
    entries.sort()
    index = 0
    while index < len(entries):
        key = entries[index][0]
        end = index
        while end < len(entries) and entries[end][0] == key:
            end += 1
        files = tuple(entry[1:] for entry in entries[index:end])
        counter.read += sum(size for _, _, size, _ in files)
        yield Batch(path, "file", (0,), [FolderSample(key, files)])
        index = end


def _folder_files(path: str, follow_links: bool) -> list[tuple[str, str, int, tuple | None]]:
    """``(relative path with "/", path or URL, size, identity)`` of every file under the
    folder (identity: a local file's device and inode, None for an object)."""
    if is_remote(path):
        return [(relative, url, size, None) for relative, url, size in list_folder(path)
                if not any(part.startswith(".") for part in relative.split("/"))]
    return list(folder_files(path, follow_links))
