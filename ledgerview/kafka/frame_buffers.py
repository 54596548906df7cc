"""The buffers request frames are received into, large ones reused (reused_buffers.py).

A frame of REUSED_FRAME_BYTES_MIN to REUSED_FRAME_BYTES_MAX bytes is received into a free buffer when one fits it
(at most a quarter larger than the frame, rounded up to BUFFER_GRAIN_BYTES; the frame is a view of its own length,
never of the bytes a former frame left past it), and its buffer goes back on the free list once the frame is
answered. A frame in flight is counted at the largest buffer it may be given (``charge``), so reuse never adds to
the memory queued.max.request.bytes allows.
"""

from __future__ import annotations

from ledgerview.kafka.large_buffers import MMAP_THRESHOLD_BYTES
from ledgerview.kafka.request_queue import QueuedRequestBytes
from ledgerview.kafka.reused_buffers import ReusedBuffers

REUSED_FRAME_BYTES_MIN = MMAP_THRESHOLD_BYTES
REUSED_FRAME_BYTES_MAX = 4 * 1024 * 1024
"""Larger frames (rare: producers send at most a MiB by default) get a buffer of their own each time."""
FREE_BUFFERS_MAX = 4
BUFFER_GRAIN_BYTES = 64 * 1024
"""A reusable buffer's size is its first frame's rounded up to this, so that frames a little larger fit it too."""


class FrameBuffers(ReusedBuffers):
    def __init__(self, pool: QueuedRequestBytes) -> None:
        super().__init__(pool, min_bytes=REUSED_FRAME_BYTES_MIN, max_bytes=REUSED_FRAME_BYTES_MAX,
                         max_free=FREE_BUFFERS_MAX)

    @staticmethod
    def charge(size: int) -> int:
        """What the pool must count for a frame of ``size`` bytes: the largest buffer ``take`` may give it."""
        return _largest_fit(size) if REUSED_FRAME_BYTES_MIN <= size <= REUSED_FRAME_BYTES_MAX else size

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes to receive a frame into: part of a free buffer that fits (at most
        ``charge(size)`` bytes), or new."""
        if not self.reusable(size):
            return memoryview(bytearray(size))
        buffer = self.take_free(lambda length: size <= length <= _largest_fit(size))
        return memoryview(buffer if buffer is not None else bytearray(_rounded(size)))[:size]


def _largest_fit(size: int) -> int:
    """The largest free buffer a frame of ``size`` bytes may take: at most a quarter larger, rounded up."""
    return _rounded(size + size // 4)


def _rounded(size: int) -> int:
    return -(-size // BUFFER_GRAIN_BYTES) * BUFFER_GRAIN_BYTES
