"""What both streaming sources (the ledgerview source and the Kafka ingest source) share about offsets: Kafka's
codes for earliest and latest, the split of a micro-batch's row limit over partitions, and the data-loss error
reported when retention deleted offsets a query still had to read."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from datetime import UTC, datetime
from typing import TypeVar

from storage.errors import LedgerviewError

EARLIEST, LATEST = -2, -1
"""startingOffsets codes in JSON, as in Spark's Kafka source."""

PartitionKey = TypeVar("PartitionKey", bound=Hashable)


class DataLossError(LedgerviewError):
    def __init__(self, topic: str, partition: int, wanted: int, log_start: int, message: str | None = None) -> None:
        self.topic, self.partition, self.wanted, self.log_start = topic, partition, wanted, log_start
        super().__init__(message or (
            f"Data loss in {topic}-{partition}: the query needs offsets from {wanted}, but retention deleted "
            f"everything below {log_start} ({log_start - wanted} messages lost). Set failOnDataLoss=false to "
            "skip them and go on from the log start."
        ))


class DeletionLossError(DataLossError):
    """The compacted view stands in for raw offsets retention deleted, but it leaves deleted keys out rather than
    keeping their tombstones, so a query that holds keys from before those offsets cannot learn of deletions in
    them."""

    def __init__(self, topic: str, partition: int, wanted: int, log_start: int, dropped: tuple[int, int]) -> None:
        first, last = dropped
        where = f"offset {first}" if first == last else f"offsets {first} to {last}"
        super().__init__(
            topic, partition, wanted, log_start,
            f"Data loss in {topic}-{partition}: the query goes on from offset {wanted} of a view it did not read "
            f"from the current compacted ledger, and retention (or delete-records) has since removed every raw "
            f"offset below {log_start}. The compacted view stands in for the removed offsets, but it leaves deleted "
            f"keys out, and its compaction cursor says deletions (tombstones) it cannot show may lie in {where}: "
            "a key the query read may have been deleted without it seeing so. Set failOnDataLoss=false to go on "
            "from the compacted view (such keys then stay), or start the query again on a new checkpoint to read "
            "the whole view afresh."
        )
        self.dropped = dropped
        """Offsets, first and last, among the deleted ones, that hold such a tombstone (or may: see
        storage/dropped_tombstones.py)."""


class TopicRecreatedError(LedgerviewError):
    def __init__(self, topic: str, partition: int, position: int, end: int) -> None:
        self.topic, self.partition, self.position, self.end = topic, partition, position, end
        super().__init__(
            f"Data loss in {topic}-{partition}: the query read up to offset {position}, but the log now ends at "
            f"{end}: the topic was deleted and created again (or lost messages it had not flushed), and the "
            "query's offsets name messages of the old log. Set failOnDataLoss=false to read the partition again "
            "from its start, or start the query on a new checkpoint."
        )


class TopicReplacedError(LedgerviewError):
    def __init__(self, topic: str, was_created_ms: int, created_ms: int) -> None:
        self.topic, self.was_created_ms, self.created_ms = topic, was_created_ms, created_ms
        super().__init__(
            f"Data loss in {topic}: the query's offsets belong to the topic created at {_utc(was_created_ms)}, but "
            f"it was deleted and created again at {_utc(created_ms)}: going on from them would skip the new log's "
            "first messages. Set failOnDataLoss=false to read every partition again from its start, or start the "
            "query on a new checkpoint."
        )


def _utc(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def checked_start(topic: str, partition: int, wanted: int, log_start: int, *, fail_on_data_loss: bool) -> int:
    """Where a read planned from ``wanted`` starts: ``wanted`` itself, or the log start when retention deleted
    the offsets in between and failOnDataLoss is off (with it on, DataLossError)."""
    if wanted >= log_start:
        return wanted
    if fail_on_data_loss:
        raise DataLossError(topic, partition, wanted, log_start)
    return log_start


def admitted(begin: Mapping[PartitionKey, int], ends: Mapping[PartitionKey, int],
             max_rows: int) -> dict[PartitionKey, int]:
    """End offsets admitting at most ``max_rows`` messages after ``begin`` (0 for a partition it lacks), shared
    in proportion to what each partition has waiting, the remainder to the largest fractions (at least one
    message overall, so a query always moves)."""
    waiting = {p: max(0, end - begin.get(p, 0)) for p, end in ends.items()}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(ends)
    shares = {p: waiting[p] * max_rows // total for p in waiting}
    spare = max_rows - sum(shares.values())
    # The spare messages are the sum of the shares' fractions (an integer), so the partitions with the largest
    # fractions, each below 1 and above 0, take one more message each: every share is its exact proportion
    # rounded down or up.
    for p in sorted(waiting, key=lambda p: waiting[p] * max_rows % total, reverse=True)[:spare]:
        shares[p] += 1
    return {p: begin.get(p, 0) + shares[p] for p in ends}
