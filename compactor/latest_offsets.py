"""Phase one: which message of each key is the latest, within a memory budget, reading only keys and offsets.

Steps:

1. Size the input: key bytes and message count, read from the batches' buffers without touching the data.
2. Choose the number of passes P so that one pass's keys, codes and hash table fit the budget
   (``compaction.memory.bytes``). P = 1 for most partitions.
3. For each pass p, gather (key, code) of the keyed messages whose key hashes (Kafka's murmur2, computed once and
   kept in a memory-mapped file) to p mod P, where
   code = 2 * offset + (1 if the value is not null). Offsets only grow, so the largest code of a key belongs to its
   latest message, and its low bit says whether that message is a tombstone. Group by exact key bytes (never a
   hash of them) and keep the largest code.
4. The survivors of a pass are the latest messages that are not tombstones: their offsets, sorted. Past the
   first pass they are spilled to a file and memory-mapped, so memory holds one pass at a time.
5. Keyless messages survive only when ``compaction.retain.null.key`` is set (they have no key to be replaced by).

The result is a set of sorted offset arrays; phase two walks the input again and keeps exactly those offsets.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage.partitioner import murmur2

InputBatches = Callable[[], Iterable[pa.RecordBatch]]
MAX_PASSES = 4096
"""A budget too small for even this many passes is not honoured: each pass reads the whole input again."""
BYTES_PER_KEYED_MESSAGE = 48
"""Working memory per message in one pass beyond its key bytes: code, key offsets, hash-table entry (measured)."""
KEY_BYTES_FACTOR = 2
"""The key bytes are held twice at the peak: the gathered keys and the hash table's copy of the distinct ones."""


@dataclass
class Survivors:
    """Offsets of the messages that stay, as sorted arrays (one per pass), and what phase one counted."""

    arrays: list[np.ndarray] = field(default_factory=list)
    messages_read: int = 0
    passes: int = 0
    spill_folder: tempfile.TemporaryDirectory[str] | None = None

    @property
    def count(self) -> int:
        return sum(len(array) for array in self.arrays)

    def within(self, first_offset: int, last_offset: int) -> np.ndarray:
        """The surviving offsets in [first_offset, last_offset], sorted."""
        parts = []
        for array in self.arrays:
            lower = np.searchsorted(array, first_offset, side="left")
            upper = np.searchsorted(array, last_offset, side="right")
            if upper > lower:
                parts.append(np.asarray(array[lower:upper]))
        if not parts:
            return np.empty(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))

    def close(self) -> None:
        self.arrays = []
        if self.spill_folder is not None:
            self.spill_folder.cleanup()


def find_survivors(input_batches: InputBatches, *, memory_budget_bytes: int, retain_null_key: bool) -> Survivors:
    messages, key_bytes = _size(input_batches())
    needed = key_bytes * KEY_BYTES_FACTOR + messages * BYTES_PER_KEYED_MESSAGE
    passes = min(MAX_PASSES, max(1, math.ceil(needed / memory_budget_bytes)))
    survivors = Survivors(messages_read=messages, passes=passes)
    buckets = None
    if passes > 1:
        survivors.spill_folder = tempfile.TemporaryDirectory(prefix="ledgerview-compaction-")
        buckets = _spill_buckets(input_batches(), messages, passes, Path(survivors.spill_folder.name))
    for part in range(passes):
        offsets = _latest_live_offsets(input_batches(), part, buckets)
        if survivors.spill_folder is not None:
            path = Path(survivors.spill_folder.name) / f"pass-{part}.npy"
            np.save(path, offsets)
            del offsets
            offsets = np.load(path, mmap_mode="r")
        survivors.arrays.append(offsets)
    if retain_null_key:
        keyless = [_keyless_offsets(batch) for batch in input_batches()]
        if keyless:
            survivors.arrays.append(np.concatenate(keyless))
    return survivors


def _size(batches: Iterable[pa.RecordBatch]) -> tuple[int, int]:
    messages = key_bytes = 0
    for batch in batches:
        messages += batch.num_rows
        keys = batch.column(2)
        key_bytes += keys.buffers()[2].size if keys.buffers()[2] is not None else 0
    return messages, key_bytes


def _spill_buckets(batches: Iterable[pa.RecordBatch], messages: int, passes: int, folder: Path) -> np.ndarray:
    """The pass of every input message (murmur2 of its key mod P), hashed once and kept in a memory-mapped file
    (two bytes a message) so that later passes only compare."""
    buckets = np.lib.format.open_memmap(folder / "buckets.npy", mode="w+", dtype=np.uint16, shape=(messages,))
    row = 0
    for batch in batches:
        buckets[row : row + batch.num_rows] = murmur2(batch.column(2)).view(np.uint32) % passes
        row += batch.num_rows
    buckets.flush()
    return buckets


def _keyed_columns(batches: Iterable[pa.RecordBatch], part: int, buckets: np.ndarray | None) -> (
    Iterator[tuple[pa.Array, np.ndarray]]
):
    """(keys, codes) of the keyed messages of each batch that belong to this pass (all of them without buckets)."""
    row = 0
    for batch in batches:
        keys = batch.column(2)
        codes = batch.column(0).to_numpy() * 2 + batch.column(3).is_valid().to_numpy(zero_copy_only=False)
        mine = keys.is_valid().to_numpy(zero_copy_only=False) if keys.null_count else None
        if buckets is not None:
            in_part = buckets[row : row + batch.num_rows] == part
            mine = in_part if mine is None else mine & in_part
        row += batch.num_rows
        if mine is not None:
            keys, codes = keys.filter(pa.array(mine)), codes[mine]
        if len(keys):
            yield keys, codes


def _latest_live_offsets(batches: Iterable[pa.RecordBatch], part: int, buckets: np.ndarray | None) -> np.ndarray:
    columns = list(_keyed_columns(batches, part, buckets))
    if not columns:
        return np.empty(0, dtype=np.int64)
    table = pa.table({
        "key": pa.chunked_array([keys for keys, _ in columns], pa.binary()),
        "code": pa.chunked_array([pa.array(codes) for _, codes in columns], pa.int64()),
    })
    del columns
    grouped = table.group_by("key", use_threads=False).aggregate([("code", "max")])
    latest: np.ndarray = grouped.column("code_max").to_numpy()
    del table
    live: np.ndarray = latest[(latest & 1) == 1] >> 1
    live.sort()
    return live


def _keyless_offsets(batch: pa.RecordBatch) -> np.ndarray:
    keyless = batch.column(2).is_null().to_numpy(zero_copy_only=False)
    offsets: np.ndarray = batch.column(0).to_numpy()[keyless]
    return offsets
