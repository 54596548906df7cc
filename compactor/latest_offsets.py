"""Phase one: which message of each key is the latest, within a memory budget, reading only keys, offsets and
whether the value is null.

Steps:

1. The key coding (compactor/key_codes.py: exact fixed-width codes, uint64 words where they fit, when all keys
   have one length; never a lossy hash) is chosen from the first keyed batch; a later batch it refuses widens it
   and phase one starts again (this can only happen before any pass has finished: the first pass or the hashing
   reads it all).
2. A pass streams, batch by batch, (code, 2 * offset + (1 if the value is not null)) of its keyed messages into
   Arrow's hash aggregation, which keeps the largest number per key. Offsets only grow, so that number belongs to
   the key's latest message, and its low bit says whether that message is a tombstone. The aggregation's memory
   grows with the distinct keys it has seen (GROUP_BYTES_PER_KEY beyond the code, measured; once per thread
   when threaded), not with the messages. A pass reads its input (CRC checks included) and cuts it into the
   aggregation's pieces on another thread (compactor/prefetch.py), so that work overlaps the grouping.
3. If even one distinct key per message would fit the budget, one threaded pass over everything. Otherwise
   one single-threaded pass, *watched*: before each batch it reads how much Arrow's memory pool holds, and past
   WATCHED_SHARE of the budget (the hash table may grow once more) it stops. Most inputs repeat their keys
   enough to finish here.
4. A stopped pass is split by key hash (hash mod m = r becomes hash mod m * k = r + m * j for j < k, so passes
   already done stay valid). The hashes (and fixed-width codes) are spilled once to memory-mapped files
   (compactor/spill.py), which later passes read instead of the input; k comes from an estimate
   of the distinct keys made from them (the first split), or from the distinct keys the pass would have held had
   its growth gone on as it went (a pass that still overflows). Every key falls in exactly one finished pass.
5. The survivors of a pass are the latest messages that are not tombstones. Their keys and offsets go to
   ``on_pass`` (the key index is built from them); their offsets, sorted, are kept, and spilled to a
   memory-mapped file when there are several passes, so memory holds one pass at a time.
6. Keyless messages survive only when ``compaction.retain.null.key`` is set (they have no key to be replaced by).

The result is a set of sorted offset arrays; phase two walks the input again and keeps exactly those offsets.
The passes change how much memory and time phase one takes, never its result.
"""

from __future__ import annotations

import dataclasses
import functools
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

from compactor.key_codes import KeyCoding, KeysRefused
from compactor.passes import Part, Piece, Pieces, Scan, cut_pieces, from_batches, keyed_numbers
from compactor.prefetch import prefetched
from compactor.spill import Spill, distinct_keys, from_spill, write_spill

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
AGGREGATE_BATCH_MESSAGES: Final = 1 << 17
"""Keyed messages handed to the aggregation at a time. With fixed_size_binary keys, grouping 10M messages cost
0.59 s in pieces of 32k and 0.41 s in pieces of 128k; with uint64 words the aggregation alone barely cares (0.43 to
0.47 s from 16k to 128k), but fewer hand-overs between phase one's threads still help a little (whole Zipf
compactions: 0.96 to 1.24 s with 32k pieces, 0.92 to 1.07 s with 128k, three runs each).
A watched pass uses smaller ones with a small budget and once the pool nears its limit."""
MIN_WATCHED_BATCH_MESSAGES: Final = 256
NEAR_LIMIT_BATCH_MESSAGES: Final = 1 << 15
"""Piece size of a watched pass past a quarter of its limit (10M distinct keys at 256 MiB peaked at 0.62 GiB
anonymous memory in pieces of 128k throughout, 0.52 GiB switching at half the limit, 0.39 GiB at a quarter)."""
PREFETCH_PIECES: Final = 4
"""Pieces made ahead of the aggregation (each 1.5 times AGGREGATE_BATCH_MESSAGES codes and numbers at most)."""
_CODE_TYPE: Final = pa.int64()


