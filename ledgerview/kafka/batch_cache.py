"""Encoded Kafka batches kept in memory, least recently used first out, so a fetch that several consumers (or
one consumer's retry) make is encoded once.

A key names the topic, view, partition, first and last offset served and the message count. Offsets never
change and the stored messages in a range only ever shrink (cleaning, retention), so a range with the same count
holds the same messages.

The cache holds at most ``capacity_bytes`` (EndpointOptions.fetch_cache_bytes). On the endpoint it also lives in
queued.max.request.bytes (count_in, request_queue.py): an entry is kept only while requests and responses leave
room for it, and entries are evicted as soon as they need that room, so the cache never adds to the memory the
bound allows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ledgerview.kafka.request_queue import QueuedRequestBytes

CacheKey = tuple[str, bool, int, int, int, int]


class EncodedBatchCache:
    """Used on the endpoint's event loop only."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[CacheKey, bytes] = OrderedDict()
        self._pool: QueuedRequestBytes | None = None

    def count_in(self, pool: QueuedRequestBytes) -> None:
        """Hold entries in ``pool``'s room only, evicted whenever the pool needs it."""
        self.evict(self.size_bytes)
        self._pool = pool
        pool.share_with_cache(self.evict)

    def get_or_encode(self, key: CacheKey, encode: Callable[[], bytes]) -> bytes:
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            return cached
        encoded = encode()
        size = len(encoded)
        short = size - self.capacity_bytes + self.size_bytes
        if self._pool is not None:
            short = max(short, size - self._pool.cache_room)
        if size <= self.capacity_bytes and short <= self.size_bytes:  # room, once older entries go
            self.evict(short)
            if self._pool is None or self._pool.take_cached(size):
                self._entries[key] = encoded
                self.size_bytes += size
        return encoded

    def evict(self, size: int) -> None:
        """Drop least recently used entries until at least ``size`` bytes (or all) are gone."""
        freed = 0
        while freed < size and self._entries:
            _, evicted = self._entries.popitem(last=False)
            freed += len(evicted)
        self.size_bytes -= freed
        if self._pool is not None and freed:
            self._pool.release_cached(freed)
