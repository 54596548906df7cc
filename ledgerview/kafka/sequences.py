"""Idempotent producers: producer ids, and each partition's producer state (storage/producer_state.py), kept on disk
so that a batch retried across a kill -9 of the endpoint is answered as the duplicate it is, not stored twice.

A partition's state is loaded the first time this endpoint produces to it, under its writer lock, before the
endpoint appends anything there (loading drops journal lines of batches a crash stopped before they were
written, whose offsets a later append would reuse).
"""

from __future__ import annotations

import itertools
import logging
import time

from storage.errors import LedgerviewError
from storage.partition_log import PartitionLog
from storage.producer_state import ProducerState

log = logging.getLogger(__name__)


class ProducerSequences:
    def __init__(self) -> None:
        # Ids start at the clock's microseconds, so ids given out before a restart are not given out again.
        self._next_producer_id = itertools.count(time.time_ns() // 1000)
        self._states: dict[tuple[str, int], tuple[PartitionLog, ProducerState]] = {}

    def new_producer_id(self) -> int:
        return next(self._next_producer_id)

    def state_of(self, partition_log: PartitionLog) -> ProducerState:
        """The producer state of ``partition_log``, loaded on first use; the caller holds its writer lock and has
        refreshed it. A log opened again (its topic deleted and created anew) gets its state loaded again, and the
        old state's journal is closed (it must not be used after)."""
        key = (partition_log.topic, partition_log.partition)
        known = self._states.get(key)
        if known is not None and known[0] is partition_log:
            return known[1]
        if known is not None:
            known[1].close_journal()  # no snapshot: its folder may be the new log's by now
        state = ProducerState.load(partition_log.folder, end_offset=partition_log.end_offset,
                                   now_ms=partition_log.clock())
        partition_log.register_before_fsync(state.sync)  # the journal is durable whenever the log is
        self._states[key] = (partition_log, state)
        return state

    def close(self) -> None:
        """Snapshot every partition's state (a clean shutdown), each under its writer lock."""
        for (topic, partition), (partition_log, state) in self._states.items():
            try:
                with partition_log.writer_lock:
                    partition_log.refresh()
                    state.close(partition_log.end_offset, partition_log.clock())
            except (LedgerviewError, OSError) as error:
                log.warning("could not snapshot the producer state of %s-%d on close: %s", topic, partition, error)
        self._states.clear()

