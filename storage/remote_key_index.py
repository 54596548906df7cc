"""A ledger's key index as one object of the remote tier, so a point lookup from a machine without the ledger's
folder costs one ranged read, not a download of the index.

The RocksDB key index (storage/key_index.py) already holds its keys in groups of up to GROUP_KEYS; this object
lays the same groups end to end and ends with a directory (docs/FORMAT.md, "Remote tier")::

    group bytes ... | directory: per group <u64 position, u32 length, u32 CRC-32C, u32 entry length, entry> | tail

where an entry is the RocksDB key (run number, big-endian uint16, then the group's first key), the CRC-32C is the
group's (checked on every read: a damaged group is an error, never a wrong answer), and the tail is
``<u64 directory position, u32 groups, u32 CRC-32C of the directory, 8-byte magic LVKEYS03>`` (a damaged first
key in the directory would send a lookup to the wrong group, which answers that the key is absent). Objects of
earlier versions are still read, without that check: LVKEYS02 (the tail without the directory's CRC-32C) and
LVKEYS01 (entries without the group's CRC-32C either). The directory is fetched once and kept (about 20 bytes
per 32 keys); a lookup then reads the one group that may hold the key in each run (one run unless phase one had
more survivors than its budget holds at once).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final

import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from storage.key_index import RUN, CorruptKeyIndexError, offset_in_group, packed_groups
from storage.object_store import RemoteObjectMissingError

MAGIC: Final = b"LVKEYS03"
MAGIC_WITHOUT_DIRECTORY_CRC: Final = b"LVKEYS02"
MAGIC_WITHOUT_CRC: Final = b"LVKEYS01"
TAIL: Final = struct.Struct("<QII8s")
TAIL_WITHOUT_DIRECTORY_CRC: Final = struct.Struct("<QI8s")
ENTRY: Final = struct.Struct("<QIII")
ENTRY_WITHOUT_CRC: Final = struct.Struct("<QII")
RangeReader = Callable[[int, int], pa.Buffer]
"""Reads ``length`` bytes at ``position`` of the object (one ranged request)."""


class CorruptRemoteKeyIndexError(CorruptKeyIndexError):
    """A flat key index object of the remote tier that cannot be right; `verify --repair` rebuilds local indexes
    only, and lookups answer from a scan of the ledger meanwhile."""

    repair = ("compact the partition again, which uploads a new view with a new key index (point lookups read the "
              "ledger's keys meanwhile)")


def write_flat_key_index(entries: Iterable[tuple[bytes, bytes]], path: Path) -> int:
    """Write the (entry, packed group) pairs of a key index, in its order, as one flat file at ``path``; returns
    its size. The entries come from a RocksDB index (``KeyIndex.entries``) or straight from sorted keys
    (``sorted_run_entries``)."""
    directory: list[bytes] = []
    position = 0
    with open(path, "wb") as file:
        for entry, group in entries:
            file.write(group)
            directory.append(ENTRY.pack(position, len(group), crc32c.crc32c(group), len(entry)) + entry)
            position += len(group)
        directory_bytes = b"".join(directory)
        file.write(directory_bytes)
        file.write(TAIL.pack(position, len(directory), crc32c.crc32c(directory_bytes), MAGIC))
        return file.tell()


def sorted_run_entries(keys: pa.Array, offsets: npt.NDArray[np.int64]) -> Iterator[tuple[bytes, bytes]]:
    """The entries of a key index of one run: ``keys`` (binary, unique, no nulls) in bytewise order, ``offsets``
    in the same order."""
    run = RUN.pack(0)
    for first_key, group in packed_groups(keys, offsets):
        yield run + first_key, group


class FlatKeyIndex:
    """A flat key index read through ranged reads; the same ``locate`` as KeyIndex."""

    def __init__(self, path: str, size: int, read_range: RangeReader) -> None:
        self.path = path
        self._size, self._read_range = size, read_range
        self._runs: list[tuple[list[bytes], list[tuple[int, int, int | None]]]] | None = None

    def _directory(self, key: bytes | None) -> list[tuple[list[bytes], list[tuple[int, int, int | None]]]]:
        """Per run: its groups' first keys (sorted) and their (position, length, CRC-32C or None); read on first
        use."""
        if self._runs is None:
            if self._size < TAIL_WITHOUT_DIRECTORY_CRC.size:
                raise CorruptRemoteKeyIndexError(self.path, key, f"{self._size} bytes cannot hold its tail")
            tail = self._read(self._size - min(self._size, TAIL.size), min(self._size, TAIL.size), key)
            magic = tail[-len(MAGIC):]
            directory_crc: int | None = None
            if magic == MAGIC and len(tail) == TAIL.size:
                start, groups, directory_crc, _ = TAIL.unpack(tail)
                tail_size = TAIL.size
            elif magic in (MAGIC_WITHOUT_DIRECTORY_CRC, MAGIC_WITHOUT_CRC):
                start, groups, _ = TAIL_WITHOUT_DIRECTORY_CRC.unpack(tail[-TAIL_WITHOUT_DIRECTORY_CRC.size :])
                tail_size = TAIL_WITHOUT_DIRECTORY_CRC.size
            else:
                raise CorruptRemoteKeyIndexError(self.path, key, "its tail is not a flat key index's")
            if start > self._size - tail_size:
                raise CorruptRemoteKeyIndexError(self.path, key, "its tail is not a flat key index's")
            data = self._read(start, self._size - tail_size - start, key)
            if directory_crc is not None and crc32c.crc32c(data) != directory_crc:
                raise CorruptRemoteKeyIndexError(self.path, key, "its directory fails its CRC-32C")
            runs: dict[int, tuple[list[bytes], list[tuple[int, int, int | None]]]] = {}
            at = 0
            for _ in range(groups):
                if at + (ENTRY_WITHOUT_CRC if magic == MAGIC_WITHOUT_CRC else ENTRY).size > len(data):
                    raise CorruptRemoteKeyIndexError(self.path, key, "its directory is damaged")
                if magic != MAGIC_WITHOUT_CRC:
                    position, length, crc, entry_length = ENTRY.unpack_from(data, at)
                    at += ENTRY.size
                else:
                    (position, length, entry_length), crc = ENTRY_WITHOUT_CRC.unpack_from(data, at), None
                    at += ENTRY_WITHOUT_CRC.size
                entry = data[at : at + entry_length]
                at += entry_length
                if len(entry) != entry_length or entry_length < RUN.size or position + length > start:
                    raise CorruptRemoteKeyIndexError(self.path, key, "its directory is damaged")
                first_keys, places = runs.setdefault(RUN.unpack_from(entry)[0], ([], []))
                first_keys.append(entry[RUN.size :])
                places.append((position, length, crc))
            self._runs = [runs[run] for run in sorted(runs)]
        return self._runs

    def locate(self, key: bytes) -> int | None:
        """The offset of ``key``'s message in the ledger, or None."""
        for first_keys, places in self._directory(key):
            group = bisect.bisect_right(first_keys, key) - 1
            if group < 0:
                continue
            position, length, crc = places[group]
            data = self._read(position, length, key)
            if crc is not None and crc32c.crc32c(data) != crc:
                raise CorruptRemoteKeyIndexError(self.path, key, f"the group at byte {position} fails its CRC-32C")
            offset = offset_in_group(data, key, self.path, CorruptRemoteKeyIndexError)
            if offset is not None:
                return offset
        return None

    def check(self) -> int:
        """Read the directory and every group, checking their CRC-32Cs (an object of an earlier version: the ones
        it has) and that each run's first keys are in order; CorruptKeyIndexError at the first damage. Returns the
        groups read."""
        groups = 0
        for first_keys, places in self._directory(None):
            if first_keys != sorted(first_keys):
                raise CorruptRemoteKeyIndexError(self.path, None, "its directory's first keys are out of order")
            for position, length, crc in places:
                if crc is not None and crc32c.crc32c(self._read(position, length, None)) != crc:
                    raise CorruptRemoteKeyIndexError(self.path, None, f"the group at byte {position} fails its CRC-32C")
                groups += 1
        return groups

    def _read(self, position: int, length: int, key: bytes | None) -> bytes:
        """``length`` bytes at ``position``; CorruptKeyIndexError if the object is gone or shorter than the remote
        log's manifest says (a lookup then answers from a scan of the ledger, never from the damage)."""
        try:
            data: bytes = self._read_range(position, length).to_pybytes()
        except RemoteObjectMissingError:
            raise CorruptRemoteKeyIndexError(self.path, key, "the remote tier no longer holds it") from None
        if len(data) != length:
            raise CorruptRemoteKeyIndexError(self.path, key, f"it is shorter than the {self._size} bytes the remote "
                                             "log's manifest says")
        return data

    def close(self) -> None:
        self._runs = None


class FlatKeyIndexes:
    """A key index in pieces that hold disjoint key ranges (one per task that wrote it), looked up in the one
    piece whose range holds the key."""

    damaged: type[CorruptKeyIndexError] = CorruptRemoteKeyIndexError
    """What damage found through it raises (its advice says how to rebuild it)."""
    indexed = True
    """A remote view always has its key index (compactor/run.py builds one for tiered topics)."""

    def __init__(self, pieces: list[tuple[bytes, FlatKeyIndex]]) -> None:
        self._first_keys = [first for first, _ in pieces]
        self._pieces = [piece for _, piece in pieces]
        self.path = self._pieces[0].path if len(self._pieces) == 1 else f"a key index in {len(pieces)} objects"

    def locate(self, key: bytes) -> int | None:
        """The offset of ``key``'s message in the ledger, or None."""
        piece = bisect.bisect_right(self._first_keys, key) - 1
        return self._pieces[piece].locate(key) if piece >= 0 else None

    def close(self) -> None:
        for piece in self._pieces:
            piece.close()
