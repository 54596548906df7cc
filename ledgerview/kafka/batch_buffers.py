"""The buffers fetched batches are encoded into, reused (reused_buffers.py).

Fetched batches come in all sizes (a fetch that starts inside a stored batch sends its rest, then the start of the
next), so a batch of REUSED_BATCH_BYTES_MIN to REUSED_BATCH_BYTES_MAX bytes is given a buffer of its size class (the
least of 1, 1.25, 1.5 or 1.75 times a power of two that holds it: at most a quarter larger), a free one of that
class when there is one; the batch is a view of its own length, every byte of which the encoder writes. A buffer
goes back on the free list once its batch is written and not cached, or when the fetch cache evicts the batch to
admit a newer one (batch_cache.py). A batch not yet written is counted at its class (``charge``,
response_sender.py), so reuse never adds to the memory queued.max.request.bytes allows. (Request frames' free list,
frame_buffers.py, matches sizes within a quarter instead of by class.)
"""

from __future__ import annotations

from ledgerview.kafka.large_buffers import MMAP_THRESHOLD_BYTES
from ledgerview.kafka.request_queue import QueuedRequestBytes
from ledgerview.kafka.reused_buffers import ReusedBuffers

REUSED_BATCH_BYTES_MIN = MMAP_THRESHOLD_BYTES
REUSED_BATCH_BYTES_MAX = 4 * 1024 * 1024
"""Larger batches (a single message larger than fetch.BATCH_ENCODE_BYTES) get a buffer of their own each time."""
FREE_BUFFERS_MAX = 8
"""About two of each class a sequential consumer's batches fall in (replayed from a kcat consume's sizes: four
reuse a sixth fewer buffers once the fetch cache is full)."""


class BatchBuffers(ReusedBuffers):
    def __init__(self, pool: QueuedRequestBytes) -> None:
        super().__init__(pool, min_bytes=REUSED_BATCH_BYTES_MIN, max_bytes=REUSED_BATCH_BYTES_MAX,
                         max_free=FREE_BUFFERS_MAX)

    @staticmethod
    def charge(size: int) -> int:
        """What the pool must count for a batch of ``size`` bytes until it is written: the buffer ``take`` gives
        it."""
        return _size_class(size) if REUSED_BATCH_BYTES_MIN <= size <= REUSED_BATCH_BYTES_MAX else size

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes to encode a batch into: part of a free buffer of its class, or new."""
        wanted = self.charge(size)
        buffer = self.take_free(lambda length: length == wanted)
        return memoryview(buffer if buffer is not None else bytearray(wanted))[:size]

    def keeps(self, length: int) -> bool:
        return length == _size_class(length)


def _size_class(size: int) -> int:
    """The least of 1, 1.25, 1.5 and 1.75 times a power of two that is at least ``size``."""
    step = 1 << max((size - 1).bit_length() - 3, 0)
    return -(-size // step) * step
