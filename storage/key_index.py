"""The key index of a compacted ledger: a rocksdict (RocksDB) map from key bytes to the offset of its message.

Values are 8 bytes, the message's offset as a big-endian int64; the ledger finds the batch holding an offset
from its batch headers, so a point lookup is one RocksDB get, a bisect and one zero-copy batch decode, never a
scan. The index is bulk-loaded: each sorted run of keys is written as an SST file with RocksDB's SstFileWriter
and the files are ingested into a fresh database at ``finish`` (no memtable, no write-ahead log, no compaction);
the ledger is not published until that is done. Afterwards it is opened read-only.
"""

from __future__ import annotations

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

LOCATION: Final = struct.Struct(">q")
RUN_KEYS: Final = 65_536
"""Keys turned into Python bytes at a time while a run is written (bounds the memory of the loop)."""
RUNS_FOLDER: Final = "runs"


class CorruptKeyIndexError(LedgerviewError):
    def __init__(self, path: Path, key: bytes, value: bytes) -> None:
        super().__init__(f"Key index {path} holds a {len(value)}-byte value for key {key!r}; every value is an "
                         f"{LOCATION.size}-byte offset. The index is damaged or from another format: compact again.")


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
        path = str(self._runs_folder / f"{len(self._runs):06d}.sst")
        writer = SstFileWriter(_options())
        writer.open(path)
        values = np.ascontiguousarray(offsets, dtype=">i8").view(np.uint8).reshape(-1, LOCATION.size)
        for start in range(0, len(keys), RUN_KEYS):
            chunk = keys.slice(start, RUN_KEYS)
            for key, value in zip(_key_list(chunk), _bytes_list(values[start : start + RUN_KEYS]), strict=True):
                writer[key] = value
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


def _key_list(keys: pa.Array) -> list[bytes]:
    """The keys as Python bytes; keys of one length go through numpy, several times faster than to_pylist."""
    data = keys.buffers()[2]
    offsets = value_offsets(keys)
    width = int(offsets[1] - offsets[0])
    if width == 0 or data is None or int(offsets[-1] - offsets[0]) != width * len(keys):
        return list(keys.to_pylist())
    if not np.all(np.diff(offsets) == width):
        return list(keys.to_pylist())
    matrix = np.frombuffer(data, np.uint8, width * len(keys), int(offsets[0])).reshape(len(keys), width)
    return _bytes_list(matrix)


def _bytes_list(matrix: npt.NDArray[np.uint8]) -> list[bytes]:
    """Each row of a (rows, width) byte matrix as bytes. numpy's "S" strings drop trailing zero bytes, so the rows
    that end in one are made again."""
    rows: list[bytes] = np.ascontiguousarray(matrix).view(f"S{matrix.shape[1]}").ravel().tolist()
    for row in np.flatnonzero(matrix[:, -1] == 0).tolist():
        rows[row] = matrix[row].tobytes()
    return rows


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

    def locate(self, key: bytes) -> int | None:
        """The offset of ``key``'s message in the ledger, or None."""
        found = self._db.get(key)
        if found is None:
            return None
        if len(found) != LOCATION.size:
            raise CorruptKeyIndexError(self.path, key, found)
        offset: int = LOCATION.unpack(found)[0]
        return offset

    def keys(self) -> Iterator[bytes]:
        yield from self._db.keys()

    def close(self) -> None:
        self._db.close()
