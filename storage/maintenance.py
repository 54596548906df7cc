"""The store's background upkeep on a schedule: in-place cleaning of compacted topics (``CleanerLoop``), and
cleaning then retention of every topic (``MaintenanceLoop``), as Kafka's cleaner thread follows each cleaning with
``deleteOldSegments``. Callers ``start`` and ``stop`` them or run ``run_once`` on their own schedule; tests call
``run_once(now_ms)`` with their clock."""

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


def clean_every_topic(store: Store, now_ms: int | None) -> tuple[list[CleanerStats], dict[str, str]]:
    """One cleaning pass over every topic, and the error of each topic where it failed or has an uncleanable
    partition (which the cleaner skips until ``store.cleaner.clear_uncleanable``)."""
    cleaned, failures = for_each_topic(store, lambda topic: store.clean(topic, now_ms))
    for (topic, partition), error in store.cleaner.uncleanable().items():
        failures.setdefault(topic, f"partition {partition} is uncleanable: {error}")
    return cleaned, failures


class CleanerLoop(PeriodicLoop[list[CleanerStats]]):
    """In-place cleaning of every compact topic every ``interval_s`` seconds (Kafka's log cleaner thread)."""

    def __init__(self, store: Store, *, interval_s: float = 15.0) -> None:
        super().__init__("cleaner", store, interval_s=interval_s)

    def run_once(self, now_ms: int | None = None) -> list[CleanerStats]:
        cleaned, self.stats.topic_errors = clean_every_topic(self.store, now_ms)
        return cleaned


class MaintenanceLoop(PeriodicLoop[MaintenanceResult]):
    """Cleaning, then retention, over every topic every ``interval_s`` seconds (Kafka's cleaner backs off 15 s
    when idle). The topics a pass failed on, uncleanable partitions included, are in ``failures``."""

    def __init__(self, store: Store, *, interval_s: float = 15.0) -> None:
        super().__init__("maintenance", store, interval_s=interval_s)

    def run_once(self, now_ms: int | None = None) -> MaintenanceResult:
        now = self.store.clock() if now_ms is None else now_ms
        cleaned, cleaning_failures = clean_every_topic(self.store, now)
        deleted, retention_failures = for_each_topic(self.store,
                                                     lambda topic: self.store.enforce_retention(topic, now))
        self.stats.topic_errors = {**cleaning_failures, **retention_failures}
        return MaintenanceResult(cleaned, deleted)