@dataclass(frozen=True)
class LiveKeys:
    """The survivors of one pass: their key codes and offsets, in no particular order."""

    coding: KeyCoding
    codes: pa.Array
    offsets: npt.NDArray[np.int64]
    last: bool = True
    """No pass follows this one (when one does, its aggregation and this pass's index run should not both hold
    memory at once)."""

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


class _Overflow(Exception):
    """A watched pass stopped: its hash table would outgrow the budget."""

    def __init__(self, scanned: int) -> None:
        super().__init__(f"stopped after {scanned} keyed messages")
        self.scanned = scanned


def find_survivors(input_batches: InputBatches, *, messages_bound: int, memory_budget_bytes: int,
                   retain_null_key: bool, on_pass: Callable[[LiveKeys], None] | None = None) -> Survivors:
    """``messages_bound``: at least the number of messages ``input_batches`` yields."""
    keyed = (keys for keys, _ in (keyed_numbers([batch]) for batch in input_batches()) if len(keys))
    first_keys = next(keyed, pa.array([], pa.binary()))
    coding = KeyCoding.for_keys(first_keys)
    while True:
        try:
            return _find(input_batches, coding, first_keys, messages_bound=messages_bound,
                         memory_budget_bytes=memory_budget_bytes, retain_null_key=retain_null_key, on_pass=on_pass)
        except KeysRefused as changed:
            coding = coding.widened(changed.refused)


