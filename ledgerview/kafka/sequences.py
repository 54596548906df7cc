"""Idempotent producers: producer ids, and the recent batches of each so a retried batch is not stored twice.

Kafka keeps the last five batches per producer and partition (a producer has at most five in flight) and answers
a retry of one with the offset it got the first time. This table is in memory: a retry that crosses a restart
of the endpoint is stored again (at-least-once), as documented in docs/kafka.md.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

BATCHES_REMEMBERED = 5
SequenceKey = tuple[str, int, int, int]
"""Topic, partition, producer id, producer epoch."""


class ProducerSequences:
    def __init__(self) -> None:
        # Ids start at the clock's microseconds, so ids given out before a restart are not given out again.
        self._next_producer_id = itertools.count(time.time_ns() // 1000)
        self._recent: dict[SequenceKey, deque[tuple[int, int]]] = {}

    def new_producer_id(self) -> int:
        return next(self._next_producer_id)

    def stored_offset(self, key: SequenceKey, base_sequence: int) -> int | None:
        """The base offset a batch with this sequence got, if it is one of the recent ones."""
        for sequence, offset in self._recent.get(key, ()):
            if sequence == base_sequence:
                return offset
        return None

    def remember(self, key: SequenceKey, base_sequence: int, base_offset: int) -> None:
        self._recent.setdefault(key, deque(maxlen=BATCHES_REMEMBERED)).append((base_sequence, base_offset))
