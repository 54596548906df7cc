"""The buffers request frames are received into, large ones reused so that their pages are not faulted in afresh
for every frame.

glibc returns every block of MMAP_THRESHOLD_BYTES or more to the kernel when it is freed (large_buffers.py), so a
new 1 MiB buffer per produced frame costs 256 page faults, and the kernel's zeroing of each page, before the first
byte is received. A frame of REUSED_FRAME_BYTES_MIN to REUSED_FRAME_BYTES_MAX bytes is therefore received into a
free buffer when one fits it (at most a quarter larger than the frame, rounded up to BUFFER_GRAIN_BYTES; the frame
is a view of its own length, never of the bytes a former frame left past it), and its buffer goes back on the free list
once the frame is answered, unless a view of it is still alive (something kept part of the request: the buffer is
then left to it). The free list holds at most FREE_BUFFERS_MAX buffers, and only in room queued.max.request.bytes
leaves free (request_queue.py): the pool evicts free buffers, oldest first, whenever a request, a fetched batch or a
worker step needs that room; a frame in flight is counted at the largest buffer it may be given (``charge``), so
reuse never adds to the memory the bound allows. Smaller frames come from glibc's heaps, which reuse freed memory by
themselves.
"""

from __future__ import annotations

from collections import deque

from ledgerview.kafka.large_buffers import MMAP_THRESHOLD_BYTES
from ledgerview.kafka.request_queue import QueuedRequestBytes

REUSED_FRAME_BYTES_MIN = MMAP_THRESHOLD_BYTES
REUSED_FRAME_BYTES_MAX = 4 * 1024 * 1024
"""Larger frames (rare: producers send at most a MiB by default) get a buffer of their own each time."""
FREE_BUFFERS_MAX = 4
BUFFER_GRAIN_BYTES = 64 * 1024
"""A reusable buffer's size is its first frame's rounded up to this, so that frames a little larger fit it too."""


class FrameBuffers:
    """The free list of frame buffers, counted in ``pool``; used on the endpoint's event loop only."""

    def __init__(self, pool: QueuedRequestBytes) -> None:
        self._pool = pool
        self._free: deque[bytearray] = deque()
        pool.share_with_cache(self.evict)

    @staticmethod
    def charge(size: int) -> int:
        """What the pool must count for a frame of ``size`` bytes: the largest buffer ``take`` may give it."""
        return _largest_fit(size) if REUSED_FRAME_BYTES_MIN <= size <= REUSED_FRAME_BYTES_MAX else size

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes to receive a frame into: part of a free buffer that fits (at most
        ``charge(size)`` bytes), or new."""
        if not REUSED_FRAME_BYTES_MIN <= size <= REUSED_FRAME_BYTES_MAX:
            return memoryview(bytearray(size))
        for index, buffer in enumerate(self._free):
            if size <= len(buffer) <= _largest_fit(size):
                del self._free[index]
                self._pool.release_cached(len(buffer))
                return memoryview(buffer)[:size]
        return memoryview(bytearray(_rounded(size)))[:size]

    def give_back(self, frame: memoryview) -> None:
        """``frame`` (from ``take``) is answered: keep its buffer for another frame if it may be reused and the
        pool has room for it."""
        buffer = frame.obj
        frame.release()
        if (not isinstance(buffer, bytearray) or not REUSED_FRAME_BYTES_MIN <= len(buffer) <= REUSED_FRAME_BYTES_MAX
                or _viewed(buffer)):
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


def _largest_fit(size: int) -> int:
    """The largest free buffer a frame of ``size`` bytes may take: at most a quarter larger, rounded up."""
    return _rounded(size + size // 4)


def _rounded(size: int) -> int:
    return -(-size // BUFFER_GRAIN_BYTES) * BUFFER_GRAIN_BYTES


def _viewed(buffer: bytearray) -> bool:
    """Whether a view of ``buffer`` is still alive. A bytearray with live views refuses to change size, so one byte
    is appended and removed again (the first time, the buffer grows its spare capacity by an eighth: address
    space only, no page is touched)."""
    try:
        buffer.append(0)
    except BufferError:
        return True
    buffer.pop()
    return False
