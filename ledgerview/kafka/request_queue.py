"""Kafka's ``queued.max.request.bytes``: the bytes of requests read but not answered yet, across all connections,
are bounded. A connection whose next request would pass the bound waits, its body unread, until answers free
enough: the endpoint stops reading from that socket and TCP pushes back on the client (Kafka mutes its channels
while its memory pool is exhausted). As in Kafka's pool, a request is let in whenever nothing else is queued (here:
nothing but stalled responses, below), so one request as large as socket.request.max.bytes always passes.

A frame's declared size is reserved before its body arrives, so frames sent in part (slowly, or never finished)
hold room they do not fill. So that large frames, complete or not, can never take the room small requests
(metadata, heartbeats, commits, fetch requests, a few produced messages) need, a frame larger than
SMALL_REQUEST_BYTES may fill the bound only up to its last 1/SMALL_REQUEST_SHARE; small frames may fill all of it.
A frame whose bytes stop arriving is closed after frame.stall.timeout.ms (ledgerview/kafka/server.py).

The batches of Fetch responses are counted here too, each from before it is encoded until it is sent
(ledgerview/kafka/response_sender.py), under the same rules (a batch is a request's size here). A connection holds at
most one piece not yet sent: it takes room for the next one only once the kernel has taken that one, as its client reads
(a Kafka channel likewise holds the response it built until it is sent, and reads nothing meanwhile). While it waits for
its client, its piece is stalled: it cannot be freed until that client reads. Once nothing but stalled pieces is queued,
the next request or piece passes whatever its size, as when nothing is queued: so a client that reads always progresses,
however many others never read, and the count passes the bound by at most one piece per connection whose client has not
read its last one, plus one request or piece. The same rules count the bytes the worker thread decompresses from
produced batches, each grant reserved before it is produced and kept until the decoded records are appended or refused
(ledgerview/kafka/heavy_work.py). The frames of requests waiting for the worker are parked: they cannot be freed before
the step running there ends, so that step's grants pass once nothing but parked frames, stalled pieces and its own
grants are queued, and one request always progresses; what such a step produces past the bound for large requests is not
counted, so small requests keep their share.

The fetch cache's encoded batches (batch_cache.py) live in the same bound, in the room nothing else uses: the cache
takes room only while requests and responses leave it free (never the small requests' share, never by waiting),
and so does a Fetch's read-ahead (take_spare: a batch is encoded ahead only if its buffer fits there twice, being
made and then cached),
and whenever a request, a fetched batch or a worker step needs room its least recently used entries are evicted
first. The free buffers kept for receiving frames and encoding fetched batches (reused_buffers.py) and the kept
batch layouts (batch_layouts.py) live there the same way, evicted before the cache. So requests, responses and
these caches together stay under queued.max.request.bytes, but for the passes above (Kafka keeps no such cache: it
leaves reuse to the OS page cache, outside its heap).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

SMALL_REQUEST_BYTES = 64 * 1024
"""A request frame of at most this many bytes is small."""
SMALL_REQUEST_SHARE = 8
"""The last 1/SMALL_REQUEST_SHARE of the bound is kept for small requests."""


class QueuedRequestBytes:
    """The bytes of requests in flight and the bound they keep under; used on the endpoint's event loop only."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.large_limit_bytes = limit_bytes - limit_bytes // SMALL_REQUEST_SHARE
        """The most bytes queued once a large request is let in."""
        self.queued_bytes = 0
        self.peak_bytes = 0
        """The most bytes queued at once so far."""
        self.waits = 0
        """How many requests (or fetched batches) had to wait for room so far."""
        self.parked_bytes = 0
        """Bytes of request frames waiting for (or at) the worker thread."""
        self.stalled_bytes = 0
        """Bytes of response pieces whose connections wait for their clients to read them (stall)."""
        self.cached_bytes = 0
        """Bytes the caches (free frame buffers, the fetch cache) hold in the bound (not in queued_bytes); evicted
        whenever room is needed."""
        self._evictors: list[Callable[[int], None]] = []
        self._freed = asyncio.Event()

    def share_with_cache(self, evict: Callable[[int], None]) -> None:
        """Let a cache hold room (take_cached); ``evict(n)`` must drop at least ``n`` of its bytes (or all it has)
        and give them back with release_cached. Caches are evicted in the order they were shared."""
        self._evictors.append(evict)

    def fits(self, size: int) -> bool:
        """Whether a request of ``size`` bytes may be read now, evicting cached bytes to make room: it fits under
        the bound, or nothing is queued but stalled responses (so the request passes whatever its size)."""
        limit = self.limit_bytes if size <= SMALL_REQUEST_BYTES else self.large_limit_bytes
        for evict in self._evictors:
            over = self.queued_bytes + self.cached_bytes + size - limit
            if over <= 0 or not self.cached_bytes:
                break
            evict(over)
        return self.queued_bytes <= self.stalled_bytes or self.queued_bytes + self.cached_bytes + size <= limit

    @property
    def cache_room(self) -> int:
        """Bytes a cache may still take: what is free under the bound for large requests (the small requests' share
        is never cached into); negative when the cache holds more than is free."""
        return self.large_limit_bytes - self.queued_bytes - self.cached_bytes

    def take_cached(self, size: int) -> bool:
        """Count ``size`` bytes a cache keeps, if they fit in cache_room now; False, counting nothing, if not."""
        if size > self.cache_room:
            return False
        self.cached_bytes += size
        return True

    def release_cached(self, size: int) -> None:
        """A cache dropped ``size`` bytes it had taken."""
        self.cached_bytes -= size
        self._wake()

    def take_spare(self, size: int, *, then_cached: int) -> bool:
        """Count ``size`` bytes of work no request waits for (a Fetch's read-ahead, response_sender.py) if they
        and ``then_cached`` more bytes, which a cache would keep of that work, fit in cache_room now; False,
        counting nothing, if not. Evicts nothing and never waits: such work takes only room nobody uses."""
        if size + then_cached > self.cache_room:
            return False
        self.queued_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
        return True

    async def reserve(self, size: int) -> None:
        """Wait until a request of ``size`` bytes fits (or nothing is queued), then count it."""
        if not self.fits(size):
            self.waits += 1
        while not self.fits(size):
            await self._freed.wait()
        self.queued_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)

    async def reserve_produced(self, size: int, held: int) -> int:
        """Wait until ``size`` more bytes of the worker's step fit, or until nothing but parked frames, stalled
        responses and the ``held`` bytes the step already counts is queued; then count them and return how many
        were counted. Past the bound for large requests (the progress case) only what fits under it is counted, so
        the step never takes the share kept for small requests: those bytes exist but are left out of the count."""
        def fits() -> bool:
            return self.fits(size) or self.queued_bytes - self.parked_bytes - self.stalled_bytes - held <= 0

        if not fits():
            self.waits += 1
        while not fits():
            await self._freed.wait()
        counted = size if self.fits(size) else max(0, min(size, self.large_limit_bytes - self.queued_bytes
                                                            - self.cached_bytes))
        self.queued_bytes += counted
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
        return counted

    def park(self, size: int) -> None:
        """A request frame of ``size`` bytes waits for the worker thread (negative: its step ended)."""
        self.parked_bytes += size
        self._wake()

    def stall(self, size: int) -> None:
        """``size`` bytes of response pieces wait for their client to read them (negative: it read them, or its
        connection ends)."""
        self.stalled_bytes += size
        self._wake()

    def release(self, size: int) -> None:
        """A request of ``size`` bytes was answered (or dropped): wake the connections waiting for room."""
        self.queued_bytes -= size
        self._wake()

    def _wake(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()
