"""Phase one: which message of each key is the latest, within a memory budget, reading only keys, offsets and
whether the value is null. A hash-partitioned (Grace) aggregation in one read of the input:

1. The key coding (compactor/key_codes.py: exact fixed-width codes, uint64 words where they fit, when all keys
   have one length; never a lossy hash) is chosen from the first keyed batch; a later batch it refuses widens it
   and phase one starts again.
2. The input is read on this thread a group of batches at a time (CRC checks included); worker threads turn each
   group into (code, number) pairs cut into buckets by key hash (compactor/buckets.py), one pair per key when the
   group's keys repeat often. The number is 2 * offset + (1 if the value is not null), so a key's largest number
   is its latest message.
3. The pairs are held by bucket. When they pass HELD_SHARE of the budget, each bucket is reduced to one pair per
   key (its largest number: Arrow's hash kernel and numpy, a bucket per worker at a time). When reducing no longer
   frees enough (more distinct keys than the budget holds), the reduced buckets are spilled to a memory-mapped
   file (compactor/spill.py) and memory starts empty again.
4. At the end each bucket is finished alone (its spills and what is held, aggregated): its latest messages that
   are not tombstones survive. Buckets are gathered into *runs* that fit the budget (see RUN_SHARE); each run's
   keys and offsets go to ``on_pass`` (the key index is written from them, one sorted run each) and its offsets,
   sorted, are kept (spilled to a memory-mapped file when there are several runs). When asked
   (``tombstone_keys``), the keys whose latest message is a tombstone go to ``on_pass`` with the run too (a layered
   run marks the view's rows of those keys replaced: compactor/replaced_rows.py). Every key is in exactly one
   bucket, so runs hold disjoint keys.
5. Keyless messages survive only when ``compaction.retain.null.key`` is set (they have no key to be replaced by);
   the workers collect their offsets in step 2, so the input is read once either way.

The result is a set of sorted offset arrays; phase two walks the input again and keeps exactly those offsets.
The budget changes how much memory and time phase one takes, never its result.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.buckets import HeldBuckets, Pairs, bucketed, keyed_numbers, latest_per_key
from compactor.key_codes import KeyCoding, KeysRefused
from compactor.parallel import ordered_map
from compactor.spill import SpilledBuckets
from storage.batch_groups import grouped
from storage.dropped_tombstones import Ranges, with_offsets

InputBatches = Callable[[], Iterable[pa.RecordBatch]]
T = TypeVar("T")
R = TypeVar("R")

HELD_SHARE: Final = 0.5
"""Pairs held may take this share of the budget; the rest is for the aggregation of one bucket per worker and the
pairs being made ahead."""
SPILL_SHARE: Final = 0.5
"""After a reduction, pairs still over this share of what may be held are spilled: reducing again soon would
free little."""
MAX_BUCKET_BITS: Final = 12
CACHE_BUCKET_MESSAGES: Final = 1 << 17
"""Messages per bucket, about, that keep a bucket's hash table in the CPU's caches (on 30M messages over 3M keys,
256 buckets of 117k messages spent 0.56 s of CPU in the aggregation where one table spent 3.3 s)."""
GROUP_BYTES_PER_KEY: Final = 190
"""Peak bytes of one bucket's aggregation (``latest_per_key``) per distinct key beyond the pair (measured on 100k
to 6M distinct uint64 codes: 83 to 188 bytes at the peak, with the hash table's power-of-two growth)."""
RUN_BYTES_PER_KEY: Final = 7
"""A run's survivor takes its pair's bytes about this many times while the key index sorts, decodes and packs
the run (measured: the anonymous memory grew by 290 MB while a run of 2.7M word-coded keys was indexed)."""
RUN_SHARE: Final = 0.75
"""A run ends before its survivors (counted RUN_BYTES_PER_KEY times) and the pairs still held would pass this
share of the budget; the rest is for the aggregation of the buckets being finished."""
MIN_GROUP_MESSAGES: Final = 1 << 12
MAX_GROUP_MESSAGES: Final = 1 << 20
"""Input messages turned into pairs at a time: few enough that the groups being made fit a quarter of the budget,
many enough that the Python work per bucket and group stays small (about 2**bits slices per group)."""
GROUP_BYTES_PER_MESSAGE_PAIR: Final = 6
"""A group being made holds about this many times its pairs' bytes (keys, numbers, codes, hashes, bucket order,
the sorted copies; or, for a group reduced first because its keys repeat, the hash table that reduces it: 19 MB
at the peak for a 233k-message group of word codes, against 22 MB this allows)."""
SPILL_FOLDER_PREFIX: Final = "ledgerview-compaction-"
MAX_DROPPED_HELD: Final = 1 << 16
"""Offsets of tombstones left out that step 4 holds before folding them into ranges (storage/dropped_tombstones.py):
a fold per bucket would cost more than the bucket on small ones."""


