"""The key index of a compacted ledger: a rocksdict (RocksDB) map from keys to the offsets of their messages.

RocksDB is written from Python one entry at a time, under the GIL (about 0.27 s per 1M entries, on the path of
every compaction), so an entry holds a *group* of up to GROUP_KEYS consecutive keys of a sorted run:

- its RocksDB key is the run's number (big-endian uint16) and the group's first key;
- its value is the group: the number of keys c (little-endian uint32), c + 1 little-endian uint32 bounds of the
  keys within the key bytes, the key bytes, then c offsets (big-endian int64).

A lookup seeks, in each run, to the last group that starts at or before the key and searches that group (a
compaction writes one run unless phase one had more survivors than its budget holds at once), then the ledger finds
the batch holding the offset from its batch headers: never a scan. The index is bulk-loaded: each sorted run is
written as an SST file with RocksDB's SstFileWriter and the files are ingested into a fresh database at ``finish``
(no memtable, no write-ahead log, no compaction); the ledger is not published until that is done. Afterwards it is
opened read-only.
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
from rocksdict import (
    AccessType,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    RdictIter,
    SstFileWriter,
)

from storage.binary_arrays import value_offsets
from storage.errors import CorruptDataError, LedgerviewError
from storage.fileio import fsync_file, fsync_folder

GROUP_KEYS: Final = 32
"""Keys per entry. Writing a run of 1M keys took 0.17 s in groups of 16, 0.12 s in groups of 32 and 0.10 s in
groups of 64 (0.45 s with one entry per key); a lookup took about 9, 12 and 14 µs (6 µs with one entry per key):
the search in the group and the copy of its value grow with it."""
RUN: Final = struct.Struct(">H")
COUNT: Final = struct.Struct("<I")
BOUND: Final = struct.Struct("<I")
BOUND_BYTES: Final = BOUND.size
OFFSET: Final = struct.Struct(">q")
OFFSET_BYTES: Final = OFFSET.size
MAX_RUNS: Final = 1 << 16
RUNS_FOLDER: Final = "runs"
UNINDEXED_MARKER: Final = "unindexed"
"""The one file of a ledger's key index folder when its topic had compaction.key.index false: no database was
written, and lookups in the ledger read its keys instead (storage/scanned_keys.py)."""


class KeyIndexError(LedgerviewError):
    """A key index that lookups cannot go through (its ledger answers them from a scan instead)."""


class UnreadableKeyIndexError(KeyIndexError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path = str(path)
        super().__init__(f"Key index {path} cannot be opened here ({reason}): rocksdict writes a file into the index "
                         "on every open, which a read-only data folder refuses. Open the folder writable for fast "
                         "point lookups.")


class CorruptKeyIndexError(KeyIndexError, CorruptDataError):
    """A key index that cannot be right: lookups through it must not answer."""

    repair = "rebuild it with `ledgerview verify --repair` (or compact the partition again)"

    def __init__(self, path: Path | str, key: bytes | None, reason: str) -> None:
        self.path = str(path)
        looking_up = f" (looking up key {key!r})" if key is not None else ""
        super().__init__(f"Key index {path}: {reason}{looking_up}. The index is damaged or from another format: "
                         f"{self.repair}.")


def _options() -> Options:
    """Raw keys and values; blocks not compressed: a lookup reads one 4 KiB block, and decompressing it cost
    more than half of a lookup (5 to 8 µs) once the index outgrew RocksDB's 8 MiB block cache."""
    options = Options(raw_mode=True)
    options.set_compression_type(DBCompressionType.none())
    return options


class KeyIndexWriter:
    """Writes a key index from sorted runs of (key, offset); keys are unique across all runs. With ``indexed``
    false it writes only the UNINDEXED_MARKER, and takes no runs."""

    def __init__(self, path: Path, *, indexed: bool = True) -> None:
        self.path = path
        self.indexed = indexed
        self._runs_folder = path / RUNS_FOLDER
        (self._runs_folder if indexed else path).mkdir(parents=True)
        self._runs: list[str] = []

    def add_sorted_run(self, keys: pa.Array, offsets: npt.NDArray[np.int64]) -> None:
        """Write one run: ``keys`` (binary, no nulls) in bytewise order, ``offsets`` in the same order."""
        if not self.indexed:
            raise ValueError(f"key index {self.path} is written without an index: it takes no runs")
        if not len(keys):
            return
        if len(self._runs) >= MAX_RUNS:
            raise ValueError(f"a key index holds at most {MAX_RUNS} runs")
        path = str(self._runs_folder / f"{len(self._runs):06d}.sst")
        writer = SstFileWriter(_options())
        writer.open(path)
        prefix = RUN.pack(len(self._runs))
        for first_key, group in packed_groups(keys, offsets):
            writer[prefix + first_key] = group
        writer.finish()
        fsync_file(Path(path))  # here, on the writer's thread, rather than all at the end in ``finish``
        self._runs.append(path)

    def finish(self) -> None:
        """Ingest the runs into a fresh database (the files are moved in), make it durable, close it; or write
        the marker of a ledger without an index."""
        if not self.indexed:
            marker = self.path / UNINDEXED_MARKER
            marker.touch(exist_ok=False)
            fsync_file(marker)
            fsync_folder(self.path)
            return
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


