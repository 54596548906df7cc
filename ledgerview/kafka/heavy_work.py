"""The endpoint's CPU-heavy request steps, run on one worker thread so the event loop keeps serving every other
connection meanwhile: decompressing and decoding produced batches (a compression bomb inflates for hundreds of
milliseconds before its bound stops it). One worker at a time bounds the memory those steps take together to one
request's (socket.request.max.bytes of decompressed records); a connection awaits its step before reading its next
request, so its responses still leave in request order. The step must not touch the store: Store objects are not
shared across threads (storage/periodic.py)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class HeavyWork:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-heavy-work")

    async def run(self, step: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``step(*args, **kwargs)`` on the worker thread, once the steps queued before it are done."""
        return await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                functools.partial(step, *args, **kwargs))

    def close(self) -> None:
        """Wait for the running step; drop the queued ones."""
        self._executor.shutdown(wait=True, cancel_futures=True)
