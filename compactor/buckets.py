"""Phase one's keyed messages as (code, number) pairs cut into buckets by key hash, and the pairs phase one holds.

A number is ``2 * offset + (1 if the value is not null)``: offsets only grow, so a key's largest number belongs to
its latest message and its low bit says whether that message is a tombstone. Every key falls in one bucket
(compactor/key_codes.py ``bucket_ids``), so each bucket is aggregated alone: its hash table is small enough for
the CPU's caches (on 30M messages over 3M keys, one table spent 3.3 s of CPU, 256 buckets 0.56 s plus 0.68 s to
cut them), and buckets can be reduced or spilled one at a time when memory runs short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from compactor.key_codes import KeyCoding

REPEAT_SAMPLE_KEYS = 4_096
REPEAT_SHARE = 0.5
"""A group of messages whose REPEAT_SAMPLE_KEYS keys taken evenly across it hold at most this share of distinct keys
is reduced to one pair per key before it is cut: on skewed keys that leaves about a fifth of the pairs to cut, hold
and aggregate again (Zipf-scattered over 1M key ids, groups of 233k messages; bench/RESULTS.md, issue 19). Keys
that rarely repeat within a group are cut as they are (a sample of 4,096 uniform keys over 200k ids or more holds
99% distinct ones): hashing them first would cost more than it frees."""
Pairs = tuple[pa.Array, npt.NDArray[np.int64]]
"""Codes and numbers of some keyed messages, in the same order."""


def keyed_numbers(batches: list[pa.RecordBatch]) -> tuple[pa.Array, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The keys of the keyed messages of some batches, their numbers, and the offsets of the keyless messages."""
    numbers = np.empty(sum(batch.num_rows for batch in batches), np.int64)
    start = 0
    for batch in batches:
        mine = numbers[start : start + batch.num_rows]
        np.left_shift(batch.column(0).to_numpy(), 1, out=mine)
        values = batch.column(3)
        np.bitwise_or(mine, values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else 1, out=mine)
        start += batch.num_rows
    keys = batches[0].column(2) if len(batches) == 1 else pa.concat_arrays([batch.column(2) for batch in batches])
    if keys.null_count:
        keyed = keys.is_valid()
        mask = keyed.to_numpy(zero_copy_only=False)
        return keys.filter(keyed), numbers[mask], numbers[~mask] >> 1
    return keys, numbers, _NO_OFFSETS


@dataclass(frozen=True)
class BucketedPairs:
    """Pairs sorted by bucket: bucket b holds rows ``bounds[b]`` to ``bounds[b + 1]``."""

    codes: pa.Array
    numbers: npt.NDArray[np.int64]
    bounds: list[int]
    keyless: npt.NDArray[np.int64]
    """Offsets of the messages without a key, in order."""


def bucketed(batches: list[pa.RecordBatch], coding: KeyCoding, bits: int) -> BucketedPairs:
    """The keyed messages of ``batches`` as pairs cut into ``2 ** bits`` buckets (raises KeysRefused when the
    coding cannot code a key); one pair per key already when the keys repeat (see REPEAT_SHARE)."""
    keys, numbers, keyless = keyed_numbers(batches)
    codes = coding.encode(keys)
    if _keys_repeat(codes):
        codes, numbers = latest_per_key([(codes, numbers)])
    if bits == 0:
        return BucketedPairs(codes, numbers, [0, len(numbers)], keyless)
    ids = coding.bucket_ids(codes, bits)
    order = np.argsort(ids, kind="stable")  # a radix sort for 8- and 16-bit ids
    bounds = [0, *np.cumsum(np.bincount(ids, minlength=1 << bits)).tolist()]
    if pa.types.is_uint64(codes.type):  # numpy gathers words about twice as fast as Arrow's take
        return BucketedPairs(pa.array(codes.to_numpy()[order]), numbers[order], bounds, keyless)
    return BucketedPairs(codes.take(pa.array(order)), numbers[order], bounds, keyless)


