"""Phase one: which message of each key is the latest, within a memory budget, reading only keys, offsets and
whether the value is null.

Steps:

1. Survey the input from the batches' buffers, without touching the data: messages, keyed messages, shortest and
   longest key. Choose the key coding (compactor/key_codes.py: exact fixed-width codes, never a lossy hash).
2. A pass streams, batch by batch, (code, 2 * offset + (1 if the value is not null)) of its keyed messages into
   Arrow's hash aggregation, which keeps the largest number per key. Offsets only grow, so that number belongs to
   the key's latest message, and its low bit says whether that message is a tombstone. The aggregation's memory
   grows with the distinct keys it has seen (GROUP_BYTES_PER_KEY beyond the code, measured; once per thread
   when threaded), not with the messages.
3. If even one distinct key per keyed message would fit the budget, one threaded pass over everything. Otherwise
   one single-threaded pass, *watched*: before each batch it reads how much Arrow's memory pool holds, and past
   WATCHED_SHARE of the budget (the hash table may grow once more) it stops. Most inputs repeat their keys
   enough to finish here.
4. A stopped pass is split by key hash (hash mod m = r becomes hash mod m * k = r + m * j for j < k, so passes
   already done stay valid), with k from the distinct keys it would have held had its growth gone on as it went.
   Every key then falls in exactly one finished pass. The hashes are computed once, into a memory-mapped file.
5. The survivors of a pass are the latest messages that are not tombstones. Their keys and offsets go to
   ``on_pass`` (the key index is built from them); their offsets, sorted, are kept, and spilled to a
   memory-mapped file when there are several passes, so memory holds one pass at a time.
6. Keyless messages survive only when ``compaction.retain.null.key`` is set (they have no key to be replaced by).

The result is a set of sorted offset arrays; phase two walks the input again and keeps exactly those offsets.
The passes change how much memory and time phase one takes, never its result.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.acero as acero

from compactor.key_codes import KeyCoding

InputBatches = Callable[[], Iterable[pa.RecordBatch]]
MAX_PASSES: Final = 4096
"""A budget too small for even this many passes is not honoured: each pass reads the whole input again."""
GROUP_BYTES_PER_KEY: Final = 100
"""Peak bytes of Arrow's hash aggregation per distinct key beyond the key's code: hash table, group state, the
largest number, the output (measured on 1M and 6M distinct 10-byte keys: 108 and 98 bytes at the peak)."""
WATCHED_SHARE: Final = 0.6
"""A watched pass stops when the memory pool has grown past this share of the budget: the hash table may still
grow once more (measured: the peak is at most 1.6 times the last reading)."""
SPLIT_MARGIN: Final = 1.25
AGGREGATE_BATCH_MESSAGES: Final = 1 << 15
"""Keyed messages handed to the aggregation at a time: it costs a third less in batches this large than in the
log's (often small) ones; larger ones gain little and make the aggregation's read-ahead queue hold more."""
MIN_WATCHED_BATCH_MESSAGES: Final = 256
_CODE_TYPE: Final = pa.int64()


@dataclass(frozen=True)
class LiveKeys:
    """The survivors of one pass: their key codes and offsets, in no particular order."""

    coding: KeyCoding
    codes: pa.Array
    offsets: npt.NDArray[np.int64]

    def sorted_by_key(self) -> tuple[pa.Array, npt.NDArray[np.int64]]:
        """The keys (binary) in bytewise order, and their offsets in the same order."""
        order = self.coding.sort_order(self.codes)
        return self.coding.decode(self.codes.take(pa.array(order))), self.offsets[order]


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


@dataclass(frozen=True)
class Part:
    """The keys of one pass: those whose hash mod ``modulus`` is ``residue``."""

    modulus: int
    residue: int

    def split(self, ways: int) -> list[Part]:
        return [Part(self.modulus * ways, self.residue + self.modulus * j) for j in range(ways)]


class _Overflow(Exception):
    """A watched pass stopped: its hash table would outgrow the budget."""

    def __init__(self, scanned: int) -> None:
        super().__init__(f"stopped after {scanned} keyed messages")
        self.scanned = scanned


@dataclass
class Survey:
    messages: int = 0
    keyed: int = 0
    key_bytes: int = 0
    shortest: int = 0
    longest: int = 0

    def coding(self) -> KeyCoding:
        return KeyCoding.for_lengths(self.shortest, self.longest)


def find_survivors(input_batches: InputBatches, *, memory_budget_bytes: int, retain_null_key: bool,
                   on_pass: Callable[[LiveKeys], None] | None = None) -> Survivors:
    survey = _survey(input_batches())
    coding = survey.coding()
    per_key = math.ceil(coding.bytes_per_key(survey.key_bytes / max(1, survey.keyed))) + GROUP_BYTES_PER_KEY
    threaded = survey.keyed * per_key * max(1, pa.cpu_count()) <= memory_budget_bytes
    limit = None if threaded else int(memory_budget_bytes * WATCHED_SHARE)
    survivors = Survivors(messages_read=survey.messages)
    hashes: np.ndarray | None = None
    todo = [Part(1, 0)]
    while todo:
        part = todo.pop()
        watched = limit if part.modulus < MAX_PASSES else None
        try:
            live = _latest_live(input_batches(), coding, part, hashes, limit=watched, per_key=per_key,
                                threaded=threaded)
        except _Overflow as overflow:
            if survivors.spill_folder is None:
                survivors.spill_folder = tempfile.TemporaryDirectory(prefix="ledgerview-compaction-")
            if hashes is None:
                hashes = _hash_file(input_batches(), coding, survey.keyed, Path(survivors.spill_folder.name))
            ways = max(2, math.ceil(SPLIT_MARGIN * survey.keyed / max(1, overflow.scanned)))
            todo.extend(part.split(min(ways, max(2, MAX_PASSES // part.modulus))))
            continue
        offsets = np.sort(live.offsets)
        if on_pass is not None:
            on_pass(live)
        del live
        if survivors.spill_folder is not None:
            path = Path(survivors.spill_folder.name) / f"pass-{survivors.passes}.npy"
            np.save(path, offsets)
            del offsets
            offsets = np.load(path, mmap_mode="r")
        survivors.arrays.append(offsets)
        survivors.passes += 1
    if retain_null_key:
        keyless = [_keyless_offsets(batch) for batch in input_batches()]
        if keyless:
            survivors.arrays.append(np.sort(np.concatenate(keyless)))
    return survivors


def _survey(batches: Iterable[pa.RecordBatch]) -> Survey:
    survey = Survey(shortest=2**31)
    for batch in batches:
        survey.messages += batch.num_rows
        keys = batch.column(2)
        if keys.null_count == len(keys):
            continue
        _, offsets_buffer, _ = keys.buffers()
        offsets = np.frombuffer(offsets_buffer, np.int32, len(keys) + 1, keys.offset * 4)
        lengths = np.diff(offsets)
        if keys.null_count:
            lengths = lengths[keys.is_valid().to_numpy(zero_copy_only=False)]
        survey.keyed += len(lengths)
        survey.key_bytes += int(offsets[-1] - offsets[0])
        survey.shortest = min(survey.shortest, int(lengths.min()))
        survey.longest = max(survey.longest, int(lengths.max()))
    survey.shortest = min(survey.shortest, survey.longest)
    return survey


def _hash_file(batches: Iterable[pa.RecordBatch], coding: KeyCoding, keyed: int, folder: Path) -> np.ndarray:
    """The hash of every keyed message's key, in input order, computed once into a memory-mapped file (8 bytes
    a message) so that later passes only compare."""
    hashes = np.lib.format.open_memmap(folder / "hashes.npy", mode="w+", dtype=np.uint64, shape=(keyed,))
    row = 0
    for batch in batches:
        keys, _ = _keyed(batch)
        hashes[row : row + len(keys)] = coding.hashes(coding.encode(keys))
        row += len(keys)
    hashes.flush()
    return hashes


def _keyed(batch: pa.RecordBatch) -> tuple[pa.Array, npt.NDArray[np.int64]]:
    """The keys of the keyed messages of a batch and their numbers 2 * offset + (1 if the value is not null)."""
    keys = batch.column(2)
    codes = batch.column(0).to_numpy() * 2 + batch.column(3).is_valid().to_numpy(zero_copy_only=False)
    if keys.null_count:
        keyed = keys.is_valid()
        return keys.filter(keyed), codes[keyed.to_numpy(zero_copy_only=False)]
    return keys, codes


def _latest_live(batches: Iterable[pa.RecordBatch], coding: KeyCoding, part: Part, hashes: np.ndarray | None, *,
                 limit: int | None, per_key: int, threaded: bool) -> LiveKeys:
    """Steps 2 to 5 for one pass; raises _Overflow when watched (``limit``) and the pool outgrows the limit."""
    schema = pa.schema([("key", coding.arrow_type), ("code", _CODE_TYPE)])
    pool = pa.default_memory_pool()
    start_bytes = pool.bytes_allocated()
    chunk_rows = AGGREGATE_BATCH_MESSAGES
    if limit is not None:  # watched: batches small enough for the readings between them to catch the growth
        chunk_rows = min(chunk_rows, max(MIN_WATCHED_BATCH_MESSAGES, limit // (4 * per_key)))

    def pieces() -> Iterator[pa.RecordBatch]:
        scanned = held = 0
        grouped: list[pa.Array] = []
        numbers: list[np.ndarray] = []
        for batch in batches:
            keys, codes = _keyed(batch)
            mine_keys = coding.encode(keys)
            if hashes is not None and part.modulus > 1:
                mine = hashes[scanned : scanned + len(keys)] % np.uint64(part.modulus) == part.residue
                mine_keys, codes = mine_keys.filter(pa.array(mine)), codes[mine]
            scanned += len(keys)
            for start in range(0, len(codes), chunk_rows):
                grouped.append(mine_keys.slice(start, chunk_rows))
                numbers.append(codes[start : start + chunk_rows])
                held += len(numbers[-1])
                if held >= chunk_rows:
                    if limit is not None and pool.bytes_allocated() - start_bytes > limit:
                        raise _Overflow(scanned)
                    yield _piece(grouped, numbers, schema)
                    grouped, numbers, held = [], [], 0
        if held:
            yield _piece(grouped, numbers, schema)

    source = acero.Declaration("record_batch_reader_source", acero.RecordBatchReaderSourceNodeOptions(
        pa.RecordBatchReader.from_batches(schema, pieces())))
    aggregate = acero.Declaration("aggregate", acero.AggregateNodeOptions(
        [("code", "hash_max", None, "latest")], keys=["key"]))
    latest_table = acero.Declaration.from_sequence([source, aggregate]).to_table(use_threads=threaded)
    latest = latest_table.column("latest").to_numpy()
    live = (latest & 1) == 1
    codes = latest_table.column("key").combine_chunks().filter(pa.array(live))
    return LiveKeys(coding, codes, latest[live] >> 1)


def _piece(grouped: list[pa.Array], numbers: list[np.ndarray], schema: pa.Schema) -> pa.RecordBatch:
    return pa.record_batch([pa.concat_arrays(grouped), pa.array(np.concatenate(numbers), _CODE_TYPE)],
                           schema=schema)


def _keyless_offsets(batch: pa.RecordBatch) -> np.ndarray:
    keyless = batch.column(2).is_null().to_numpy(zero_copy_only=False)
    offsets: np.ndarray = batch.column(0).to_numpy()[keyless]
    return offsets
