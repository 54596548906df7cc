"""The key index of a compacted ledger: a rocksdict (RocksDB) map from keys to the offsets of their messages.

RocksDB is written from Python one entry at a time, under the GIL (about 0.27 s per 1M entries, on the path of
every compaction), so an entry holds a *group* of up to GROUP_KEYS consecutive keys of a sorted run:

- its RocksDB key is the run's number (big-endian uint16) and the group's first key;
- its value is the group: the number of keys c (little-endian uint32), c + 1 little-endian uint32 bounds of the
  keys within the key bytes, the key bytes, then c offsets (big-endian int64).

A lookup seeks, in each run, to the last group that starts at or before the key and searches that group (a
compaction writes one run unless phase one was split into passes), then the ledger finds the batch holding the
offset from its batch headers: never a scan. The index is bulk-loaded: each sorted run is written as an SST file
with RocksDB's SstFileWriter and the files are ingested into a fresh database at ``finish`` (no memtable, no
write-ahead log, no compaction); the ledger is not published until that is done. Afterwards it is opened
read-only.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from rocksdict import AccessType, IngestExternalFileOptions, Options, Rdict, SstFileWriter

from storage.binary_arrays import value_offsets
from storage.errors import LedgerviewError
from storage.fileio import fsync_file, fsync_folder

GROUP_KEYS: Final = 64
"""Keys per entry: 1M keys are 15,625 puts (about 0.02 s), and a lookup searches at most 64 keys."""
RUN: Final = struct.Struct(">H")
COUNT: Final = struct.Struct("<I")
BOUND_BYTES: Final = 4
OFFSET_BYTES: Final = 8
MAX_RUNS: Final = 1 << 16
RUNS_FOLDER: Final = "runs"


class CorruptKeyIndexError(LedgerviewError):
    def __init__(self, path: Path, key: bytes, reason: str) -> None:
        super().__init__(f"Key index {path}: the group holding key {key!r} {reason}. The index is damaged or from "
                         "another format: compact again.")


def _options() -> Options:
    return Options(raw_mode=True)


class KeyIndexWriter:
    """Writes a key index from sorted runs of (key, offset); keys are unique across all runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._runs_folder = path / RUNS_FOLDER
        self._runs_folder.mkdir(parents=True)
        self._runs: list[str] = []

    def add_sorted_run(self, keys: pa.Array, offsets: npt.NDArray[np.int64]) -> None:
        """Write one run: ``keys`` (binary, no nulls) in bytewise order, ``offsets`` in the same order."""
        if not len(keys):
            return
        if len(self._runs) >= MAX_RUNS:
            raise ValueError(f"a key index holds at most {MAX_RUNS} runs")
        path = str(self._runs_folder / f"{len(self._runs):06d}.sst")
        writer = SstFileWriter(_options())
        writer.open(path)
        prefix = RUN.pack(len(self._runs))
        for first_key, group in _groups(keys, offsets):
            writer[prefix + first_key] = group
        writer.finish()
        self._runs.append(path)

    def finish(self) -> None:
        """Ingest the runs into a fresh database (the files are moved in), make it durable, close it."""
        db = Rdict(str(self.path), _options())
        try:
            if self._runs:
                ingest = IngestExternalFileOptions()
                ingest.set_move_files(True)
                db.ingest_external_file(self._runs, ingest)
            db.flush(wait=True)
        finally:
            db.close()
        shutil.rmtree(self._runs_folder)
        for name in os.listdir(self.path):
            if name.endswith(".sst"):
                fsync_file(self.path / name)
        fsync_folder(self.path)

    def abort(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _groups(keys: pa.Array, offsets: npt.NDArray[np.int64]) -> Iterator[tuple[bytes, bytes]]:
    """(first key, packed group) of each GROUP_KEYS consecutive keys; the parts of every group are cut from three
    buffers made for the whole run at once."""
    count = len(keys)
    key_bounds = value_offsets(keys).astype(np.int64)
    starts = np.arange(0, count, GROUP_KEYS)
    ends = np.minimum(starts + GROUP_KEYS, count)
    # Each group's c + 1 bounds, relative to its first key: group g's are rows starts[g] + g to ends[g] + g.
    group_of = np.repeat(np.arange(len(starts)), ends - starts + 1)
    rows = np.arange(len(group_of)) - group_of
    bounds = memoryview((key_bounds[rows] - key_bounds[starts][group_of]).astype("<u4").tobytes())
    data = keys.buffers()[2]
    key_bytes = memoryview(data if data is not None else b"")
    offset_bytes = memoryview(np.asarray(offsets, ">i8").tobytes())
    for group, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        first, second, last = int(key_bounds[start]), int(key_bounds[start + 1]), int(key_bounds[end])
        yield bytes(key_bytes[first:second]), b"".join((
            COUNT.pack(end - start), bounds[(start + group) * BOUND_BYTES : (end + group + 1) * BOUND_BYTES],
            key_bytes[first:last], offset_bytes[start * OFFSET_BYTES : end * OFFSET_BYTES]))


class _Group:
    """One entry's keys and offsets, read in place."""

    def __init__(self, packed: bytes, path: Path, key: bytes) -> None:
        self.packed = packed
        self.count = COUNT.unpack_from(packed)[0] if len(packed) >= COUNT.size else 0
        bounds_end = COUNT.size + (self.count + 1) * BOUND_BYTES
        if not self.count or len(packed) < bounds_end:
            raise CorruptKeyIndexError(path, key, f"is {len(packed)} bytes, too short for its keys")
        self.bounds = struct.unpack_from(f"<{self.count + 1}I", packed, COUNT.size)
        self.keys_start = bounds_end
        self.offsets_start = bounds_end + self.bounds[-1]
        if len(packed) != self.offsets_start + self.count * OFFSET_BYTES:
            raise CorruptKeyIndexError(path, key, f"is {len(packed)} bytes, not what its {self.count} keys take")

    def key(self, row: int) -> bytes:
        return self.packed[self.keys_start + self.bounds[row] : self.keys_start + self.bounds[row + 1]]

    def offset_of(self, key: bytes) -> int | None:
        row = bisect.bisect_left(range(self.count), key, key=self.key)
        if row == self.count or self.key(row) != key:
            return None
        offset: int = struct.unpack_from(">q", self.packed, self.offsets_start + row * OFFSET_BYTES)[0]
        return offset

    def keys(self) -> Iterator[bytes]:
        return map(self.key, range(self.count))


class KeyIndex:
    """A finished key index, opened read-only (any number of processes may do so at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = Rdict(str(path), _options(), access_type=AccessType.read_only())
        except Exception as error:  # rocksdict raises a bare Exception; only a missing folder is expected
            if not path.exists():
                raise FileNotFoundError(f"key index {path} is gone") from error
            raise
        last = self._db.iter()
        last.seek_to_last()
        self._runs = RUN.unpack(last.key()[: RUN.size])[0] + 1 if last.valid() else 0

    def locate(self, key: bytes) -> int | None:
        """The offset of ``key``'s message in the ledger, or None."""
        groups = self._db.iter()
        for run in range(self._runs):
            prefix = RUN.pack(run)
            groups.seek_for_prev(prefix + key)
            if groups.valid() and groups.key()[: RUN.size] == prefix:
                offset = _Group(groups.value(), self.path, key).offset_of(key)
                if offset is not None:
                    return offset
        return None

    def keys(self) -> Iterator[bytes]:
        """Every key, run by run, in bytewise order within a run."""
        for entry, packed in self._db.items():
            assert isinstance(entry, bytes)  # raw mode
            yield from _Group(packed, self.path, entry[RUN.size :]).keys()

    def close(self) -> None:
        self._db.close()
