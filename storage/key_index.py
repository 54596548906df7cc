"""The key index of a compacted ledger: a rocksdict (RocksDB) map from key bytes to where its message sits.

Values are 12 bytes, ``(int64 batch position in the ledger file, int32 row in that batch)``, so a point lookup is
one RocksDB get and one zero-copy batch decode, never a scan. The index is written once, with the write-ahead log
off (the ledger is not published until the index is flushed), and opened read-only afterwards.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

LOCATION = struct.Struct("<qi")
MAX_WRITE_BUFFER_BYTES = 32 * 1024 * 1024
MIN_WRITE_BUFFER_BYTES = 256 * 1024


def _options(write_buffer_bytes: int = MAX_WRITE_BUFFER_BYTES) -> Options:
    options = Options(raw_mode=True)
    options.set_write_buffer_size(write_buffer_bytes)
    options.set_max_write_buffer_number(2)
    return options


class KeyIndexWriter:
    def __init__(self, path: Path, *, memory_budget_bytes: int) -> None:
        """``memory_budget_bytes`` bounds RocksDB's memtables (two of a quarter of it each, within limits)."""
        self.path = path
        write_buffer = min(MAX_WRITE_BUFFER_BYTES, max(MIN_WRITE_BUFFER_BYTES, memory_budget_bytes // 4))
        self._db = Rdict(str(path), _options(write_buffer))
        write_options = WriteOptions()
        write_options.disable_wal = True  # type: ignore[assignment,method-assign]  # a property; the stub is wrong
        self._db.set_write_options(write_options)

    def add(self, keys: pa.Array, position: int) -> None:
        """Index the keyed rows of the batch written at ``position`` (keys in row order; nulls skipped)."""
        rows = np.arange(len(keys), dtype=np.int32)
        valid = keys.is_valid().to_numpy(zero_copy_only=False)
        key_list = keys.to_pylist()
        batch = WriteBatch(raw_mode=True)
        for row in rows[valid].tolist():
            batch.put(key_list[row], LOCATION.pack(position, row))
        self._db.write(batch)

    def finish(self) -> None:
        """Flush everything to SST files (they are fsynced by RocksDB) and close."""
        self._db.flush(wait=True)
        self._db.close()

    def abort(self) -> None:
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)


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

    def locate(self, key: bytes) -> tuple[int, int] | None:
        found = self._db.get(key)
        if found is None:
            return None
        position, row = LOCATION.unpack(found)
        return position, row

    def keys(self) -> Iterator[bytes]:
        yield from self._db.keys()

    def close(self) -> None:
        self._db.close()