def packed_groups(keys: pa.Array, offsets: npt.NDArray[np.int64]) -> Iterator[tuple[bytes, bytes]]:
    """(first key, packed group) of each GROUP_KEYS consecutive keys, each packed from slices of three buffers
    made for the whole run at once."""
    count = len(keys)
    key_bounds = value_offsets(keys).astype(np.int64)
    starts = np.arange(0, count, GROUP_KEYS)
    ends = np.minimum(starts + GROUP_KEYS, count)
    # Each group's c + 1 bounds, relative to its first key: group g's are entries starts[g] + g to ends[g] + g.
    group_of = np.repeat(np.arange(len(starts)), ends - starts + 1)
    rows = np.arange(len(group_of)) - group_of
    bounds = memoryview((key_bounds[rows] - key_bounds[starts][group_of]).astype("<u4").tobytes())
    data = keys.buffers()[2]
    key_bytes = memoryview(data if data is not None else b"")
    offset_bytes = memoryview(np.asarray(offsets, ">i8").tobytes())
    # Only the groups' own key bounds as Python ints (a list of every key's would take 36 bytes a key).
    group_keys = zip(starts.tolist(), ends.tolist(), key_bounds[starts].tolist(), key_bounds[starts + 1].tolist(),
                     key_bounds[ends].tolist(), strict=True)
    for group, (start, end, first, first_end, last) in enumerate(group_keys):
        yield bytes(key_bytes[first:first_end]), b"".join((
            COUNT.pack(end - start), bounds[(start + group) * BOUND_BYTES : (end + group + 1) * BOUND_BYTES],
            key_bytes[first:last], offset_bytes[start * OFFSET_BYTES : end * OFFSET_BYTES]))


def _layout(group: bytes, path: Path | str, key: bytes,
            damaged: type[CorruptKeyIndexError] = CorruptKeyIndexError) -> tuple[int, int, int]:
    """(count, where the key bytes start, where the offsets start) of a packed group, checked against its size;
    raises ``damaged`` (the index's kind of error) when they disagree."""
    count = COUNT.unpack_from(group)[0] if len(group) >= COUNT.size else 0
    keys_start = COUNT.size + (count + 1) * BOUND_BYTES
    if not count or len(group) < keys_start:
        raise damaged(path, key, f"a group of {len(group)} bytes is too short for its keys")
    offsets_start = keys_start + BOUND.unpack_from(group, keys_start - BOUND_BYTES)[0]
    if len(group) != offsets_start + count * OFFSET_BYTES:
        raise damaged(path, key, f"a group of {len(group)} bytes is not what its {count} keys take")
    return count, keys_start, offsets_start


def offset_in_group(group: bytes, key: bytes, path: Path | str,
                    damaged: type[CorruptKeyIndexError] = CorruptKeyIndexError) -> int | None:
    """``key``'s offset if the group holds it. The key's bytes are looked for with ``bytes.find`` (a C scan of a few
    hundred bytes, where a binary search in Python took 5 µs) and a match counts only where a key of its length
    starts."""
    count, keys_start, offsets_start = _layout(group, path, key, damaged)
    bounds = struct.unpack_from(f"<{count + 1}I", group, COUNT.size)
    if not key:  # the smallest key: only ever a group's first
        return _offset_at(group, offsets_start, 0) if bounds[1] == 0 else None
    position = group.find(key, keys_start, offsets_start)
    while position >= 0:
        row = bisect.bisect_right(bounds, position - keys_start) - 1  # the last of the rows starting there
        if row < count and bounds[row] == position - keys_start and bounds[row + 1] - bounds[row] == len(key):
            return _offset_at(group, offsets_start, row)
        position = group.find(key, position + 1, offsets_start)
    return None


