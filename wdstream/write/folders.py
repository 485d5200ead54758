"""Folder inputs, local or remote: the files that share a key form one sample."""

from __future__ import annotations

import os
from collections.abc import Iterator

from wdstream.errors import InputError
from wdstream.write.batches import MAX_RECORD, Batch, FolderSample, ReadCounter
from wdstream.write.remote import is_remote, list_folder


def read_folder(path: str, max_record: int = MAX_RECORD,
                counter: ReadCounter | None = None) -> Iterator[Batch]:
    """Files sharing a key form one sample, in key order.

    The key is the path relative to the folder up to the first dot of the basename (WebDataset's
    rule). Files in subfolders therefore give keys with "/" (``cats/a``), which the packer
    refuses under the key rules rather than renaming them silently. Hidden files and folders
    (a name starting with ".") are skipped; a file without an extension is an error, since its
    member would have no name. A remote folder is every object under the prefix; the files'
    bytes are read by the process that writes their shard.
    """
    counter = counter if counter is not None else ReadCounter()
    entries: list[tuple[str, str, str, int]] = []  # (key, ext, path, size)
    for relative, file_path, size in _folder_files(path):
        folder, _, name = relative.rpartition("/")
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        base, dot, ext = name.partition(".")
        if not dot or not ext:
            raise InputError(
                f"{file_path}: a file without an extension cannot be a sample member "
                "(the extension names the member)"
            )
        entries.append(((folder + "/" if folder else "") + base, ext, file_path, size))
    entries.sort()
    index = 0
    while index < len(entries):
        key = entries[index][0]
        end = index
        while end < len(entries) and entries[end][0] == key:
            end += 1
        files = tuple((ext, file_path, size) for _, ext, file_path, size in entries[index:end])
        counter.read += sum(size for _, _, size in files)
        yield Batch(path, "file", (0,), [FolderSample(key, files)])
        index = end


def _folder_files(path: str) -> list[tuple[str, str, int]]:
    """``(relative path with "/", path or URL, size)`` of every file under the folder."""
    if is_remote(path):
        return list_folder(path)
    files = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        relative = os.path.relpath(folder, path)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        for name in sorted(names):
            file_path = os.path.join(folder, name)
            files.append((prefix + name, file_path, os.path.getsize(file_path)))
    return files

