"""Kafka's ``queued.max.request.bytes``: the bytes of requests read but not answered yet, across all connections,
are bounded. A connection whose next request would pass the bound waits, its body unread, until answers free
enough: the endpoint stops reading from that socket and TCP pushes back on the client (Kafka mutes its channels
while its memory pool is exhausted). As in Kafka's pool, a request is let in whenever nothing else is queued, so
one request as large as socket.request.max.bytes always passes."""

from __future__ import annotations

import asyncio


class QueuedRequestBytes:
    """The bytes of requests in flight and the bound they keep under; used on the endpoint's event loop only."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.queued_bytes = 0
        self.peak_bytes = 0
        """The most bytes queued at once so far."""
        self.waits = 0
        """How many requests had to wait for room so far (the socket was not read meanwhile)."""
        self._freed = asyncio.Event()

    async def reserve(self, size: int) -> None:
        """Wait until a request of ``size`` bytes fits (or nothing is queued), then count it."""
        if self.queued_bytes and self.queued_bytes + size > self.limit_bytes:
            self.waits += 1
        while self.queued_bytes and self.queued_bytes + size > self.limit_bytes:
            await self._freed.wait()
        self.queued_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)

    def release(self, size: int) -> None:
        """A request of ``size`` bytes was answered (or dropped): wake the connections waiting for room."""
        self.queued_bytes -= size
        self._freed.set()
        self._freed = asyncio.Event()
