"""Encoded Kafka batches kept in memory, least recently used first out, so a fetch that several consumers (or
one consumer's retry) make is encoded once.

A key names the topic, view, partition, first and last offset served and the message count. Offsets never
change and the stored messages in a range only ever shrink (cleaning, retention), so a range with the same count
holds the same messages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

CacheKey = tuple[str, bool, int, int, int, int]


class EncodedBatchCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[CacheKey, bytes] = OrderedDict()

    def get_or_encode(self, key: CacheKey, encode: Callable[[], bytes]) -> bytes:
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            return cached
        encoded = encode()
        if len(encoded) <= self.capacity_bytes:
            self._entries[key] = encoded
            self.size_bytes += len(encoded)
            while self.size_bytes > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.size_bytes -= len(evicted)
        return encoded
