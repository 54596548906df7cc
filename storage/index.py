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
import itertools
import os
import struct
from pathlib import Path

OFFSET_ENTRY = struct.Struct("<ii")
TIME_ENTRY = struct.Struct("<qi")


class _AppendOnlyIndex:
    def __init__(self, path: Path, entry: struct.Struct) -> None:
        self.path = path
        self._entry = entry
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
        """Take the entries from ``data`` (an index file's bytes); False when it is not a whole number of entries."""
        if len(data) % self._entry.size:
            return False
        pairs = list(self._entry.iter_unpack(data))
        self.keys = [pair[0] for pair in pairs]
        self.values = [pair[1] for pair in pairs]
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

    def rewrite(self, pairs: list[tuple[int, int]]) -> None:
        self.keys = [pair[0] for pair in pairs]
        self.values = [pair[1] for pair in pairs]
        self.path.write_bytes(b"".join(self._entry.pack(*pair) for pair in pairs))

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
        super().__init__(path, OFFSET_ENTRY)

    def is_consistent(self, log_bytes: int) -> bool:
        keys, positions = self.keys, self.values
        ordered = all(a < b for a, b in itertools.pairwise(keys)) and all(
            a < b for a, b in itertools.pairwise(positions)
        )
        return ordered and (not keys or (keys[0] >= 0 and positions[0] > 0 and positions[-1] < log_bytes))

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """``(relative offset, file position)`` of the last indexed batch starting at or before
        ``relative_offset``; ``(-1, 0)`` (scan from the start) if there is none."""
        i = bisect.bisect_right(self.keys, relative_offset)
        return (self.keys[i - 1], self.values[i - 1]) if i else (-1, 0)


class TimeIndex(_AppendOnlyIndex):
    def __init__(self, path: Path) -> None:
        super().__init__(path, TIME_ENTRY)

    def is_consistent(self, max_relative_offset: int) -> bool:
        timestamps, offsets = self.keys, self.values
        ordered = all(a < b for a, b in itertools.pairwise(timestamps)) and all(
            a <= b for a, b in itertools.pairwise(offsets)
        )
        return ordered and (not offsets or (offsets[0] >= 0 and offsets[-1] <= max_relative_offset))

    @property
    def last_timestamp(self) -> int | None:
        return self.keys[-1] if self.keys else None

    def lookup(self, timestamp: int) -> int:
        """Relative offset from which a scan for the first message with a timestamp >= ``timestamp`` may start."""
        i = bisect.bisect_left(self.keys, timestamp)
        return self.values[i - 1] if i else 0
