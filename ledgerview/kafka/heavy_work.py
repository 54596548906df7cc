"""The endpoint's CPU-heavy request steps, run on one worker thread so the event loop keeps serving every other
connection meanwhile: decompressing and decoding produced batches (a compression bomb inflates for hundreds of
milliseconds before its bound stops it). A connection awaits its step before reading its next request, so its
responses still leave in request order. The step must not touch the store: Store objects are not shared across
threads (storage/periodic.py).

The bytes a step produces count in the endpoint's queued.max.request.bytes pool (request_queue.py): the step calls
``reserve(n)`` before producing ``n`` bytes, which takes room from the pool GRANT_BYTES at a time and blocks the
worker (back-pressure) while the pool is full (past the bound, in the case where the step must progress, the pool
counts only what fits). The caller releases what the step reserved once it is done with the
step's result. While a request waits for the worker or its step runs, its frame is parked in the pool, so a step
never waits for frames queued behind it. Once a large step's result is dropped, Arrow's allocator returns the memory
it freed to the system (RELEASE_UNUSED_BYTES), so what the pool stopped counting also leaves RSS.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow as pa

from ledgerview.kafka.request_queue import QueuedRequestBytes

T = TypeVar("T")
Reserve = Callable[[int], None]
"""Called by a step on the worker thread before it produces that many bytes."""

GRANT_BYTES = 1 << 20
"""Room is taken from the pool this much at a time (fewer trips to the event loop)."""
RELEASE_UNUSED_BYTES = 8 << 20
"""A step this large has Arrow's allocator return what it freed: mimalloc otherwise keeps a 64 MiB bomb's buffers
mapped after they are freed (measured with bench/kafka_hostile.py --probe: 64-70 MiB for the rest of the run)."""


class HeavyWork:
    def __init__(self, pool: QueuedRequestBytes | None = None) -> None:
        """``pool``: where the steps' bytes are counted; None counts nothing."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-heavy-work")
        self._pool = pool
        self._lock = threading.Lock()
        self._closing = False
        self._waiting: concurrent.futures.Future[int] | None = None

    async def run(self, step: Callable[[Reserve], T], *, parked_bytes: int) -> tuple[T, int]:
        """``step(reserve)`` on the worker thread, once the steps queued before it are done, with the request's
        frame of ``parked_bytes`` parked meanwhile. Returns the step's result and the bytes it reserved, for the
        caller to ``release`` once done with the result; the reservations of a step that raises are released."""
        loop = asyncio.get_running_loop()
        grants = _Grants(self, loop)
        pool = self._pool
        if pool is not None:
            pool.park(parked_bytes)
        try:
            result = await loop.run_in_executor(self._executor, _let_go_once_called(step), grants.take)
        except BaseException:
            self.release(grants.reserved)
            raise
        finally:
            if pool is not None:
                pool.park(-parked_bytes)
        return result, grants.reserved

    def release(self, size: int) -> None:
        """Give back ``size`` bytes a step reserved; on the event loop. After a step of RELEASE_UNUSED_BYTES or
        more, Arrow's allocator is told to return its freed memory once the caller is done with the result."""
        if self._pool is not None and size:
            self._pool.release(size)
        if size >= RELEASE_UNUSED_BYTES:
            asyncio.get_running_loop().call_soon(_release_unused)

    def close(self) -> None:
        """Stop a step waiting for room, wait for the running step; drop the queued ones."""
        with self._lock:
            self._closing = True
            if self._waiting is not None:
                self._waiting.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _reserve(self, loop: asyncio.AbstractEventLoop, size: int, held: int) -> int:
        """On the worker thread: wait until the pool takes ``size`` more bytes of a step counting ``held``; how
        many it counts (request_queue.py)."""
        if self._pool is None:
            return 0
        with self._lock:
            if self._closing:
                raise concurrent.futures.CancelledError("the endpoint is stopping")
            waiting = asyncio.run_coroutine_threadsafe(self._pool.reserve_produced(size, held), loop)
            self._waiting = waiting
        try:
            return waiting.result()
        finally:
            with self._lock:
                self._waiting = None


class _Grants:
    """One step's room in the pool: what the pool counts for it, and what of its grants it has not produced yet."""

    def __init__(self, work: HeavyWork, loop: asyncio.AbstractEventLoop) -> None:
        self._work = work
        self._loop = loop
        self._unused = 0
        self.reserved = 0

    def take(self, size: int) -> None:
        if size > self._unused:
            grant = max(size - self._unused, GRANT_BYTES)
            self.reserved += self._work._reserve(self._loop, grant, self.reserved)
            self._unused += grant
        self._unused -= size


def _let_go_once_called(step: Callable[[Reserve], T]) -> Callable[[Reserve], T]:
    """``step``, dropped as soon as it returns: the worker thread holds what it ran until after the caller has
    resumed, and a step may hold views of its request's frame, whose buffer is reused only once nothing views it
    (frame_buffers.py)."""
    held = [step]
    return lambda reserve: held.pop()(reserve)


def _release_unused() -> None:
    pa.default_memory_pool().release_unused()
