"""Which partitions the in-place cleaner cleans, and the state of each: Kafka's ``LogCleanerManager``.

Choosing (``log_to_clean``), for a partition of a topic whose cleanup.policy includes compact:

1. First dirty offset: the partition's entry in ``cleaner-offset-checkpoint`` (Kafka's file and format, one per
   data folder), or the log start offset without one. An entry below the log start offset or past the end offset
   is replaced by the log start offset, and the checkpoint is rewritten at once (Kafka's forceUpdateCheckpoint).
2. First uncleanable offset: the lowest of the active segment's base offset (the active segment is never
   cleaned), the base offset of the first dirty segment with a message newer than now - min.compaction.lag.ms,
   and the two-phase compaction hold (``Store.retention_hold``: with two-phase compaction on, raw data above its
   horizon is what the compacted view reads, so cleaning stays below it); rounded down to a segment's base offset.
3. Dirty ratio: cleanable bytes (the segments from the one holding the first dirty offset up to the first
   uncleanable offset) over those plus the clean bytes (segments below the first dirty offset). A partition is
   cleaned when the ratio is strictly above min.cleanable.dirty.ratio, or when its oldest dirty message is older
   than max.compaction.lag.ms and it has cleanable bytes. Filthiest first.

States (``CleaningState``), per partition, as Kafka's ``LogCleaningState``; a wrong call raises
CleanerStateError naming the current and the allowed states:

    IDLE --begin--> IN_PROGRESS --done--> IDLE
    IN_PROGRESS --abort_and_pause--> ABORTED --done--> PAUSED(1)      (the pass stops at its next batch)
    IDLE or PAUSED(n) --pause--> PAUSED(n + 1)    PAUSED(n) --resume--> PAUSED(n - 1) or IDLE
    any pass that fails with an error other than an abort: the partition is uncleanable (skipped, its error
    kept) until ``clear_uncleanable``; the other partitions are still cleaned. A partition whose writer lock
    another process holds (with lock_wait=False) is only skipped until the next pass.

The checkpoint moves only when a pass finishes: to its end offset.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from storage.checkpoints import PartitionKey, read_checkpoint, update_checkpoint
from storage.cleaner import MAP_ENTRY_BYTES, WINDOW_ROW_BYTES, CleanerStats, CleaningAbortedError, clean_log
from storage.errors import LedgerviewError, PartitionLockedError
from storage.locks import FileLock
from storage.partition_log import PartitionLog
from storage.retention import HoldReader, largest_timestamp_ms
from storage.segment import NO_TIMESTAMP

T = TypeVar("T")
DEFAULT_DEDUPE_BUFFER_BYTES = 128 * 1024 * 1024
"""Kafka's ``log.cleaner.dedupe.buffer.size``."""


@dataclass(frozen=True)
class CleanerConfig:
    """Settings of the cleaner itself (Kafka's broker-level ``log.cleaner.*``), not of a topic."""

    dedupe_buffer_bytes: int = DEFAULT_DEDUPE_BUFFER_BYTES
    """Memory for one pass's key map and the window of dirty messages being merged into it; past it, a pass
    cleans part of the dirty range and the next continues."""

    def __post_init__(self) -> None:
        if self.dedupe_buffer_bytes < 2 * (MAP_ENTRY_BYTES + WINDOW_ROW_BYTES):
            raise LedgerviewError(
                f"dedupe_buffer_bytes={self.dedupe_buffer_bytes} cannot hold one key; give at least "
                f"{2 * (MAP_ENTRY_BYTES + WINDOW_ROW_BYTES)} bytes (Kafka's default is {DEFAULT_DEDUPE_BUFFER_BYTES})."
            )

    @property
    def max_map_entries(self) -> int:
        """Half the budget holds the map."""
        return self.dedupe_buffer_bytes // 2 // MAP_ENTRY_BYTES

    @property
    def window_rows(self) -> int:
        """The other half holds the messages waiting to be merged into it."""
        return self.dedupe_buffer_bytes // 2 // WINDOW_ROW_BYTES


class CleaningState(enum.Enum):
    IDLE = "idle"
    IN_PROGRESS = "in progress"
    ABORTED = "aborted"
    PAUSED = "paused"


class CleanerStateError(LedgerviewError):
    def __init__(self, key: PartitionKey, action: str, state: CleaningState, allowed: Iterable[CleaningState]) -> None:
        self.key, self.state = key, state
        names = ", ".join(sorted(allowed_state.value for allowed_state in allowed))
        super().__init__(
            f"Cannot {action} cleaning of {key[0]}-{key[1]}: it is {state.value}, and {action} is allowed only "
            f"when it is {names}."
        )


@dataclass(frozen=True)
class LogToClean:
    """Kafka's ``LogToClean``: one partition's clean and cleanable sizes and bounds."""

    log: PartitionLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_cleaning_now: bool
    """Its oldest dirty message is older than max.compaction.lag.ms."""

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def eligible(self) -> bool:
        if self.clean_bytes + self.cleanable_bytes == 0:
            return False
        return (self.needs_cleaning_now and self.cleanable_bytes > 0) or (
            self.dirty_ratio > self.log.config.min_cleanable_dirty_ratio)


