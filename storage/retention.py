"""Retention: which prefix of a partition's segments may be deleted, and why. Kafka's
``UnifiedLog.deleteOldSegments`` over ledgerview's partition logs.

One run over one partition (``enforce_partition_retention``), under the partition's writer lock:

1. Catch up with the files: another process may have appended, rolled, deleted or cleaned since this one last
   looked (``PartitionLog.settle``, which also finishes a swap a crashed cleaner left).
2. Plan (``plan_retention``). Walk the segments from the oldest with Kafka's three predicates, in Kafka's order,
   each on what the previous one left and each stopping at the first segment it keeps, so only a prefix goes:

   a. log start offset (whatever the cleanup.policy): the next segment's base offset is at or below the log start
      offset, which ``delete_records`` moved. The last segment never goes this way;
   b. size (cleanup.policy includes delete, retention.bytes >= 0): with ``diff`` = the log's size (every segment,
      the active one included) minus retention.bytes, nothing goes if ``diff`` < 0; otherwise a segment goes while
      ``diff - its size >= 0``, and ``diff`` shrinks by its size. The log so stays at least retention.bytes;
   c. time (cleanup.policy includes delete, retention.ms >= 0): ``now - its largest timestamp > retention.ms``
      (the log file's mtime stands in for a segment without messages). A segment with a future timestamp so holds
      back every later one.

   Whatever the predicate, a segment is kept when its upper bound (the next segment's base offset, or the end
   offset for the last segment) is above the two-phase compaction hold (``Store.retention_hold``): raw data the
   next compaction reads is never deleted. An empty last segment is never deleted.
3. If the prefix is every segment, the active one included, roll first (``PartitionLog.roll``): the new, empty
   active segment starts at the end offset, so the end offset never moves back and appends continue from it.
4. Delete the prefix (``PartitionLog.delete_segments_before``): move the log start offset up to the base offset of
   the first remaining segment (never down: an offset ``delete_records`` set inside that segment stays) and save
   it in the log-start-offset checkpoint; then drop the segments from the list and rename their files
   ``.deleted``. Readers that hold them keep reading (see ``Segment.rename_to_deleted``).
5. Remove the partition's ``.deleted`` files renamed at least ``file.delete.delay.ms`` ago, on the clock that
   renamed them. Leftovers of a crash are removed when the partition is opened (storage/loader.py).

``delete_records`` is Kafka's DeleteRecords: under the same lock it checks the offset (within the log, not past
the hold, on a topic whose cleanup.policy includes delete, as Kafka requires), fsyncs the log up to it, moves the
log start offset there (possibly into the middle of a segment), then runs steps 2a, 3 to 5.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from storage.config import TopicConfig
from storage.errors import LedgerviewError
from storage.files import DELETED_SUFFIX, parse_segment_file
from storage.partition_log import PartitionLog
from storage.periodic import PeriodicLoop, for_each_topic
from storage.segment import NO_TIMESTAMP, Segment, SegmentReads

if TYPE_CHECKING:
    from storage.store import Store

S = TypeVar("S", bound=SegmentReads)
HoldReader = Callable[[], int | None]
"""Reads the two-phase compaction hold now (``Store.retention_hold``): the lowest offset that must stay."""


class RetentionReason(enum.StrEnum):
    """Why retention deleted a segment: Kafka's three breaches."""

    LOG_START_OFFSET = "log start offset"
    RETENTION_BYTES = "retention.bytes"
    RETENTION_MS = "retention.ms"
    LOCAL_RETENTION_BYTES = "local.retention.bytes"
    """Only the local copy of an uploaded segment went: it stays in the log, on the remote tier."""
    LOCAL_RETENTION_MS = "local.retention.ms"
    """Only the local copy of an uploaded segment went: it stays in the log, on the remote tier."""


ALL_REASONS = frozenset({RetentionReason.LOG_START_OFFSET, RetentionReason.RETENTION_BYTES,
                         RetentionReason.RETENTION_MS})
LOCAL_REASONS = {RetentionReason.RETENTION_BYTES: RetentionReason.LOCAL_RETENTION_BYTES,
                 RetentionReason.RETENTION_MS: RetentionReason.LOCAL_RETENTION_MS}
"""What plan_retention's reasons mean when it plans local retention with the local.retention.* values."""


