"""Sparse offset and time indexes beside each segment, as Kafka keeps them.

Offset index (``.index``): 8-byte entries ``(int32 base offset - segment base, int32 file position)`` of a batch.
Time index (``.timeindex``): 12-byte entries ``(int64 T, int32 relative offset o)`` meaning every message in the
batches before the batch at offset ``o`` has a timestamp at most ``T``; ``T`` only grows. A sealed segment ends its
time index with ``(max timestamp, next offset)``.

An entry is added when more than ``index.interval.bytes`` were appended since the last one, so the first batch of
a segment is never indexed and lookups fall back to position 0. Indexes carry no checksum: on open they are
checked for shape and order and rebuilt from the log when in doubt.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

import numpy as np

OFFSET_ENTRY = struct.Struct("<ii")
TIME_ENTRY = struct.Struct("<qi")
OFFSET_ENTRIES = np.dtype([("key", "<i4"), ("value", "<i4")])
TIME_ENTRIES = np.dtype([("key", "<i8"), ("value", "<i4")])
"""The entries as columns, for whole files."""


class _AppendOnlyIndex:
    def __init__(self, path: Path, entry: struct.Struct, columns: np.dtype) -> None:
        self.path = path
        self._entry = entry
        self._columns = columns
        self.keys: list[int] = []
        self.values: list[int] = []
        self._append_fd: int | None = None
        """Kept open while the segment is active: opening the file for every entry cost more than the write."""

    def load(self) -> bool:
        """Read the entries from disk; False when the file is missing or not a whole number of entries."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        return self.load_bytes(data)

    def load_bytes(self, data: bytes) -> bool:
        """Take the entries from ``data`` (an index file's bytes); False when it is not a whole number of entries.
        Columnar: a segment of small batches has an entry per batch, and every open loads every segment's."""
        if len(data) % self._entry.size:
            return False
        entries = np.frombuffer(data, self._columns)
        self.keys, self.values = entries["key"].tolist(), entries["value"].tolist()
        return True

    def append(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)
        if self._append_fd is None:
            self._append_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._append_fd, self._entry.pack(key, value))

    def close(self) -> None:
        if self._append_fd is not None:
            os.close(self._append_fd)
            self._append_fd = None

    def rewrite(self) -> None:
        """Replace the file with the entries held."""
        entries = np.empty(len(self.keys), self._columns)
        entries["key"], entries["value"] = self.keys, self.values
        self.path.write_bytes(entries.tobytes())

    def fsync(self) -> None:
        if self._append_fd is not None:
            os.fsync(self._append_fd)
        elif self.path.exists():
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class OffsetIndex(_AppendOnlyIndex):
    def __init__(self, path: Path) -> None:
        super().__init__(path, OFFSET_ENTRY, OFFSET_ENTRIES)

    def is_consistent(self, log_bytes: int) -> bool:
        keys, positions = self.keys, self.values
        ordered = _increasing(keys, strictly=True) and _increasing(positions, strictly=True)
        return ordered and (not keys or (keys[0] >= 0 and positions[0] > 0 and positions[-1] < log_bytes))

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """``(relative offset, file position)`` of the last indexed batch starting at or before
        ``relative_offset``; ``(-1, 0)`` (scan from the start) if there is none."""
        i = bisect.bisect_right(self.keys, relative_offset)
        return (self.keys[i - 1], self.values[i - 1]) if i else (-1, 0)


class TimeIndex(_AppendOnlyIndex):
    def __init__(self, path: Path) -> None:
        super().__init__(path, TIME_ENTRY, TIME_ENTRIES)

    def is_consistent(self, max_relative_offset: int) -> bool:
        timestamps, offsets = self.keys, self.values
        ordered = _increasing(timestamps, strictly=True) and _increasing(offsets, strictly=False)
        return ordered and (not offsets or (offsets[0] >= 0 and offsets[-1] <= max_relative_offset))

    @property
    def last_timestamp(self) -> int | None:
        return self.keys[-1] if self.keys else None

    def lookup(self, timestamp: int) -> int:
        """Relative offset from which a scan for the first message with a timestamp >= ``timestamp`` may start."""
        i = bisect.bisect_left(self.keys, timestamp)
        return self.values[i - 1] if i else 0


def _increasing(values: list[int], *, strictly: bool) -> bool:
    steps = np.diff(np.asarray(values, np.int64))
    return bool((steps > 0).all() if strictly else (steps >= 0).all())
