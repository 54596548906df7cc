"""The buffers fetched batches are encoded into, reused so that their pages are not faulted in afresh for every
batch.

glibc returns every block of MMAP_THRESHOLD_BYTES or more to the kernel when it is freed (large_buffers.py), so a
new 1 MiB buffer per fetched batch costs 256 page faults, and the kernel's zeroing of each page, before the first
byte is encoded. Fetched batches come in all sizes (a fetch that starts inside a stored batch sends its rest, then
the start of the next), so a batch of REUSED_BATCH_BYTES_MIN to REUSED_BATCH_BYTES_MAX bytes is given a buffer of its
size class (the least of 1, 1.25, 1.5 or 1.75 times a power of two that holds it: at most a quarter larger), a free
one of that class when there is one; the batch is a view of its own length, every byte of which the encoder writes.

A buffer goes back on the free list once its batch is written and not cached, or when the fetch cache evicts the
batch to admit a newer one (batch_cache.py), unless a view of it is still alive (a transport that kept part of an
unsent response: the buffer is then left to it). The free list holds at most FREE_BUFFERS_MAX buffers, and only in
room queued.max.request.bytes leaves free (request_queue.py): the pool evicts free buffers, oldest first, whenever a
request, a fetched batch or a worker step needs that room; a batch not yet written is counted at its class
(``charge``, response_sender.py), so reuse never adds to the memory the bound allows. Smaller batches come from
glibc's heaps, which reuse freed memory by themselves. (Request frames have a free list of their own,
frame_buffers.py, which matches sizes within a quarter instead of by class.)
"""

from __future__ import annotations

from collections import deque

from ledgerview.kafka.frame_buffers import _viewed
from ledgerview.kafka.large_buffers import MMAP_THRESHOLD_BYTES
from ledgerview.kafka.request_queue import QueuedRequestBytes

REUSED_BATCH_BYTES_MIN = MMAP_THRESHOLD_BYTES
REUSED_BATCH_BYTES_MAX = 4 * 1024 * 1024
"""Larger batches (a single message larger than fetch.BATCH_ENCODE_BYTES) get a buffer of their own each time."""
FREE_BUFFERS_MAX = 8
"""About two of each class a sequential consumer's batches fall in (replayed from a kcat consume's sizes: four
reuse a sixth fewer buffers once the fetch cache is full)."""


class BatchBuffers:
    """The free list of batch buffers, counted in ``pool``; used on the endpoint's event loop only."""

    def __init__(self, pool: QueuedRequestBytes) -> None:
        self._pool = pool
        self._free: deque[bytearray] = deque()
        pool.share_with_cache(self.evict)

    @staticmethod
    def charge(size: int) -> int:
        """What the pool must count for a batch of ``size`` bytes until it is written: the buffer ``take`` gives
        it."""
        return _size_class(size) if REUSED_BATCH_BYTES_MIN <= size <= REUSED_BATCH_BYTES_MAX else size

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes to encode a batch into: part of a free buffer of its class, or new."""
        wanted = self.charge(size)
        for index, buffer in enumerate(self._free):
            if len(buffer) == wanted:
                del self._free[index]
                self._pool.release_cached(wanted)
                return memoryview(buffer)[:size]
        return memoryview(bytearray(wanted))[:size]

    def give_back(self, batch: memoryview) -> None:
        """``batch`` (from ``take``) is written or evicted: keep its buffer for another batch if it may be reused
        and the pool has room for it."""
        buffer = batch.obj
        batch.release()
        if (not isinstance(buffer, bytearray) or not REUSED_BATCH_BYTES_MIN <= len(buffer) <= REUSED_BATCH_BYTES_MAX
                or len(buffer) != _size_class(len(buffer)) or _viewed(buffer)):
            return
        if not self._pool.take_cached(len(buffer)):
            return
        if len(self._free) == FREE_BUFFERS_MAX:
            self._drop_oldest()
        self._free.append(buffer)

    def evict(self, size: int) -> None:
        """Drop free buffers, oldest first, until at least ``size`` bytes (or all) are gone."""
        freed = 0
        while freed < size and self._free:
            freed += self._drop_oldest()

    def _drop_oldest(self) -> int:
        size = len(self._free.popleft())
        self._pool.release_cached(size)
        return size


def _size_class(size: int) -> int:
    """The least of 1, 1.25, 1.5 and 1.75 times a power of two that is at least ``size``."""
    step = 1 << max((size - 1).bit_length() - 3, 0)
    return -(-size // step) * step