def _keys_repeat(codes: pa.Array) -> bool:
    """Whether REPEAT_SAMPLE_KEYS codes taken evenly across ``codes`` hold at most REPEAT_SHARE distinct keys."""
    if len(codes) < REPEAT_SAMPLE_KEYS:
        return False
    sample = codes.take(pa.array(np.linspace(0, len(codes) - 1, REPEAT_SAMPLE_KEYS).astype(np.int64)))
    return len(pc.unique(sample)) <= REPEAT_SAMPLE_KEYS * REPEAT_SHARE


def latest_per_key(parts: list[Pairs]) -> Pairs:
    """Each key's largest number among ``parts`` (one bucket's): Arrow's hash kernel gives each key a slot, numpy
    keeps each slot's largest number. On buckets of 31k to 1M pairs this took 18-30% less time than Arrow's
    group_by, whose plan costs more per call than the hashing (bench/RESULTS.md, issue 19)."""
    codes = parts[0][0] if len(parts) == 1 else pa.concat_arrays([codes for codes, _ in parts])
    slots = pc.dictionary_encode(codes)
    latest = np.full(len(slots.dictionary), -1, np.int64)
    np.maximum.at(latest, slots.indices.to_numpy(), np.concatenate([numbers for _, numbers in parts]))
    return slots.dictionary, latest


class HeldBuckets:
    """The pairs phase one holds, by bucket, and about how many bytes they take."""

    def __init__(self, buckets: int, bytes_per_pair: int) -> None:
        self.bytes_per_pair = bytes_per_pair
        self._parts: list[list[Pairs]] = [[] for _ in range(buckets)]
        self._reduced = [False] * buckets
        """Whether a bucket holds one pair per key (reduced, nothing added since)."""
        self._rows = 0

    @property
    def buckets(self) -> int:
        return len(self._parts)

    @property
    def bytes(self) -> int:
        return self._rows * self.bytes_per_pair

    def add(self, pairs: BucketedPairs) -> None:
        bounds = pairs.bounds
        for bucket, parts in enumerate(self._parts):
            start, stop = bounds[bucket], bounds[bucket + 1]
            if stop > start:
                parts.append((pairs.codes.slice(start, stop - start), pairs.numbers[start:stop]))
                self._reduced[bucket] = False
        self._rows += len(pairs.numbers)

    def reduce(self, map_in_order: Callable[[Callable[[list[Pairs]], Pairs], Iterable[list[Pairs]]], Iterable[Pairs]]
               ) -> None:
        """Replace each bucket's pairs by one per key (the largest number), with ``map_in_order`` running the
        aggregations (on several threads)."""
        todo = [parts if parts and not reduced else [] for parts, reduced in zip(self._parts, self._reduced,
                                                                                  strict=True)]
        reduced = map_in_order(lambda parts: latest_per_key(parts) if parts else _NO_PAIRS, todo)
        for bucket, pairs in enumerate(reduced):
            if todo[bucket]:
                self._parts[bucket] = [pairs] if len(pairs[1]) else []
                self._reduced[bucket] = True
        self._rows = sum(len(numbers) for parts in self._parts for _, numbers in parts)

    def pop(self, bucket: int) -> tuple[list[Pairs], bool]:
        """The bucket's pairs, which this no longer holds, and whether they are one per key already."""
        parts, self._parts[bucket] = self._parts[bucket], []
        self._rows -= sum(len(numbers) for _, numbers in parts)
        return parts, self._reduced[bucket]

    def clear(self) -> None:
        self._parts = [[] for _ in self._parts]
        self._reduced = [False] * len(self._parts)
        self._rows = 0

    def __iter__(self) -> Iterator[list[Pairs]]:
        return iter(self._parts)


_NO_OFFSETS: npt.NDArray[np.int64] = np.empty(0, np.int64)
_NO_PAIRS: Pairs = (pa.nulls(0), np.empty(0, np.int64))