def _offset_at(group: bytes, offsets_start: int, row: int) -> int:
    offset: int = OFFSET.unpack_from(group, offsets_start + row * OFFSET_BYTES)[0]
    return offset


def _group_keys(group: bytes, path: Path, first_key: bytes) -> list[bytes]:
    count, keys_start, _ = _layout(group, path, first_key)
    bounds = struct.unpack_from(f"<{count + 1}I", group, COUNT.size)
    return [group[keys_start + bounds[row] : keys_start + bounds[row + 1]] for row in range(count)]


class KeyIndex:
    """A finished key index, opened read-only (any number of processes may do so at once).

    Damage is an error, never a missing key: RocksDB checks the checksum of every block it reads (SST files carry
    one per block) and fails the read, and opening checks that RocksDB's manifest names exactly the SST files
    the folder holds, at their sizes (a damaged manifest record is otherwise read as a torn tail and dropped,
    with the keys of its file). An index that cannot be opened raises its KeyIndexError on every read, so
    that its ledger stays readable. RocksDB's OPTIONS file is not read: the options are given."""

    damaged: type[CorruptKeyIndexError] = CorruptKeyIndexError
    """What damage found through it raises (its advice says how to rebuild it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: Rdict | None = None
        self._runs = 0
        self.damage: KeyIndexError | None = None
        """Why the index could not be opened (None: it was)."""
        self.indexed = not (path / UNINDEXED_MARKER).exists()
        """False for the folder of a ledger written without an index (UNINDEXED_MARKER): nothing to open."""
        if not self.indexed:
            return
        try:
            self._db = Rdict(str(path), _options(), column_families={}, access_type=AccessType.read_only())
        except Exception as error:  # rocksdict raises a bare Exception
            if not path.exists():
                raise FileNotFoundError(f"key index {path} is gone") from error
            unreadable = "(os error " in str(error)  # an I/O error of rocksdict's own files, not RocksDB's verdict
            self.damage = (UnreadableKeyIndexError(path, str(error)) if unreadable
                           else CorruptKeyIndexError(path, None, f"RocksDB cannot open it ({error})"))
            return
        try:
            self._check_files(self._db)
            last = self._db.iter()
            last.seek_to_last()
            self._runs = RUN.unpack(last.key()[: RUN.size])[0] + 1 if self._valid(last, None) else 0
        except CorruptKeyIndexError as damage:
            self.damage = damage
            self.close()

    def _check_files(self, db: Rdict) -> None:
        live = {file["name"].lstrip("/"): file["size"] for file in db.live_files()}
        held = {name: (self.path / name).stat().st_size for name in os.listdir(self.path) if name.endswith(".sst")}
        if live != held:
            raise CorruptKeyIndexError(self.path, None, f"its manifest names the files {sorted(live.items())}, the "
                                                        f"folder holds {sorted(held.items())}")

    def _iter(self) -> RdictIter:
        if not self.indexed:
            raise KeyIndexError(f"Key index {self.path} was not written: its topic had compaction.key.index false "
                                "when the ledger was compacted. Lookups in the ledger read its keys instead.")
        if self.damage is not None:
            raise self.damage
        assert self._db is not None
        return self._db.iter()

    def _valid(self, groups: RdictIter, key: bytes | None) -> bool:
        """Whether the iterator stands on an entry; an iterator that stopped on an error raises it."""
        if groups.valid():
            return True
        try:
            groups.status()
        except Exception as error:  # rocksdict raises a bare Exception: a block checksum mismatch, an I/O error
            raise CorruptKeyIndexError(self.path, key, f"RocksDB fails the read ({error})") from None
        return False

    def locate(self, key: bytes) -> int | None:
        """The offset of ``key``'s message in the ledger, or None."""
        groups = self._iter()
        for run in range(self._runs):
            prefix = RUN.pack(run)
            groups.seek_for_prev(prefix + key)
            if self._valid(groups, key) and groups.key()[: RUN.size] == prefix:
                offset = offset_in_group(groups.value(), key, self.path)
                if offset is not None:
                    return offset
        return None

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (run number + first key, packed group), in the index's order."""
        groups = self._iter()
        groups.seek_to_first()
        while self._valid(groups, None):
            entry, packed = groups.key(), groups.value()
            assert isinstance(entry, bytes) and isinstance(packed, bytes)  # raw mode
            yield entry, packed
            groups.next()

    def keys(self) -> Iterator[bytes]:
        """Every key, run by run, in bytewise order within a run."""
        for entry, packed in self.entries():
            yield from _group_keys(packed, self.path, entry[RUN.size :])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