@dataclass(frozen=True)
class DeletedSegment:
    """A segment retention deleted: renamed ``.deleted`` now, its files removed after file.delete.delay.ms."""

    topic: str
    partition: int
    base_offset: int
    """The segment's first offset (its name)."""
    next_offset: int
    """The offset after its last message."""
    size_bytes: int
    reason: RetentionReason


@dataclass(frozen=True)
class DeleteRecordsResult:
    """What ``delete_records`` did to one partition."""

    topic: str
    partition: int
    log_start_offset: int
    """The partition's log start offset now: reads below it raise OffsetOutOfRangeError."""
    deleted: list[DeletedSegment]
    """The segments wholly below the new log start offset, deleted at once."""


class DeleteRecordsOutOfRangeError(LedgerviewError):
    def __init__(self, topic: str, partition: int, offset: object, start: int, end: int) -> None:
        self.offset, self.start, self.end = offset, start, end
        super().__init__(
            f"Cannot delete records of {topic}-{partition} before offset {offset!r}: it must be an offset from the "
            f"log start offset {start} to the end offset {end}. Nothing was changed."
        )


class RetentionHoldError(LedgerviewError):
    def __init__(self, topic: str, partition: int, offset: int, hold: int) -> None:
        self.offset, self.hold = offset, hold
        super().__init__(
            f"Cannot delete records of {topic}-{partition} before offset {offset}: two-phase compaction still has to "
            f"read the raw messages from offset {hold} on (the partition's retention hold). Nothing was changed. "
            f"Compact the partition first, so that its horizon reaches offset {offset - 1}; or, if the topic was "
            "never compacted, set compaction.threshold.bytes=0 to turn two-phase compaction off."
        )


class RecordDeletionNotAllowedError(LedgerviewError):
    def __init__(self, topic: str, partition: int, cleanup_policy: Collection[str]) -> None:
        policy = ",".join(sorted(cleanup_policy))
        super().__init__(
            f"Cannot delete records of {topic}-{partition}: its cleanup.policy is {policy}, without delete, and "
            "such a topic keeps at least the latest value of every key (Kafka refuses DeleteRecords there too). "
            "Set cleanup.policy=compact,delete to allow it. Nothing was changed."
        )


# ------------------------------------------------------------------------------------------------------ policy
def plan_retention(segments: Sequence[S], *, end_offset: int, log_start_offset: int, hold: int | None,
                   config: TopicConfig, now_ms: int, reasons: Collection[RetentionReason] = ALL_REASONS) -> (
    list[tuple[S, RetentionReason]]
):
    """The deletable prefix of ``segments`` (oldest first) with the reason each goes: step 2 of the module doc.

    ``reasons`` limits the predicates tried (delete_records tries only the log start offset).
    """
    plan: list[tuple[S, RetentionReason]] = []

    def take(reason: RetentionReason, predicate: Callable[[S, S | None], bool]) -> None:
        while len(plan) < len(segments):
            segment = segments[len(plan)]
            following = segments[len(plan) + 1] if len(plan) + 1 < len(segments) else None
            upper_bound = following.base_offset if following is not None else end_offset
            if hold is not None and upper_bound > hold:
                return
            if following is None and segment.size_bytes == 0:
                return
            if not predicate(segment, following):
                return
            plan.append((segment, reason))

    if RetentionReason.LOG_START_OFFSET in reasons:
        take(RetentionReason.LOG_START_OFFSET,
             lambda _, following: following is not None and following.base_offset <= log_start_offset)
    if not config.is_delete:
        return plan
    if RetentionReason.RETENTION_BYTES in reasons and config.retention_bytes >= 0:
        diff = sum(segment.size_bytes for segment in segments[len(plan) :]) - config.retention_bytes

        def leaves_enough(segment: S, _: S | None) -> bool:
            nonlocal diff
            if diff - segment.size_bytes < 0:
                return False
            diff -= segment.size_bytes
            return True

        if diff >= 0:
            take(RetentionReason.RETENTION_BYTES, leaves_enough)
    if RetentionReason.RETENTION_MS in reasons and config.retention_ms >= 0:
        take(RetentionReason.RETENTION_MS,
             lambda segment, _: now_ms - largest_timestamp_ms(segment) > config.retention_ms)
    return plan


def largest_timestamp_ms(segment: SegmentReads) -> int:
    """Kafka's ``LogSegment.largestTimestamp``: the largest message timestamp, or when the segment was written."""
    return segment.max_timestamp if segment.max_timestamp != NO_TIMESTAMP else segment.written_ms()


