"""The Pulsar-style two-phase compactor: writes each partition's compacted view as a separate ledger and never
touches the raw segments. See compactor/run.py for the algorithm and storage/compacted.py for the publish."""

from __future__ import annotations

from compactor.errors import CompactionInProgressError
from compactor.run import CompactionResult, compact_partition
from storage import Store
from storage.compacted import CompactedLedgers
from storage.compaction_status import CompactionState, CompactionStatus
from storage.files import partition_folder

__all__ = ["CompactionInProgressError", "CompactionResult", "CompactionState", "CompactionStatus", "Compactor"]


class Compactor:
    """Compacts topics of one store, on demand; see compactor/scheduler.py for the automatic trigger."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def compact(self, topic: str, partitions: list[int] | None = None) -> list[CompactionResult]:
        """Compact each partition (all by default) in turn; one result per partition. On a tiered topic the raw
        segments may be remote, and the new ledgers are uploaded too (``Store.sync_remote``)."""
        metadata = self.store.topic_metadata(topic)
        chosen = range(metadata.partitions) if partitions is None else partitions
        results = [compact_partition(self.store.partition_log(topic, p), clock=self.store.clock) for p in chosen]
        if self.store.remote is not None and metadata.config.remote_storage_enable:
            self.store.sync_remote(topic)  # the new ledgers go to the remote tier (once the raw tail is there)
        return results

    def status(self, topic: str) -> list[CompactionStatus]:
        """Pulsar's compaction status of every partition: NOT_RUN, RUNNING, SUCCESS or ERROR with its details."""
        statuses = []
        for partition in range(self.store.topic_metadata(topic).partitions):
            statuses.append(CompactedLedgers(partition_folder(self.store.root, topic, partition)).status(partition))
        return statuses
