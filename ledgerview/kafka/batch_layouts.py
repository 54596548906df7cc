"""Record layouts computed to size fetched batches, kept until the batches are encoded, so that a batch is laid out
once per fetch.

A Fetch response's sizes come first on the wire, so every batch of it is laid out (record_encoding.record_layout:
each record's varint fields, their sizes and the record's extent, numpy arrays of about as many bytes as the encoded
batch for 100-byte messages) when the response is selected, and that layout is what its encoding needs. Layouts are
kept, least recently sized first out, at most LAYOUTS_BYTES_MAX, and only in room queued.max.request.bytes leaves free
(request_queue.py): they are dropped whenever a request, a fetched batch or a worker step needs that room (after the
free batch buffers, before the fetch cache's entries: batch_cache.py), and a batch whose layout is gone is laid out
again. The layouts of a response selected and never sent (a long poll's re-read, a connection that closes) age out.
Dropping them sooner matters too: the arrays come from glibc's heap, whose freed top goes back to the system, so
each layout computed is also about as many fresh pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from ledgerview.kafka.record_encoding import RecordLayout
from ledgerview.kafka.request_queue import QueuedRequestBytes

LAYOUTS_BYTES_MAX = 8 * 1024 * 1024
"""About eight 1 MiB batches' layouts: the batches of the next responses of a few consumers."""


class BatchLayouts:
    """Used on the endpoint's event loop only."""

    def __init__(self) -> None:
        self.size_bytes = 0
        self._layouts: OrderedDict[Hashable, RecordLayout] = OrderedDict()
        self._pool: QueuedRequestBytes | None = None

    def count_in(self, pool: QueuedRequestBytes) -> None:
        """Hold layouts in ``pool``'s room only, dropped whenever the pool needs it."""
        self.evict(self.size_bytes)
        self._pool = pool
        pool.share_with_cache(self.evict)

    def keep(self, key: Hashable, layout: RecordLayout) -> None:
        """Keep ``layout`` for the batch ``key`` names (instead of any kept before), if there is room for it."""
        self.take(key)
        size = layout.held_bytes
        if size > LAYOUTS_BYTES_MAX:
            return
        self.evict(self.size_bytes + size - LAYOUTS_BYTES_MAX)
        if self._pool is None or self._pool.take_cached(size):
            self._layouts[key] = layout
            self.size_bytes += size

    def take(self, key: Hashable) -> RecordLayout | None:
        """The layout kept for ``key``, no longer kept; None when there is none."""
        layout = self._layouts.pop(key, None)
        if layout is not None:
            self._release(layout)
        return layout

    def evict(self, size: int) -> None:
        """Drop the least recently kept layouts until at least ``size`` bytes (or all) are gone."""
        while size > 0 and self._layouts:
            _, layout = self._layouts.popitem(last=False)
            size -= layout.held_bytes
            self._release(layout)

    def _release(self, layout: RecordLayout | None) -> None:
        if layout is None:
            return
        self.size_bytes -= layout.held_bytes
        if self._pool is not None:
            self._pool.release_cached(layout.held_bytes)