# ------------------------------------------------------------------------------------------------ enforcement
def enforce_partition_retention(log: PartitionLog, *, read_hold: HoldReader, now_ms: int) -> list[DeletedSegment]:
    """One retention run over one partition (the module doc's steps 1 to 5); returns what it deleted."""
    with log.writer_lock:
        log.settle()
        plan = plan_retention(log.segments, end_offset=log.end_offset, log_start_offset=log.log_start_offset,
                              hold=read_hold(), config=log.config, now_ms=now_ms)
        deleted = _delete_prefix(log, plan, now_ms=now_ms)
        remove_expired_deleted_files(log.folder, now_ms=now_ms, delay_ms=log.config.file_delete_delay_ms)
        return deleted


def delete_records(log: PartitionLog, before_offset: int, *, read_hold: HoldReader, now_ms: int) -> (
    DeleteRecordsResult
):
    """Kafka's DeleteRecords: make ``before_offset`` the log start offset, then delete the segments wholly below
    it. Every check runs before anything changes."""
    with log.writer_lock:
        log.settle()
        if not log.config.is_delete:
            raise RecordDeletionNotAllowedError(log.topic, log.partition, log.config.cleanup_policy)
        valid = isinstance(before_offset, int) and not isinstance(before_offset, bool)
        if not valid or not log.log_start_offset <= before_offset <= log.end_offset:
            raise DeleteRecordsOutOfRangeError(log.topic, log.partition, before_offset, log.log_start_offset,
                                               log.end_offset)
        hold = read_hold()
        if hold is not None and before_offset > hold:
            raise RetentionHoldError(log.topic, log.partition, before_offset, hold)
        if before_offset > log.recovery_point:
            log.flush()  # the checkpoint must never name an offset that a crash could take back
        log.move_log_start_offset(before_offset)
        plan = plan_retention(log.segments, end_offset=log.end_offset, log_start_offset=log.log_start_offset,
                              hold=hold, config=log.config, now_ms=now_ms,
                              reasons={RetentionReason.LOG_START_OFFSET})
        deleted = _delete_prefix(log, plan, now_ms=now_ms)
        remove_expired_deleted_files(log.folder, now_ms=now_ms, delay_ms=log.config.file_delete_delay_ms)
        return DeleteRecordsResult(log.topic, log.partition, log.log_start_offset, deleted)


def _delete_prefix(log: PartitionLog, plan: list[tuple[Segment, RetentionReason]], *, now_ms: int) -> (
    list[DeletedSegment]
):
    """Steps 3 and 4; the caller holds the writer lock and planned on ``log.segments`` as they are."""
    if not plan:
        return []
    deleted = [DeletedSegment(log.topic, log.partition, segment.base_offset, segment.next_offset,
                              segment.size_bytes, reason) for segment, reason in plan]
    if len(plan) == len(log.segments):
        log.roll()
    log.delete_segments_before(log.segments[len(plan)].base_offset, now_ms=now_ms)
    return deleted


def remove_expired_deleted_files(folder: Path, *, now_ms: int, delay_ms: int) -> list[str]:
    """Remove the segment files renamed ``.deleted`` at least ``delay_ms`` before ``now_ms`` (their mtime is the
    time of the rename, see ``Segment.rename_to_deleted``); returns the names removed."""
    removed = []
    for name in sorted(os.listdir(folder)):
        parsed = parse_segment_file(name)
        if parsed is None or parsed[2] != DELETED_SUFFIX:
            continue
        path = folder / name
        try:
            if path.stat().st_mtime_ns // 1_000_000 + delay_ms <= now_ms:
                path.unlink()
                removed.append(name)
        except FileNotFoundError:
            continue  # removed meanwhile by a process opening the partition
    return removed


# ------------------------------------------------------------------------------------------------------- loop
class RetentionLoop(PeriodicLoop[list[DeletedSegment]]):
    """Retention over every topic of a store, every ``interval_s`` seconds (Kafka's
    ``log.retention.check.interval.ms``, 300 s by default); storage/maintenance.py runs the cleaner too."""

    def __init__(self, store: Store, *, interval_s: float = 300.0) -> None:
        super().__init__("retention", store, interval_s=interval_s)

    def run_once(self, now_ms: int | None = None) -> list[DeletedSegment]:
        deleted, self.stats.topic_errors = for_each_topic(
            self.store, lambda topic: self.store.enforce_retention(topic, now_ms))
        return deleted
