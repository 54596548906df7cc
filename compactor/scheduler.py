"""The automatic trigger: compact a partition when the raw bytes above its horizon pass
``compaction.threshold.bytes`` (0 turns the trigger off), checked every ``interval_s`` seconds, as Pulsar's broker
does with its compaction threshold; and, on a topic with remote.storage.enable, as soon as its view is one the
remote tier cannot copy (storage/compacted.py ``tier_can_copy``)."""

from __future__ import annotations

from compactor.errors import CompactionInProgressError
from compactor.run import CompactionResult, compact_partition
from storage import Store
from storage.compacted import CompactedLedgers
from storage.errors import LedgerviewError
from storage.periodic import PeriodicLoop


class CompactionScheduler(PeriodicLoop[list[tuple[str, CompactionResult]]]):
    """``check_once`` every ``interval_s`` seconds on a thread and a store of its own (storage/periodic.py)."""

    def __init__(self, store: Store, *, interval_s: float = 30.0) -> None:
        super().__init__("compaction", store, interval_s=interval_s)

    def run_once(self, now_ms: int | None = None) -> list[tuple[str, CompactionResult]]:
        return self.check_once()

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
                ledgers = CompactedLedgers(log.folder)
                cursor = ledgers.read_cursor()
                # a view the remote tier cannot copy (compacted before remote.storage.enable) is rewritten at once
                untiered = metadata.config.remote_storage_enable and cursor and not ledgers.tier_can_copy(cursor)
                if log.bytes_above(cursor.horizon if cursor else -1) <= threshold and not untiered:
                    continue
                try:
                    done.append((topic, compact_partition(log, clock=self.store.clock)))
                except CompactionInProgressError:
                    continue
                except Exception:  # recorded as the partition's ERROR status; the next check tries again
                    continue
        return done
