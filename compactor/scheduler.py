"""The automatic trigger: compact a partition when the raw bytes above its horizon pass
``compaction.threshold.bytes`` (0 turns the trigger off), checked every ``interval_s`` seconds, as Pulsar's broker
does with its compaction threshold."""

from __future__ import annotations

import threading

from compactor.errors import CompactionInProgressError
from compactor.run import CompactionResult, compact_partition
from storage import Store
from storage.compacted import CompactedLedgers
from storage.errors import LedgerviewError


class CompactionScheduler:
    def __init__(self, store: Store, *, interval_s: float = 30.0) -> None:
        # A store of its own: the checks run on another thread, and Store objects are not shared across threads.
        # Processes and Store objects on one folder coordinate through file locks.
        self.store = Store.open(store.root, lock_wait=True, verify_reads=store.verify_reads, clock=store.clock)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> list[tuple[str, CompactionResult]]:
        """Compact every partition past its threshold now; failures are left in the partition's status."""
        done = []
        for topic in self.store.list_topics():
            try:
                metadata = self.store.topic_metadata(topic)
            except LedgerviewError:
                continue  # deleted meanwhile
            threshold = metadata.config.compaction_threshold_bytes
            if threshold <= 0:
                continue
            for partition in range(metadata.partitions):
                log = self.store.partition_log(topic, partition)
                log.refresh()
                cursor = CompactedLedgers(log.folder).read_cursor()
                if log.bytes_above(cursor.horizon if cursor else -1) <= threshold:
                    continue
                try:
                    done.append((topic, compact_partition(log, clock=self.store.clock)))
                except CompactionInProgressError:
                    continue
                except Exception:  # recorded as the partition's ERROR status; the next check tries again
                    continue
        return done

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ledgerview-compaction-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop after the check in progress, and close the scheduler's store."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.store.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check_once()
