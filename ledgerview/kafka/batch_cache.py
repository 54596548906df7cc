"""Encoded Kafka batches kept in memory, least recently used first out, so a fetch that several consumers (or
one consumer's retry) make is encoded once; and what encoding a fetched batch needs besides: its record layout,
computed once, and a buffer reused so that its pages are not faulted in afresh for every batch.

A key names the topic (and its creation time: one deleted and created again is another log), view, partition,
first and last offset served and the message count. Offsets never change and the stored messages in a range only
ever shrink (cleaning, retention), so a range with the same count holds the same messages.

The cache holds at most ``capacity_bytes`` (EndpointOptions.fetch_cache_bytes), counted as the whole buffers its
entries keep. On the endpoint it also lives in queued.max.request.bytes (count_in, request_queue.py): an entry is
kept only while requests and responses leave room for it, and entries are evicted as soon as they need that room,
so the cache never adds to the memory the bound allows.

A batch is sized from its cached encoding when there is one, else from its record layout, kept for its encoding
(batch_layouts.py). Once counted in a pool, batches are encoded into buffers reused from a free list of their own
(batch_buffers.py); the pool evicts free buffers first, then layouts, then entries. A batch's buffer goes back on
that list once the batch is written and not cached, or when the cache evicts the batch to admit a newer one (a
sequential consumer's usual case, once the cache is full); evicted because the pool needs room, an entry is dropped
instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa

from ledgerview.kafka.batch_buffers import BatchBuffers
from ledgerview.kafka.batch_layouts import BatchLayouts
from ledgerview.kafka.fetch_response import Buffer
from ledgerview.kafka.record_encoding import RecordLayout, record_layout
from ledgerview.kafka.request_queue import QueuedRequestBytes

CacheKey = tuple[str, int, bool, int, int, int, int]
"""(topic, its creation time in ms, compacted view, partition, first offset, last offset, messages)."""


class EncodedBatchCache:
    """Used on the endpoint's event loop only."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[CacheKey, Buffer] = OrderedDict()
        self._pool: QueuedRequestBytes | None = None
        self._buffers: BatchBuffers | None = None
        self._layouts = BatchLayouts()

    def count_in(self, pool: QueuedRequestBytes) -> None:
        """Hold entries, free buffers and layouts in ``pool``'s room only, evicted whenever the pool needs it."""
        self.evict(self.size_bytes)
        self._pool = pool
        self._buffers = BatchBuffers(pool)
        self._layouts.count_in(pool)
        pool.share_with_cache(self.evict)

    def sized(self, key: CacheKey, batch: Callable[[], pa.RecordBatch]) -> int:
        """The encoded size of the batch ``key`` names (``batch()`` makes it, when it must be laid out): its cached
        encoding's, or its layout's (then kept for ``layout``)."""
        cached = self._entries.get(key)
        if cached is not None:
            return len(cached)
        layout = record_layout(batch())
        self._layouts.keep(key, layout)
        return layout.batch_bytes

    def layout(self, key: CacheKey, batch: pa.RecordBatch) -> RecordLayout:
        """The layout of ``batch`` (``key``), as ``sized`` computed it if it is still kept."""
        return self._layouts.take(key) or record_layout(batch)

    @staticmethod
    def charge(size: int) -> int:
        """What the pool must count for a batch of ``size`` bytes until it is written: the buffer ``buffer`` gives
        it."""
        return BatchBuffers.charge(size)

    def buffer(self, size: int) -> memoryview:
        """``size`` writable bytes to encode a batch into, of a reused buffer when there is a pool to count it."""
        return memoryview(bytearray(size)) if self._buffers is None else self._buffers.take(size)

    def get_or_encode(self, key: CacheKey, encode: Callable[[], Buffer]) -> Buffer:
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            return cached
        encoded = encode()
        size = _held_bytes(encoded)
        short = size - self.capacity_bytes + self.size_bytes
        if self._pool is not None:
            short = max(short, size - self._pool.cache_room)
        if size <= self.capacity_bytes and short <= self.size_bytes:  # room, once older entries go
            self._evict(short, reuse=True)
            if self._pool is None or self._pool.take_cached(size):
                self._entries[key] = encoded
                self.size_bytes += size
        return encoded

    def written(self, key: CacheKey, encoded: Buffer) -> None:
        """``encoded`` (``get_or_encode(key, ...)``'s) was handed to the transport: its buffer may be reused
        unless the cache keeps it."""
        if self._entries.get(key) is not encoded:
            self._give_back(encoded)

    def evict(self, size: int) -> None:
        """Drop least recently used entries until at least ``size`` bytes (or all) are gone: the pool's call,
        so their buffers are freed, not kept."""
        self._evict(size, reuse=False)

    def _evict(self, size: int, *, reuse: bool) -> None:
        evicted: list[Buffer] = []
        freed = 0
        while freed < size and self._entries:
            evicted.append(self._entries.popitem(last=False)[1])
            freed += _held_bytes(evicted[-1])
        self.size_bytes -= freed
        if self._pool is not None and freed:
            self._pool.release_cached(freed)
        for encoded in evicted if reuse else ():
            self._give_back(encoded)

    def _give_back(self, encoded: Buffer) -> None:
        if self._buffers is not None and isinstance(encoded, memoryview):
            self._buffers.give_back(encoded)


def _held_bytes(encoded: Buffer) -> int:
    """The bytes ``encoded`` keeps alive: the whole buffer it is a view of."""
    whole = encoded.obj if isinstance(encoded, memoryview) else encoded
    return len(whole) if isinstance(whole, bytes | bytearray) else len(encoded)