def first_dirty_offset(log: PartitionLog, checkpoint: int | None) -> tuple[int, bool]:
    """Step 1 of the module docstring: (first dirty offset, whether the checkpoint must be rewritten)."""
    if checkpoint is None:
        return log.log_start_offset, False
    if checkpoint < log.log_start_offset or checkpoint > log.end_offset:
        return log.log_start_offset, True
    return checkpoint, False


def log_to_clean(log: PartitionLog, first_dirty: int, *, hold: int | None, now_ms: int) -> LogToClean:
    """Steps 2 and 3 of the module docstring, for a log already caught up with its files."""
    config = log.config
    sealed = log.segments[:-1]
    dirty = [segment for segment in sealed if segment.next_offset > first_dirty]
    bound = log.active.base_offset
    if config.min_compaction_lag_ms > 0:
        too_new = [segment.base_offset for segment in dirty
                   if largest_timestamp_ms(segment) > now_ms - config.min_compaction_lag_ms]
        bound = min([bound, *too_new])
    if hold is not None:
        bound = min(bound, hold)
    bound = max(first_dirty, bound)
    first_uncleanable = max([segment.base_offset for segment in log.segments if segment.base_offset <= bound])
    clean_bytes = sum(segment.size_bytes for segment in sealed if segment.base_offset < first_dirty)
    cleanable = [segment for segment in dirty if segment.base_offset < first_uncleanable]
    first_batch_times = [segment.first_timestamp for segment in dirty if segment.first_timestamp > NO_TIMESTAMP]
    overdue = bool(first_batch_times) and min(first_batch_times) < now_ms - config.max_compaction_lag_ms
    return LogToClean(log, first_dirty, first_uncleanable, clean_bytes,
                      sum(segment.size_bytes for segment in cleanable), overdue)


