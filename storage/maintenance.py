"""The store's background upkeep on a schedule: in-place cleaning of compacted topics, then retention of every
topic, as Kafka's cleaner thread follows each cleaning with ``deleteOldSegments``. The service calls ``start`` or
runs ``run_once`` on its own schedule; tests call ``run_once(now_ms)`` with their clock."""

from __future__ import annotations

from dataclasses import dataclass

from storage.cleaner import CleanerStats
from storage.periodic import PeriodicLoop, for_each_topic
from storage.retention import DeletedSegment
from storage.store import Store


@dataclass(frozen=True)
class MaintenanceResult:
    cleaned: list[CleanerStats]
    """One entry per partition pass that finished."""
    deleted: list[DeletedSegment]
    """Segments retention deleted."""


class MaintenanceLoop(PeriodicLoop):
    """Cleaning, then retention, over every topic every ``interval_s`` seconds (Kafka's cleaner backs off 15 s
    when idle). Failures per topic are in ``failures``; uncleanable partitions in ``store.cleaner.uncleanable()``."""

    name = "ledgerview-maintenance"

    def __init__(self, store: Store, *, interval_s: float = 15.0) -> None:
        super().__init__(store, interval_s=interval_s)

    def run_once(self, now_ms: int | None = None) -> MaintenanceResult:
        now = self.store.clock() if now_ms is None else now_ms
        cleaned, cleaning_failures = for_each_topic(self.store, lambda topic: self.store.clean(topic, now))
        deleted, retention_failures = for_each_topic(self.store,
                                                     lambda topic: self.store.enforce_retention(topic, now))
        self.failures = {**cleaning_failures, **retention_failures}
        return MaintenanceResult(cleaned, deleted)
