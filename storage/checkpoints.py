"""Kafka's offset checkpoint files: ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
``cleaner-offset-checkpoint``.

The text format is Kafka's, so its tools read ours::

    0                     version
    2                     number of entries
    prices 0 1200         topic partition offset
    prices 1 1187

One file per data folder holds every partition. Several processes update it, so updates read, change and
replace the file atomically under the store lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from storage.errors import CorruptDataError
from storage.fileio import write_atomically
from storage.locks import FileLock

VERSION = 0
PartitionKey = tuple[str, int]


class CorruptCheckpointError(CorruptDataError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"Checkpoint file {path} is malformed: {reason}. Remove it to recover from the logs.")


def read_checkpoint(path: Path) -> dict[PartitionKey, int]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as error:
        raise CorruptCheckpointError(path, f"byte {error.start} is not text ({error.reason})") from error
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        raise CorruptCheckpointError(path, f"expected version {VERSION} and a count on the first two lines")
    try:
        count = int(lines[1])
        entries = {}
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.split(" ")
            entries[(topic, int(partition))] = int(offset)
    except ValueError as error:
        raise CorruptCheckpointError(path, str(error)) from error
    if len(entries) != count:
        raise CorruptCheckpointError(path, f"it announces {count} entries and holds {len(entries)}")
    return entries


def write_checkpoint(path: Path, entries: Mapping[PartitionKey, int]) -> None:
    lines = [str(VERSION), str(len(entries))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(entries.items())]
    write_atomically(path, ("\n".join(lines) + "\n").encode())


def update_checkpoint(path: Path, lock: FileLock, changes: Mapping[PartitionKey, int | None]) -> None:
    """Set (or, with None, remove) entries of a shared checkpoint file without losing other processes' entries;
    the file is not rewritten when nothing changes."""
    with lock:
        entries = read_checkpoint(path)
        if all(entries.get(key) == offset for key, offset in changes.items()):
            return
        for key, offset in changes.items():
            if offset is None:
                entries.pop(key, None)
            else:
                entries[key] = offset
        write_checkpoint(path, entries)


class CachedCheckpoint:
    """A checkpoint file read again only when it was replaced (reads happen on every refresh).

    Every update renames a new file into place, so a new inode number tells a replacement even within one tick
    of the file system's clock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._entries: dict[PartitionKey, int] = {}

    def get(self, key: PartitionKey, default: int) -> int:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return default
        identity = (stat.st_ino, stat.st_mtime_ns)
        if identity != self._identity:
            self._entries, self._identity = read_checkpoint(self.path), identity
        return self._entries.get(key, default)
