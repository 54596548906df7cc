"""Errors of the two-phase compactor."""

from __future__ import annotations

from storage.errors import LedgerviewError


class CompactionInProgressError(LedgerviewError):
    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        super().__init__(
            f"Compaction of {topic}-{partition} is already running; wait for it to finish "
            "(see the compaction status) before starting another."
        )
