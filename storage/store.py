"""The store: the public storage API over a data folder of topics, each a set of partition logs.

The facade: it opens and closes the store, opens (and recovers) partition logs, and serves reads, retention,
cleaning and the remote tier. The topics themselves are storage/catalogue.py's; what an append checks and chooses
before it writes is storage/append_path.py's.

Layout of a data folder (see docs/FORMAT.md)::

    data/
      __topics/<topic>/topic.json        topic metadata (partitions, config overrides)
      <topic>-<partition>/               one folder per partition: segments, indexes, writer lock
      recovery-point-offset-checkpoint   Kafka's checkpoint files, shared by every partition
      log-start-offset-checkpoint
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from storage.append_path import AppendPath, Input, PreparedAppend
from storage.append_path import AppendResult as AppendResult  # re-exported: callers import it from here too
from storage.catalogue import TopicCatalogue
from storage.checkpoints import CachedCheckpoint, read_checkpoint, update_checkpoint
from storage.cleaner import CleanerStats
from storage.cleaner_manager import CleanerConfig, CleanerManager
from storage.compacted import CompactedLedgers, retention_hold_offset
from storage.config import InvalidConfigError, TopicConfig
from storage.errors import (
    CorruptDataError,
    LedgerviewError,
    NoRemoteTierError,
    PartitionLockedError,
    StoreClosedError,
    TopicDeletedError,
    TopicNotTieredError,
    UnknownPartitionError,
    UnknownTopicError,
)
from storage.files import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    OFFSET_INDEX_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    STORE_LOCK,
    TIME_INDEX_SUFFIX,
    TOPICS_FOLDER,
    WRITER_LOCK,
    partition_folder,
    topic_metadata_file,
)
from storage.loader import load_segments, read_segments
from storage.locks import FileLock, RefusedLock
from storage.object_store import DEFAULT_TIMEOUT_S
from storage.partition_log import Clock, PartitionCheckpoints, PartitionLog
from storage.remote_log import RemoteSyncRefusal
from storage.remote_segment import DEFAULT_CACHE_BYTES, FetchCache
from storage.remote_store import is_remote_location
from storage.remote_tier import (
    RemotePartitionStatus,
    RemoteSyncResult,
    RemoteTier,
    enforce_tiered_retention,
    open_remembered_tier,
    sync_partition,
)
from storage.retention import DeletedSegment, DeleteRecordsResult, delete_records, enforce_partition_retention
from storage.schema import MESSAGE_SCHEMA, Message, messages_from_table, with_partition_column
from storage.segment import Segment, SegmentReads
from storage.stray_records import remove_stray_record_temporaries
from storage.topics import TopicMetadata


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class PartitionInfo:
    """One partition of ``describe_topic``; its figures are None when its data cannot be read (``error``)."""

    partition: int
    start_offset: int | None
    end_offset: int | None
    size_bytes: int | None
    segments: int | None
    error: str | None = None


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]
    config: dict[str, str]
    """Every key with its effective value."""
    overrides: dict[str, str]
    """Only the keys set for this topic."""


class Store:
    """A data folder of topics. Safe to open from several processes at once (see docs/FORMAT.md, Concurrency)."""

    def __init__(self, root: Path, *, lock_wait: bool, verify_reads: bool, clock: Clock,
                 cleaner_config: CleanerConfig, remote: RemoteTier | None, read_only: bool = False) -> None:
        self.root = root
        self.read_only = read_only
        self._lock_type = RefusedLock if read_only else FileLock
        self.remote = remote
        """The remote tier (storage/remote_tier.py), or None for a store that lives in its folder only."""
        self.lock_wait = lock_wait
        self.verify_reads = verify_reads
        self.clock = clock
        self._store_lock = self._lock_type(root / STORE_LOCK)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._failed_opens: dict[tuple[str, int], tuple[tuple[object, ...], CorruptDataError]] = {}
        """Partitions whose log did not open because its data is damaged, with the state of their files then: a
        caller that retries (a Kafka client, every 100 ms) gets the error again without another walk of the
        segments, until a file changes."""
        self._catalogue = TopicCatalogue(root, self._store_lock, clock, on_read=self._push_config)
        self._append_path = AppendPath(clock)
        self._log_start_offsets = CachedCheckpoint(root / LOG_START_OFFSET_CHECKPOINT)
        self.cleaner = CleanerManager(root / CLEANER_OFFSET_CHECKPOINT, self._store_lock, cleaner_config)
        """The in-place cleaner's states and checkpoint: pause, resume, abort partitions, see uncleanable ones."""
        self._closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, lock_wait: bool = True, verify_reads: bool = True,
             clock: Clock = wall_clock_ms, cleaner_config: CleanerConfig | None = None, remote: str | None = None,
             remote_cache_bytes: int = DEFAULT_CACHE_BYTES, remote_timeout_s: float = DEFAULT_TIMEOUT_S,
             read_only: bool = False) -> Store:
        """Open (creating it if missing) the data folder at ``path``.

        ``lock_wait``: a writer that finds a partition locked by another process waits (True) or raises
        PartitionLockedError (False). ``verify_reads``: check each batch's CRC-32C when reading it.
        ``clock``: milliseconds since the epoch; tests pass their own. ``cleaner_config``: the in-place
        cleaner's memory budget (default: Kafka's 128 MiB). ``remote``: the URI of the store's remote tier
        (``s3://bucket/prefix``, ``file:///mount/prefix``, see storage/remote_tier.py); the folder remembers it
        (unless opened read-only), so later opens read through it without naming it again, and naming another
        one is refused, read-only opens included.
        ``remote_cache_bytes``: memory for remote segments fetched for reading. ``remote_timeout_s``: how long a
        request to the remote tier waits for a connection or for its answer's next bytes. ``read_only``: the folder must
        exist; nothing is created, locked, recovered or cleaned up (a partition is read as another process left it,
        up to its last complete batch), and every change raises ReadOnlyStoreError: how Spark's read tasks open
        it, beside a writer they must never block or disturb.
        """
        if is_remote_location(path):
            raise LedgerviewError(f"Store.open takes a data folder, not {path}: open the folder with "
                                  f"remote={str(path)!r} to tier it, or read the remote tier alone with RemoteStore "
                                  "(Reader and TableView take the URI).")
        root = Path(path)
        if read_only and not (root / TOPICS_FOLDER).is_dir():
            raise LedgerviewError(f"No ledgerview data folder at {root} (it has no {TOPICS_FOLDER} folder); a "
                                  "read-only open creates nothing.")
        if not read_only:
            (root / TOPICS_FOLDER).mkdir(parents=True, exist_ok=True)
        objects = open_remembered_tier(root, remote, timeout_s=remote_timeout_s, remember=not read_only)
        tier = RemoteTier(objects, FetchCache(remote_cache_bytes), clock) if objects else None
        store = cls(root, lock_wait=lock_wait, verify_reads=verify_reads, clock=clock,
                    cleaner_config=cleaner_config or CleanerConfig(), remote=tier, read_only=read_only)
        if not read_only:
            store._catalogue.remove_leftovers()
            remove_stray_record_temporaries(root)
        return store

    @classmethod
    def open_for_reading(cls, path: str | os.PathLike[str], **options: Any) -> Store:
        """The data folder at ``path`` for a reader: opened as ``open`` opens it, or read-only when the folder
        cannot be written (a read-only mount, another user's files), so reads are served either way."""
        try:
            return cls.open(path, **options)
        except OSError as error:
            if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            return cls.open(path, **{**options, "read_only": True})

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Flush the partitions this store appended to (fsync, recovery point to the end) and release files.

        A store that only read takes no lock here."""
        if self._closed:
            return
        for log in self._logs.values():
            if log.has_unflushed_appends:
                try:
                    log.flush()
                except FileNotFoundError:
                    if log.folder.exists():
                        raise  # else another process deleted the topic: there is nothing left to flush
            log.close()
        self._logs.clear()
        self._closed = True

    # -------------------------------------------------------------------------------------------------- topics
    def create_topic(self, topic: str, partitions: int = 1, config: Mapping[str, Any] | None = None) -> None:
        self._refuse_tiering_without_a_tier(config or {})
        self._catalogue.create(topic, partitions, config)

    def _refuse_tiering_without_a_tier(self, overrides: Mapping[str, Any]) -> None:
        """remote.storage.enable on a store with no remote tier would be a promise no upload keeps (Kafka refuses it
        too while the broker's tiered storage is off)."""
        if self.remote is None and "remote.storage.enable" in overrides and TopicConfig.from_overrides(
                {"remote.storage.enable": overrides["remote.storage.enable"]}).remote_storage_enable:
            raise InvalidConfigError("remote.storage.enable", overrides["remote.storage.enable"], "false",
                                     "This store has no remote tier: open it with one (remote=..., the command "
                                     "line's --remote URI) to tier topics.")

    def list_topics(self) -> list[str]:
        return self._catalogue.names()

    def topic_metadata(self, topic: str) -> TopicMetadata:
        """The topic's metadata, re-read when another process has changed it."""
        self._check_open()
        return self._catalogue.metadata(topic)

    def _push_config(self, metadata: TopicMetadata) -> None:
        """Give the topic's open partition logs the config just read."""
        for partition in range(metadata.partitions):
            if (log := self._logs.get((metadata.name, partition))) is not None:
                log.config = metadata.config

    def describe_topic(self, topic: str) -> TopicDescription:
        metadata = self.topic_metadata(topic)
        infos = []
        for partition in range(metadata.partitions):
            try:
                log = self.partition_log(topic, partition)
                log.refresh()
            except CorruptDataError as error:  # described with its error: one damaged partition hides no other
                infos.append(PartitionInfo(partition, None, None, None, None, f"{type(error).__name__}: {error}"))
                continue
            infos.append(PartitionInfo(partition, log.log_start_offset, log.end_offset, log.size_bytes,
                                       len(log.segments)))
        return TopicDescription(topic, infos, metadata.config.as_properties(), dict(metadata.overrides))

    def alter_topic_config(self, topic: str, set: Mapping[str, Any] | None = None,
                           delete: Iterable[str] = ()) -> TopicConfig:
        """Set and remove config overrides; validated as a whole before anything is stored."""
        self._check_open()
        self._refuse_tiering_without_a_tier(set or {})
        return self._catalogue.alter_config(topic, set, delete)

    def delete_topic(self, topic: str) -> None:
        """Close the topic's open partition logs and delete it: its metadata first (it is gone at once), then its
        folders. A topic whose metadata record is damaged is deleted too (with the partition folders it has)."""
        with self._store_lock:
            self._check_open()
            for key in [key for key in self._logs if key[0] == topic]:
                self._logs.pop(key).close()
            self._catalogue.delete(topic)

    # ---------------------------------------------------------------------------------------------- partitions
    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        """The open log of one partition, recovered on first use (see storage/loader.py)."""
        return self._log_of(self.topic_metadata(topic), partition)

    def _log_of(self, metadata: TopicMetadata, partition: int) -> PartitionLog:
        """``partition_log`` for metadata just read (each read stats the topic's metadata file)."""
        topic = metadata.name
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < metadata.partitions:
            raise UnknownPartitionError(topic, partition, metadata.partitions)
        key = (topic, partition)
        log = self._logs.get(key)
        if log is None:
            folder = partition_folder(self.root, topic, partition)
            failed = self._failed_opens.get(key)
            if failed is not None and failed[0] == self._open_state(folder):
                raise _fresh(failed[1])
            state = self._open_state(folder)
            try:
                log = self._open_partition(metadata, partition)
            except CorruptDataError as error:
                self._failed_opens[key] = (state, _fresh(error))  # kept apart from the notes callers add
                raise
            self._failed_opens.pop(key, None)
            self._logs[key] = log
        return log

    def known_damaged_partitions(self, topic: str) -> frozenset[int]:
        """The partitions of ``topic`` whose log this store tried to open and could not because its data failed a
        check (CorruptDataError), and whose folder has not changed since: no file but an index added, removed or
        rewritten (each compared by name, inode, size, modification and change time, as the retried open does).

        It opens and reads nothing: one listing of each such partition's folder, nothing for the others. So it knows
        no more than that. A partition no read, append or describe of this store has touched since it was opened
        is not known damaged, however damaged its files; a damaged partition whose folder changed (repaired,
        restored, or written by another process) is not known damaged until the next open attempt says so again;
        and a partition whose log is open here is never in it, even if a later read meets a damaged batch, ledger
        or cursor record. The store-wide checkpoint files, which the retried open also compares, are left out
        here: every flush of any partition rewrites them, and they would clear the answer for every damaged
        partition each time; a repair by the checkpoints alone shows at the next open attempt."""
        failed = [(key[1], state) for key, (state, _) in dict(self._failed_opens).items() if key[0] == topic]
        return frozenset(partition for partition, state in failed
                         if (topic, partition) not in self._logs
                         and state[0] == self._open_state(partition_folder(self.root, topic, partition))[0])

    def _open_state(self, folder: Path) -> tuple[object, ...]:
        """What opening a partition reads: its files but the indexes and the store's checkpoints, each by inode,
        size, modification and change time (a file restored with its old modification time, by ``cp -p`` or
        rsync, still has a new change time); the same state opens the same way. The indexes are left out: a failed
        open rebuilds them before it meets the damage."""
        files = []
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
            files = sorted((entry.name, *_identity(entry.stat())) for entry in entries
                           if not entry.name.endswith((OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX)))
        checkpoints = []
        for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
            with contextlib.suppress(FileNotFoundError):
                checkpoints.append((name, *_identity((self.root / name).stat())))
        return tuple(files), tuple(checkpoints)

    def _open_partition(self, metadata: TopicMetadata, partition: int) -> PartitionLog:
        topic, config = metadata.name, metadata.config
        folder = partition_folder(self.root, topic, partition)
        key = (topic, partition)
        recovery_file = self.root / RECOVERY_POINT_CHECKPOINT
        start_file = self.root / LOG_START_OFFSET_CHECKPOINT
        writer_lock = self._lock_type(folder / WRITER_LOCK, wait=self.lock_wait)
        load_remote = functools.partial(self.remote.segments, topic, partition) if self.remote else None

        def read_log_start_offset() -> int:
            return self._log_start_offsets.get(key, 0)

        checkpoints = PartitionCheckpoints(
            save_recovery_point=lambda offset: update_checkpoint(recovery_file, self._store_lock, {key: offset}),
            read_recovery_point=lambda: read_checkpoint(recovery_file).get(key, 0),
            save_log_start_offset=lambda offset: update_checkpoint(start_file, self._store_lock, {key: offset}),
            read_log_start_offset=read_log_start_offset,
        )
        try:
            if self.read_only:
                raise PartitionLockedError(str(writer_lock.path))  # read the files as they are, as below
            writer_lock.acquire(wait=False)
        except PartitionLockedError:
            # Another process is appending right now: take the files as they are (it recovered them when it
            # opened the partition); whoever next holds the lock cuts any torn tail (PartitionLog.append).
            segments = read_segments(folder, index_interval_bytes=config.index_interval_bytes)
            if not segments and self.read_only:  # never written: an empty log at its start, until a writer makes it
                segments = [Segment(folder, read_log_start_offset(), index_interval_bytes=config.index_interval_bytes)]
            if segments:
                return PartitionLog(folder, topic, partition, config=config, segments=segments,
                                    log_start_offset=max(read_log_start_offset(), segments[0].base_offset),
                                    recovery_point=checkpoints.read_recovery_point(),
                                    writer_lock=writer_lock, checkpoints=checkpoints, clock=self.clock,
                                    verify_reads=self.verify_reads, load_remote=load_remote)
            writer_lock.acquire(wait=True)  # the partition's first segment is being created: wait for it
        try:
            recovery_point = checkpoints.read_recovery_point()
            log_start_offset = read_log_start_offset()
            segments = load_segments(folder, recovery_point=recovery_point, log_start_offset=log_start_offset,
                                     index_interval_bytes=config.index_interval_bytes)
            log = PartitionLog(folder, topic, partition, config=config, segments=segments,
                               log_start_offset=max(log_start_offset, segments[0].base_offset),
                               recovery_point=recovery_point, writer_lock=writer_lock, checkpoints=checkpoints,
                               clock=self.clock, verify_reads=self.verify_reads, load_remote=load_remote)
            if recovery_point < log.end_offset:
                log.flush()  # what recovery kept is now verified and fsynced
        finally:
            writer_lock.__exit__(None, None, None)
        return log

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError()

    # -------------------------------------------------------------------------------------------------- append
    def append(self, topic: str, data: Input, partition: int | None = None, *,
               compression: str | None = None) -> AppendResult:
        """Append messages; returns the (partition, offset) each got, in input order.

        ``data``: a pyarrow Table or RecordBatch (key, value, optional timestamp, headers, partition) or a list
        of messages. Without ``partition`` or a partition column, keyed messages go where Kafka's murmur2
        partitioner sends them and keyless ones of one call together to the next partition in turn.
        ``compression``: none, "lz4" or "zstd", used when the topic's compression.type is "producer".
        Everything is validated before anything is written.
        """
        metadata = self.topic_metadata(topic)
        prepared = self._append_path.prepare(metadata, data, partition, compression=compression)
        if prepared is None:
            return AppendResult(np.empty(0, np.int32), np.empty(0, np.int64))
        try:
            return self._append_prepared(metadata, prepared, partition)
        except FileNotFoundError as error:
            if not topic_metadata_file(self.root, topic).exists():
                raise TopicDeletedError(topic, self.list_topics()) from error
            raise

    def _append_prepared(self, metadata: TopicMetadata, prepared: PreparedAppend, partition: int | None) -> (
        AppendResult
    ):
        table, sizes, targets, codec = prepared.table, prepared.sizes, prepared.targets, prepared.codec
        if partition is not None:  # the common producer case: no grouping to do
            first = self._log_of(metadata, partition).append(table, sizes=sizes, compression=codec)
            return AppendResult(targets, np.arange(first, first + table.num_rows, dtype=np.int64))
        offsets = np.empty(table.num_rows, dtype=np.int64)
        order = np.argsort(targets, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(targets[order])) + 1)
        logs = [self._log_of(metadata, int(targets[rows[0]])) for rows in groups]
        with ExitStack() as held:
            # Every target's writer lock first, in partition order (no deadlock between two such appends): a
            # busy partition then fails the call before any partition is written, so a retry duplicates nothing.
            for log in logs:
                held.enter_context(log.writer_lock)
            for log, rows in zip(logs, groups, strict=True):
                whole = len(rows) == table.num_rows
                part, part_sizes = (table, sizes) if whole else (
                    table.take(pa.array(rows)), None if sizes is None else sizes[rows])
                first = log.append(part, sizes=part_sizes, compression=codec)
                offsets[rows] = np.arange(first, first + len(rows))
        return AppendResult(targets, offsets)

    def routed(self, topic: str, data: Input, *, keyless_partition: int) -> pa.Table:
        """``data`` with its sizes and partitions checked as ``append`` checks them, a ``partition`` column saying
        where ``append`` would put each message (keyless ones: ``keyless_partition``), and no timestamp column if
        none was given. For writers that must fix the partitions before they append, such as the Spark sink's
        tasks, so that a replayed batch lands where it did."""
        return self._append_path.route(self.topic_metadata(topic), data, keyless_partition=keyless_partition)

    # ---------------------------------------------------------------------------------------------------- read
    def read_batches(self, topic: str, partition: int, start_offset: int | None = None,
                     end_offset: int | None = None, *, join_bytes: int = 0) -> Iterator[pa.RecordBatch]:
        """Record batches of MESSAGE_SCHEMA for start_offset <= offset < end_offset; zero-copy from the page
        cache when uncompressed (only the partition column is new). ``join_bytes``: consecutive stored batches of
        a segment joined (copied) until they hold that many bytes, for readers whose costs are per batch; 0: one
        batch per stored batch, as a reader comparing stored batches needs."""
        log = self.partition_log(topic, partition)
        log.refresh()
        start = log.log_start_offset if start_offset is None else start_offset
        for batch in log.read_batches(start, end_offset, join_bytes=join_bytes):
            yield with_partition_column(batch, partition)

    def read(self, topic: str, partition: int, start_offset: int | None = None,
             max_messages: int | None = None, end_offset: int | None = None) -> pa.Table:
        """Messages from ``start_offset`` (default: the log start) as one table, at most ``max_messages``."""
        if max_messages is not None and (isinstance(max_messages, bool) or not isinstance(max_messages, int)
                                         or max_messages < 0):
            raise LedgerviewError(f"max_messages must be None or an integer >= 0, got {max_messages!r}.")
        batches, count = [], 0
        for batch in self.read_batches(topic, partition, start_offset, end_offset):
            if max_messages is not None and count + batch.num_rows >= max_messages:
                batches.append(batch.slice(0, max_messages - count))
                break
            batches.append(batch)
            count += batch.num_rows
        return pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)

    def iter_messages(self, topic: str, partition: int, start_offset: int | None = None,
                      end_offset: int | None = None) -> Iterator[Message]:
        for batch in self.read_batches(topic, partition, start_offset, end_offset):
            yield from messages_from_table(pa.Table.from_batches([batch]))

    def start_offset(self, topic: str, partition: int) -> int:
        log = self.partition_log(topic, partition)
        log.refresh()
        return log.log_start_offset

    def end_offset(self, topic: str, partition: int) -> int:
        log = self.partition_log(topic, partition)
        log.refresh()
        return log.end_offset

    def size_bytes(self, topic: str, partition: int) -> int:
        log = self.partition_log(topic, partition)
        log.refresh()
        return log.size_bytes

    def segments(self, topic: str, partition: int) -> list[SegmentReads]:
        """The partition's segments on both tiers, in offset order."""
        log = self.partition_log(topic, partition)
        log.refresh()
        return log.tiered_segments()

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """Kafka's offsetsForTimes: the earliest offset whose timestamp is >= ``timestamp_ms``; None if none."""
        return self.partition_log(topic, partition).offset_for_timestamp(timestamp_ms)

    def compacted_ledgers(self, topic: str, partition: int) -> CompactedLedgers:
        """The partition's compacted ledgers and the cursor that names the current one."""
        return CompactedLedgers(self.partition_log(topic, partition).folder)

    def retention_hold(self, topic: str, partition: int) -> int | None:
        """The lowest offset retention may not delete past while two-phase compaction needs it (None: no hold)."""
        log = self.partition_log(topic, partition)
        enabled = log.config.compaction_threshold_bytes > 0
        return retention_hold_offset(log.folder, two_phase_enabled=enabled)

    def enforce_retention(self, topic: str, now_ms: int | None = None) -> list[DeletedSegment]:
        """Kafka's retention over every partition of ``topic``: delete the oldest segments past retention.ms or
        retention.bytes (when cleanup.policy includes delete) or below the log start offset, never raw data the
        two-phase compaction hold keeps (see storage/retention.py). Returns the segments deleted, whose files are
        renamed ``.deleted`` now and removed after file.delete.delay.ms. ``now_ms``: default the store's clock.

        A partition that fails (its data damaged, the remote tier down, a disk error) does not keep retention from
        the others: the first failure is raised once they are done, with a note of what they deleted
        (``retention_pass`` returns both instead)."""
        deleted, failures = self.retention_pass(topic, now_ms)
        if failures:
            first = failures[0][1]
            failed = ", ".join(f"{partition} ({type(error).__name__})" for partition, error in failures)
            first.add_note(f"Retention of {topic} failed on partition(s) {failed} and ran on the others: "
                           f"{len(deleted)} segment(s) deleted.")
            raise first
        return deleted

    def retention_pass(self, topic: str, now_ms: int | None = None) -> tuple[
            list[DeletedSegment], list[tuple[int, LedgerviewError | OSError]]]:
        """``enforce_retention`` over every partition, returning what it deleted and each partition that failed
        with its error, without raising them."""
        metadata = self.topic_metadata(topic)
        now = self.clock() if now_ms is None else now_ms
        deleted: list[DeletedSegment] = []
        failures: list[tuple[int, LedgerviewError | OSError]] = []
        for partition in range(metadata.partitions):
            try:
                log = self.partition_log(topic, partition)
                _remove_retired_ledgers(log)
                read_hold = functools.partial(self.retention_hold, topic, partition)
                if self.remote is not None and metadata.config.remote_storage_enable:
                    deleted += enforce_tiered_retention(log, self.remote.writer(log), now_ms=now, hold=read_hold())
                else:
                    deleted += enforce_partition_retention(log, now_ms=now, read_hold=read_hold)
            except (LedgerviewError, OSError) as error:
                failures.append((partition, error))
        return deleted, failures

    # ------------------------------------------------------------------------------------------- remote tier
    def sync_remote(self, topic: str | None = None) -> list[RemoteSyncResult]:
        """Upload every sealed segment the remote tier lacks, of ``topic`` or of every topic with
        remote.storage.enable=true; returns when the remote tier holds them (one result per partition). The
        service does this continuously; local copies go later, by local retention (``enforce_retention``). A
        partition the tier refuses (this folder is fenced, or its log diverged) does not stop the others: the first
        refusal is raised once they are synced, holding their results (RemoteSyncRefusal)."""
        tier = self._require_remote()
        results, refusals = [], []
        for name in [topic] if topic is not None else self.list_topics():
            metadata = self.topic_metadata(name)
            if not metadata.config.remote_storage_enable:
                if topic is not None:
                    raise TopicNotTieredError(name)
                continue
            tier.publish_topic(metadata)
            for partition in range(metadata.partitions):
                log = self.partition_log(name, partition)
                try:
                    results.append(sync_partition(log, tier.writer(log)))
                except RemoteSyncRefusal as refusal:
                    refusals.append(refusal)
        if refusals:
            refusals[0].synced, refusals[0].also_refused = results, refusals[1:]
            raise refusals[0]
        return results

    def claim_remote(self, topic: str, partition: int) -> int:
        """Make this folder the writer of the partition's remote log (a standby taking over); returns the new
        epoch. Writers of older epochs are refused from then on (RemoteLogFencedError)."""
        tier = self._require_remote()
        log = self.partition_log(topic, partition)
        return tier.writer(log).claim(log_start_offset=log.log_start_offset).epoch

    def remote_status(self, topic: str, partition: int) -> RemotePartitionStatus:
        """The partition's offsets on both tiers, its remote bytes, upload lag and writer epoch (read now)."""
        tier = self._require_remote()
        if not self.topic_metadata(topic).config.remote_storage_enable:
            raise TopicNotTieredError(topic)
        return tier.status(self.partition_log(topic, partition))

    def remote_upload_lag(self, topic: str, partition: int) -> int | None:
        """Bytes of the partition's sealed segments not yet on the remote tier (None: the topic is not tiered)."""
        if self.remote is None or not self.topic_metadata(topic).config.remote_storage_enable:
            return None
        return self.remote.upload_lag_bytes(self.partition_log(topic, partition))

    def _require_remote(self) -> RemoteTier:
        if self.remote is None:
            raise NoRemoteTierError(str(self.root))
        return self.remote

    def delete_records(self, topic: str, partition: int, before_offset: int, *,
                       now_ms: int | None = None) -> DeleteRecordsResult:
        """Kafka's DeleteRecords: reads below ``before_offset`` become out of range (it may lie inside a segment)
        and the segments wholly below it are deleted. It must lie from the log start offset to the end offset and
        not past the retention hold, on a topic whose cleanup.policy includes delete; otherwise nothing changes."""
        log = self.partition_log(topic, partition)
        return delete_records(log, before_offset, now_ms=self.clock() if now_ms is None else now_ms,
                              read_hold=functools.partial(self.retention_hold, topic, partition))

    def clean(self, topic: str, now_ms: int | None = None) -> list[CleanerStats]:
        """Kafka's in-place cleaning: one pass over each partition of ``topic`` whose dirty ratio is above
        min.cleanable.dirty.ratio (or whose oldest dirty message passed max.compaction.lag.ms), filthiest first,
        when cleanup.policy includes compact (see storage/cleaner.py and storage/cleaner_manager.py). Returns the
        statistics of each pass. A partition that fails is marked uncleanable (``store.cleaner.uncleanable()``)
        and the others are still cleaned. ``now_ms``: default the store's clock."""
        metadata = self.topic_metadata(topic)
        if not metadata.config.is_compact:
            return []
        logs = [(self.partition_log(topic, partition), functools.partial(self.retention_hold, topic, partition))
                for partition in range(metadata.partitions)]
        return self.cleaner.clean(logs, now_ms=self.clock() if now_ms is None else now_ms)

    def roll(self, topic: str, partition: int) -> None:
        """Seal the active segment now; the next append starts a new one."""
        self.partition_log(topic, partition).roll()

    def flush_due(self, now_ms: int | None = None) -> int:
        """Flush every open partition whose appends have waited ``flush.ms``; returns how many were flushed.

        Appends check flush.ms themselves, but a partition that stops receiving appends needs someone to look:
        the service calls this on a schedule, as Kafka's log flusher does. Each topic's config is re-read first
        (a stat when unchanged), so a flush.ms altered since the last append, by any process, is the one used."""
        now = self.clock() if now_ms is None else now_ms
        for topic in {topic for topic, _ in self._logs}:
            try:
                self.topic_metadata(topic)
            except UnknownTopicError:
                continue  # deleted by another process: its logs are flushed with the config they had
        return sum(log.flush_if_due(now) for log in list(self._logs.values()))

    def flush(self, topic: str | None = None) -> None:
        """fsync what was appended and move recovery points, for one topic or every open partition."""
        for (name, _), log in list(self._logs.items()):
            if topic is None or name == topic:
                log.flush()


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _fresh(error: CorruptDataError) -> CorruptDataError:
    """A copy of ``error`` (its message and attributes) without its notes and traceback: the one raised again for
    a partition that did not open, to callers on any thread that may add notes of their own."""
    fresh = type(error).__new__(type(error), *error.args)
    fresh.__dict__.update((name, value) for name, value in vars(error).items() if name != "__notes__")
    return fresh


def _remove_retired_ledgers(log: PartitionLog) -> None:
    """Remove the partition's replaced ledgers whose file.delete.delay.ms is over, so that the raw data they held
    for their readers can go now, not at the next compaction (which may never come to a topic that receives
    nothing new). A compaction running now does it itself: then this does nothing."""
    ledgers = CompactedLedgers(log.folder)
    if not ledgers.folder.is_dir():
        return
    try:
        with ledgers.lock(wait=False):
            ledgers.remove_orphans_and_retired(delete_delay_ms=log.config.file_delete_delay_ms)
    except PartitionLockedError:
        return