class CleanerManager:
    """Cleaning state and checkpoints of one store's partitions. Thread-safe: a cleaner loop runs on a thread of
    its own while other threads pause, resume or abort."""

    def __init__(self, checkpoint_path: Path, store_lock: FileLock, config: CleanerConfig) -> None:
        self.checkpoint_path = checkpoint_path
        self.store_lock = store_lock
        self.config = config
        self._states: dict[PartitionKey, CleaningState] = {}
        self._pauses: dict[PartitionKey, int] = {}
        self._uncleanable: dict[PartitionKey, str] = {}
        self._condition = threading.Condition()

    # ---------------------------------------------------------------------------------------------- states
    def state(self, key: PartitionKey) -> CleaningState:
        with self._condition:
            return self._states.get(key, CleaningState.IDLE)

    def pause_depth(self, key: PartitionKey) -> int:
        with self._condition:
            return self._pauses.get(key, 0)

    def uncleanable(self) -> dict[PartitionKey, str]:
        """Partitions skipped because a pass failed, with the error."""
        with self._condition:
            return dict(self._uncleanable)

    def clear_uncleanable(self, key: PartitionKey) -> None:
        with self._condition:
            self._uncleanable.pop(key, None)

    def _require(self, key: PartitionKey, action: str, *allowed: CleaningState) -> CleaningState:
        state = self._states.get(key, CleaningState.IDLE)
        if state not in allowed:
            raise CleanerStateError(key, action, state, allowed)
        return state

    def _set(self, key: PartitionKey, state: CleaningState, pauses: int = 0) -> None:
        if state is CleaningState.IDLE:
            self._states.pop(key, None)
        else:
            self._states[key] = state
        if pauses:
            self._pauses[key] = pauses
        else:
            self._pauses.pop(key, None)
        self._condition.notify_all()

    def pause(self, key: PartitionKey) -> None:
        """Keep the partition from being cleaned until as many ``resume`` calls; it must not be being cleaned
        (``abort_and_pause`` stops a pass in progress)."""
        with self._condition:
            self._require(key, "pause", CleaningState.IDLE, CleaningState.PAUSED)
            self._set(key, CleaningState.PAUSED, self._pauses.get(key, 0) + 1)

    def resume(self, key: PartitionKey) -> None:
        """Undo one pause."""
        with self._condition:
            self._require(key, "resume", CleaningState.PAUSED)
            depth = self._pauses[key] - 1
            self._set(key, CleaningState.PAUSED if depth else CleaningState.IDLE, depth)

    def abort_and_pause(self, key: PartitionKey, *, timeout_s: float | None = None) -> None:
        """Kafka's ``abortAndPauseCleaning``: stop a pass in progress at its next batch (its cleaned files are
        removed and its checkpoint stays) and pause the partition; returns once it is paused."""
        with self._condition:
            state = self._states.get(key, CleaningState.IDLE)
            if state is CleaningState.IN_PROGRESS:
                self._set(key, CleaningState.ABORTED)
            elif state is not CleaningState.ABORTED:
                self._set(key, CleaningState.PAUSED, self._pauses.get(key, 0) + 1)
            if not self._condition.wait_for(lambda: self._states.get(key) is CleaningState.PAUSED, timeout_s):
                raise TimeoutError(f"cleaning of {key[0]}-{key[1]} did not stop within {timeout_s} s")

    def abort(self, key: PartitionKey, *, timeout_s: float | None = None) -> None:
        """Stop a pass in progress without leaving the partition paused."""
        self.abort_and_pause(key, timeout_s=timeout_s)
        self.resume(key)

    def is_aborted(self, key: PartitionKey) -> bool:
        with self._condition:
            return self._states.get(key) is CleaningState.ABORTED

    def begin(self, key: PartitionKey) -> bool:
        """IDLE -> IN_PROGRESS; False (nothing changes) when the partition is paused, busy or uncleanable."""
        with self._condition:
            if key in self._uncleanable or key in self._states:
                return False
            self._set(key, CleaningState.IN_PROGRESS)
            return True

    def done(self, key: PartitionKey, end_offset: int | None) -> None:
        """End a pass: IN_PROGRESS -> IDLE, the checkpoint moved to ``end_offset`` (None: the pass did not
        finish); ABORTED -> PAUSED(1), the checkpoint left alone."""
        with self._condition:
            state = self._require(key, "finish", CleaningState.IN_PROGRESS, CleaningState.ABORTED)
            if state is CleaningState.ABORTED:
                self._set(key, CleaningState.PAUSED, 1)
                return
            if end_offset is not None:
                self.write_checkpoint(key, end_offset)
            self._set(key, CleaningState.IDLE)

    # ---------------------------------------------------------------------------------------------- checkpoints
    def read_checkpoints(self) -> dict[PartitionKey, int]:
        return read_checkpoint(self.checkpoint_path)

    def write_checkpoint(self, key: PartitionKey, offset: int | None) -> None:
        """Set (None: remove) one partition's first dirty offset, keeping the other partitions' entries."""
        update_checkpoint(self.checkpoint_path, self.store_lock, {key: offset})

    # ---------------------------------------------------------------------------------------------- cleaning
    def clean(self, logs: Iterable[tuple[PartitionLog, HoldReader]], *, now_ms: int) -> list[CleanerStats]:
        """One pass over each eligible partition of ``logs``, filthiest first; a partition that fails is marked
        uncleanable and the others go on. Returns the statistics of the passes that finished."""
        ranked = []
        for log, read_hold in logs:
            if not self._may_clean((log.topic, log.partition)):
                continue
            choice = self._guarded(log, functools.partial(self._choose, log, read_hold, now_ms))
            if choice is not None and choice.eligible:
                ranked.append((choice.dirty_ratio, log, read_hold))
        ranked.sort(key=lambda entry: -entry[0])
        finished = []
        for _, log, read_hold in ranked:
            stats = self._clean_one(log, read_hold, now_ms)
            if stats is not None:
                finished.append(stats)
        return finished

    def _may_clean(self, key: PartitionKey) -> bool:
        with self._condition:
            return key not in self._uncleanable and key not in self._states

    def _choose(self, log: PartitionLog, read_hold: HoldReader, now_ms: int) -> LogToClean:
        """Steps 1 to 3 of the module docstring, under the partition's writer lock; rewrites an invalid
        checkpoint entry at once."""
        key = (log.topic, log.partition)
        with log.writer_lock:
            log.settle()
            first_dirty, rewrite = first_dirty_offset(log, self.read_checkpoints().get(key))
            if rewrite:
                self.write_checkpoint(key, first_dirty)
            return log_to_clean(log, first_dirty, hold=read_hold(), now_ms=now_ms)

    def _guarded(self, log: PartitionLog, work: Callable[[], T]) -> T | None:
        """``work()``, or None when it was aborted, found the partition locked by another writer (a store opened
        with lock_wait=False), or failed (the partition is then marked uncleanable)."""
        try:
            return work()
        except (CleaningAbortedError, PartitionLockedError):  # stopped, or busy under another writer: next pass
            return None
        except Exception as error:  # one failing partition must not stop the cleaning of the others
            with self._condition:
                self._uncleanable[(log.topic, log.partition)] = f"{type(error).__name__}: {error}"
            return None

    def _clean_one(self, log: PartitionLog, read_hold: HoldReader, now_ms: int) -> CleanerStats | None:
        """One pass, the choice made again under the lock the pass holds (things may have changed)."""
        key = (log.topic, log.partition)
        if not self.begin(key):
            return None

        def work() -> CleanerStats | None:
            with log.writer_lock:
                choice = self._choose(log, read_hold, now_ms)
                if not choice.eligible:
                    return None
                stats = CleanerStats(log.topic, log.partition, choice.first_dirty_offset,
                                     dirty_ratio=choice.dirty_ratio)
                return clean_log(log, choice.first_dirty_offset, choice.first_uncleanable_offset, now_ms=now_ms,
                                 max_map_entries=self.config.max_map_entries, window_rows=self.config.window_rows,
                                 stats=stats, should_abort=lambda: self.is_aborted(key))

        stats = None
        try:
            stats = self._guarded(log, work)
        finally:
            self.done(key, stats.end_offset if stats is not None else None)
        return stats
