"""A free list of large buffers, reused so that their pages are not faulted in afresh for every use.

glibc returns every block of MMAP_THRESHOLD_BYTES or more to the kernel when it is freed (large_buffers.py), so a
new 1 MiB buffer each time costs 256 page faults, and the kernel's zeroing of each page, before the first byte is
written. Request frames (frame_buffers.py) and fetched batches (batch_buffers.py) each keep a free list of the
buffers they were given; what fits a use is theirs to say. A buffer goes back on its list once its use is over,
unless a view of it is still alive (something kept part of it: the buffer is then left to it). The list holds at
most ``max_free`` buffers, and only in room queued.max.request.bytes leaves free (request_queue.py): the pool evicts
free buffers, oldest first, whenever a request, a fetched batch or a worker step needs that room. Smaller buffers
come from glibc's heaps, which reuse freed memory by themselves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ledgerview.kafka.request_queue import QueuedRequestBytes


class ReusedBuffers:
    """A free list of buffers of ``min_bytes`` to ``max_bytes``, counted in ``pool``; used on the endpoint's event
    loop only."""

    def __init__(self, pool: QueuedRequestBytes, *, min_bytes: int, max_bytes: int, max_free: int) -> None:
        self._pool = pool
        self._min_bytes = min_bytes
        self._max_bytes = max_bytes
        self._max_free = max_free
        self._free: deque[bytearray] = deque()
        pool.share_with_cache(self.evict)

    def reusable(self, size: int) -> bool:
        return self._min_bytes <= size <= self._max_bytes

    def take_free(self, fits: Callable[[int], bool]) -> bytearray | None:
        """The oldest free buffer whose length ``fits``, no longer counted in the pool; None when none does."""
        for index, buffer in enumerate(self._free):
            if fits(len(buffer)):
                del self._free[index]
                self._pool.release_cached(len(buffer))
                return buffer
        return None

    def give_back(self, view: memoryview) -> None:
        """``view``'s use is over: keep its buffer for another use if it may be reused and the pool has room."""
        buffer = view.obj
        view.release()
        if (not isinstance(buffer, bytearray) or not self.reusable(len(buffer)) or not self.keeps(len(buffer))
                or _viewed(buffer)):
            return
        if not self._pool.take_cached(len(buffer)):
            return
        if len(self._free) == self._max_free:
            self._drop_oldest()
        self._free.append(buffer)

    def keeps(self, length: int) -> bool:
        """Whether a buffer of ``length`` bytes is one this list hands out again."""
        return True

    def evict(self, size: int) -> None:
        """Drop free buffers, oldest first, until at least ``size`` bytes (or all) are gone."""
        freed = 0
        while freed < size and self._free:
            freed += self._drop_oldest()

    def _drop_oldest(self) -> int:
        size = len(self._free.popleft())
        self._pool.release_cached(size)
        return size


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