@dataclass(frozen=True)
class LiveKeys:
    """The keys one run (a set of buckets) finished: the survivors' codes and offsets, in no particular order, and
    the codes of the keys whose latest message is a tombstone (empty unless ``find_survivors`` is asked for them)."""

    coding: KeyCoding
    codes: pa.Array
    offsets: npt.NDArray[np.int64]
    tombstones: pa.Array

    def sorted_by_key(self) -> tuple[pa.Array, npt.NDArray[np.int64]]:
        """The keys (binary) in bytewise order, and their offsets in the same order."""
        order = self.coding.sort_order(self.codes)
        return self.coding.decode(self.codes.take(pa.array(order))), self.offsets[order]


@dataclass
class Survivors:
    """Offsets of the messages that stay, as sorted arrays (one per run), and what phase one counted."""

    arrays: list[np.ndarray] = field(default_factory=list)
    messages_read: int = 0
    runs: int = 0
    dropped_tombstones: Ranges = ()
    """Where the tombstones that were their key's latest message (the key leaves the view) lie, as ranges
    (storage/dropped_tombstones.py)."""
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


def find_survivors(input_batches: InputBatches, *, messages_bound: int, memory_budget_bytes: int,
                   retain_null_key: bool, on_pass: Callable[[LiveKeys], None] | None = None,
                   tombstone_keys: bool = False) -> Survivors:
    """``messages_bound``: at least the number of messages ``input_batches`` yields; ``tombstone_keys``: hand
    ``on_pass`` the keys whose latest message is a tombstone too (``LiveKeys.tombstones``, empty otherwise)."""
    keyed = (keys for keys, _, _ in (keyed_numbers([batch]) for batch in input_batches()) if len(keys))
    first_keys = next(keyed, pa.array([], pa.binary()))
    coding = KeyCoding.for_keys(first_keys)
    while True:
        try:
            return _find(input_batches, coding, first_keys, messages_bound=messages_bound,
                         memory_budget_bytes=memory_budget_bytes, retain_null_key=retain_null_key, on_pass=on_pass,
                         tombstone_keys=tombstone_keys)
        except KeysRefused as changed:
            coding = coding.widened(changed.refused)


