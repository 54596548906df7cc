"""Durable small-file writes: write a temporary file, fsync it, rename it over the target, fsync the folder.

A reader sees either the whole old file or the whole new one, and after the folder fsync the new name survives a
crash. Every record that must be replaced atomically (checkpoints, topic metadata, cursor records) goes through
``write_atomically``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from storage import faults
from storage.files import TEMP_SUFFIX


def fsync_folder(folder: Path) -> None:
    _fsync(folder, os.O_RDONLY | os.O_DIRECTORY)


def fsync_file(path: Path) -> None:
    """fsync a file written through a descriptor that is closed now (or by another library)."""
    _fsync(path, os.O_RDONLY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, pieces: Sequence[bytes | pa.Buffer]) -> None:
    """Write every piece, in order, with as few ``writev`` calls as the kernel allows (it may write part)."""
    views = [memoryview(piece) for piece in pieces]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def write_durably(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write ``data`` as the whole of ``path`` and fsync it (``exclusive``: the file must not exist yet)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC), 0o644)
    try:
        write_all(fd, [data])
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + TEMP_SUFFIX)
    write_durably(temp, data)
    faults.crash_point("atomic_write.before_rename")
    os.replace(temp, path)
    fsync_folder(path.parent)


def holds_temporary_files(folder: Path) -> bool:
    """Whether ``folder`` (if it exists) holds ``*.tmp`` files: a cheap look before taking a lock to remove them."""
    try:
        return any(entry.name.endswith(TEMP_SUFFIX) for entry in folder.iterdir())
    except FileNotFoundError:
        return False


def remove_stray_temporary_files(folder: Path) -> list[Path]:
    """Remove ``*.tmp`` files an interrupted ``write_atomically`` left behind; returns what was removed."""
    removed = []
    for entry in folder.iterdir():
        if entry.name.endswith(TEMP_SUFFIX) and entry.is_file():
            entry.unlink()
            removed.append(entry)
    return removed