def _find(input_batches: InputBatches, coding: KeyCoding, first_keys: pa.Array, *, messages_bound: int,
          memory_budget_bytes: int, retain_null_key: bool, on_pass: Callable[[LiveKeys], None] | None) -> Survivors:
    mean_key_bytes = first_keys.nbytes / max(1, len(first_keys))
    per_key = math.ceil(coding.bytes_per_key(mean_key_bytes)) + GROUP_BYTES_PER_KEY
    threaded = messages_bound * per_key * max(1, pa.cpu_count()) <= memory_budget_bytes
    limit = None if threaded else int(memory_budget_bytes * WATCHED_SHARE)
    survivors = Survivors()
    spill: Spill | None = None
    distinct = 0
    todo = [Part(1, 0)]
    try:
        while todo:
            part = todo.pop()
            watched = limit if part.modulus < MAX_PASSES else None
            rows = _chunk_rows(watched, per_key)
            try:
                if spill is not None and spill.codes is not None:
                    read = functools.partial(from_spill, spill, coding, part, rows)
                else:
                    hashes = spill.hashes if spill is not None else None
                    read = functools.partial(from_batches, input_batches(), coding, part, hashes)
                live, survivors.messages_read = _latest_live(read, coding, limit=watched, chunk_rows=rows,
                                                             threaded=threaded)
            except _Overflow as overflow:
                assert watched is not None  # only a watched pass overflows
                if survivors.spill_folder is None:
                    survivors.spill_folder = tempfile.TemporaryDirectory(prefix="ledgerview-compaction-")
                if spill is None:
                    spill = write_spill(input_batches(), coding, Path(survivors.spill_folder.name))
                    distinct = distinct_keys(spill.hashes)
                if part.modulus == 1:
                    # The estimate of distinct keys is sharper than the growth so far, which lags: the aggregation
                    # reads pieces ahead of the readings, so a late reading would choose too few ways.
                    ways = math.ceil(SPLIT_MARGIN * distinct * per_key / watched)
                else:
                    ways = math.ceil(SPLIT_MARGIN * len(spill.hashes) / max(1, overflow.scanned))
                todo.extend(part.split(min(max(2, ways), max(2, MAX_PASSES // part.modulus))))
                continue
            offsets = np.sort(live.offsets)
            if on_pass is not None:
                on_pass(dataclasses.replace(live, last=not todo))
            del live
            if survivors.spill_folder is not None:
                path = Path(survivors.spill_folder.name) / f"pass-{survivors.passes}.npy"
                np.save(path, offsets)
                del offsets
                offsets = np.load(path, mmap_mode="r")
            survivors.arrays.append(offsets)
            survivors.passes += 1
    except BaseException:
        survivors.close()
        raise
    if retain_null_key:
        keyless = [_keyless_offsets(batch) for batch in input_batches()]
        if keyless:
            survivors.arrays.append(np.sort(np.concatenate(keyless)))
    return survivors


def _chunk_rows(limit: int | None, per_key: int) -> int:
    """Messages handed to the aggregation at a time; watched, few enough for the readings between batches to
    catch the growth."""
    if limit is None:
        return AGGREGATE_BATCH_MESSAGES
    return min(AGGREGATE_BATCH_MESSAGES, max(MIN_WATCHED_BATCH_MESSAGES, limit // (4 * per_key)))


def _latest_live(read: Callable[[Scan], Pieces], coding: KeyCoding, *, limit: int | None, chunk_rows: int,
                 threaded: bool) -> tuple[LiveKeys, int]:
    """Steps 2 to 5 for one pass over what ``read(scan)`` yields, and the messages read; raises _Overflow when
    watched (``limit``) and the pool outgrows the limit."""
    schema = pa.schema([("key", coding.arrow_type), ("code", _CODE_TYPE)])
    pool = pa.default_memory_pool()
    start_bytes = pool.bytes_allocated()
    scan = Scan()

    def piece_rows() -> int:
        """Past a quarter of the limit, smaller pieces: the readings between them must catch the growth in time,
        yet the aggregation reads ahead of them and its hash table doubles within a piece."""
        if limit is not None and pool.bytes_allocated() - start_bytes > limit // 4:
            return min(chunk_rows, NEAR_LIMIT_BATCH_MESSAGES)
        return chunk_rows

    def prepared() -> Iterator[tuple[pa.RecordBatch, int]]:
        """Pieces for the aggregation, each with how many keyed messages the scan had read when it was made."""
        for parts in cut_pieces(read(scan), piece_rows):
            yield _piece(parts, schema), scan.keyed

    def pieces() -> Iterator[pa.RecordBatch]:
        # Reading, checking and cutting the input into pieces runs on another core than the aggregation: with
        # one thread, Acero would wait for each piece to be made before it groups it.
        ready = prefetched(prepared(), depth=PREFETCH_PIECES)
        try:
            for piece, keyed in ready:
                if limit is not None and pool.bytes_allocated() - start_bytes > limit:
                    raise _Overflow(keyed)
                yield piece
        finally:
            ready.close()

    source = acero.Declaration("record_batch_reader_source", acero.RecordBatchReaderSourceNodeOptions(
        pa.RecordBatchReader.from_batches(schema, pieces())))
    aggregate = acero.Declaration("aggregate", acero.AggregateNodeOptions(
        [("code", "hash_max", None, "latest")], keys=["key"]))
    latest_table = acero.Declaration.from_sequence([source, aggregate]).to_table(use_threads=threaded)
    latest = latest_table.column("latest").to_numpy()
    live = (latest & 1) == 1
    codes = latest_table.column("key").combine_chunks().filter(pa.array(live))
    return LiveKeys(coding, codes, latest[live] >> 1), scan.messages


def _piece(parts: list[Piece], schema: pa.Schema) -> pa.RecordBatch:
    if len(parts) == 1:
        codes, numbers = parts[0]
        return pa.record_batch([codes, pa.array(numbers, _CODE_TYPE)], schema=schema)
    return pa.record_batch([pa.concat_arrays([codes for codes, _ in parts]),
                            pa.array(np.concatenate([numbers for _, numbers in parts]), _CODE_TYPE)], schema=schema)


def _keyless_offsets(batch: pa.RecordBatch) -> np.ndarray:
    keyless = batch.column(2).is_null().to_numpy(zero_copy_only=False)
    offsets: np.ndarray = batch.column(0).to_numpy()[keyless]
    return offsets