def _find(input_batches: InputBatches, coding: KeyCoding, first_keys: pa.Array, *, messages_bound: int,
          memory_budget_bytes: int, retain_null_key: bool, on_pass: Callable[[LiveKeys], None] | None,
          tombstone_keys: bool) -> Survivors:
    mean_key_bytes = first_keys.nbytes / max(1, len(first_keys))
    pair_bytes = math.ceil(coding.bytes_per_key(mean_key_bytes)) + 8
    held_limit = max(1, int(memory_budget_bytes * HELD_SHARE))
    bits = _bucket_bits(messages_bound, pair_bytes, memory_budget_bytes)
    workers = max(1, pa.cpu_count())
    group_messages = min(MAX_GROUP_MESSAGES, max(MIN_GROUP_MESSAGES, memory_budget_bytes // (
        4 * (workers + 1) * pair_bytes * GROUP_BYTES_PER_MESSAGE_PAIR)))
    survivors = Survivors()
    held = HeldBuckets(1 << bits, pair_bytes)
    spilled: SpilledBuckets | None = None
    keyless: list[npt.NDArray[np.int64]] = []
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="ledgerview-compaction") as pool:
            def in_order(work: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
                return ordered_map(pool, work, items, ahead=workers + 1)

            def counted(groups: Iterable[list[pa.RecordBatch]]) -> Iterator[list[pa.RecordBatch]]:
                for group in groups:
                    survivors.messages_read += sum(batch.num_rows for batch in group)
                    yield group

            groups = counted(grouped(_sliced(input_batches(), group_messages), group_messages))
            for pairs in in_order(lambda group: bucketed(group, coding, bits), groups):
                held.add(pairs)
                if retain_null_key and len(pairs.keyless):
                    keyless.append(pairs.keyless)
                if held.bytes > held_limit:
                    held.reduce(in_order)
                    if held.bytes > held_limit * SPILL_SHARE:
                        if spilled is None:
                            spilled = SpilledBuckets(_spill_folder(survivors), coding.arrow_type)
                        spilled.write(held)
                        held.clear()
            _finish(in_order, held, spilled, coding, survivors, run_limit=int(memory_budget_bytes * RUN_SHARE),
                    pair_bytes=pair_bytes, on_pass=on_pass, tombstone_keys=tombstone_keys)
    except BaseException:
        survivors.close()
        raise
    if keyless:
        survivors.arrays.append(np.concatenate(keyless))  # in input order, so sorted
    return survivors


def _sliced(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """``batches`` with the larger ones cut into slices of ``rows`` (zero-copy)."""
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch if batch.num_rows <= rows else batch.slice(start, rows)


def _bucket_bits(messages_bound: int, pair_bytes: int, memory_budget_bytes: int) -> int:
    """Enough buckets for each to keep its hash table in the CPU's caches and, were every message a distinct key,
    for one bucket's aggregation to fit beside what is held."""
    for_caches = messages_bound / CACHE_BUCKET_MESSAGES
    for_budget = messages_bound * (pair_bytes + GROUP_BYTES_PER_KEY) / max(1, memory_budget_bytes * (1 - HELD_SHARE))
    wanted = max(for_caches, for_budget * max(1, pa.cpu_count()))  # a bucket per worker aggregates at once
    return min(MAX_BUCKET_BITS, max(0, math.ceil(math.log2(wanted)))) if wanted > 1 else 0


def _finish(in_order: Callable[[Callable[[tuple[list[Pairs], bool]], Pairs], Iterable[tuple[list[Pairs], bool]]],
                               Iterator[Pairs]],
            held: HeldBuckets, spilled: SpilledBuckets | None, coding: KeyCoding, survivors: Survivors, *,
            run_limit: int, pair_bytes: int, on_pass: Callable[[LiveKeys], None] | None, tombstone_keys: bool
            ) -> None:
    """Step 4: each bucket's latest live messages, gathered into runs; a run ends before its survivors (counted
    RUN_BYTES_PER_KEY times), the tombstones' keys it keeps for ``on_pass`` (counted once) and the pairs still held
    pass ``run_limit`` bytes."""

    def bucket_parts() -> Iterator[tuple[list[Pairs], bool]]:
        """Each bucket's pairs (spilled, then held), and whether they are one per key already; taken here, on the
        calling thread, as the workers get to each bucket."""
        for bucket in range(held.buckets):
            parts, reduced = held.pop(bucket)
            from_disk = spilled.parts(bucket) if spilled is not None else []
            yield from_disk + parts, reduced and not from_disk

    def latest(bucket: tuple[list[Pairs], bool]) -> Pairs:
        parts, one_per_key = bucket
        if not parts:
            return pa.array([], coding.arrow_type), np.empty(0, np.int64)
        return parts[0] if one_per_key else latest_per_key(parts)

    run: list[Pairs] = []
    tombstones: list[pa.Array] = []
    run_bytes = tombstone_bytes = 0
    dropped: list[npt.NDArray[np.int64]] = []  # offsets of the tombstones left out, folded into ranges now and then
    dropped_count = 0
    for codes, numbers in in_order(latest, bucket_parts()):
        live = (numbers & 1) == 1
        count = int(live.sum())
        dead = len(numbers) - count
        if dead:
            dropped.append(numbers[~live] >> 1)
            dropped_count += len(dropped[-1])
            if dropped_count > MAX_DROPPED_HELD:
                survivors.dropped_tombstones = with_offsets(survivors.dropped_tombstones, np.concatenate(dropped))
                dropped, dropped_count = [], 0
        kept_dead = dead if tombstone_keys else 0
        if (run or tombstones) and ((run_bytes + count * pair_bytes) * RUN_BYTES_PER_KEY + tombstone_bytes
                                    + kept_dead * pair_bytes + held.bytes > run_limit):
            _end_run(run, tombstones, coding, survivors, last=False, on_pass=on_pass)
            run, tombstones, run_bytes, tombstone_bytes = [], [], 0, 0
        if count:
            run.append((codes.filter(pa.array(live)), numbers[live] >> 1))
            run_bytes += count * pair_bytes
        if kept_dead:
            tombstones.append(codes.filter(pa.array(~live)))
            tombstone_bytes += kept_dead * pair_bytes
    if run or tombstones or not survivors.runs:
        _end_run(run, tombstones, coding, survivors, last=True, on_pass=on_pass)
    if dropped:
        survivors.dropped_tombstones = with_offsets(survivors.dropped_tombstones, np.concatenate(dropped))


def _end_run(run: list[Pairs], tombstones: list[pa.Array], coding: KeyCoding, survivors: Survivors, *, last: bool,
             on_pass: Callable[[LiveKeys], None] | None) -> None:
    codes = pa.concat_arrays([codes for codes, _ in run]) if run else pa.array([], coding.arrow_type)
    offsets = np.concatenate([offsets for _, offsets in run]) if run else np.empty(0, np.int64)
    dead = pa.concat_arrays(tombstones) if tombstones else pa.array([], coding.arrow_type)
    run.clear()
    tombstones.clear()
    if on_pass is not None and (len(offsets) or len(dead)):
        on_pass(LiveKeys(coding, codes, offsets, dead))
    offsets = np.sort(offsets)
    if not last or survivors.spill_folder is not None:
        path = Path(_spill_folder(survivors)) / f"run-{survivors.runs}.npy"
        np.save(path, offsets)
        offsets = np.load(path, mmap_mode="r")
    survivors.arrays.append(offsets)
    survivors.runs += 1


def _spill_folder(survivors: Survivors) -> Path:
    if survivors.spill_folder is None:
        survivors.spill_folder = tempfile.TemporaryDirectory(prefix=SPILL_FOLDER_PREFIX)
    return Path(survivors.spill_folder.name)
