"""One partition's log: an ordered run of segments, the last one active.

Appending (under the partition's writer lock, so several processes may append in turn):

1. Catch up with the files: another process may have appended or rolled since this one last looked.
2. For each batch of the input: encode it, roll first if the active segment would pass ``segment.bytes`` or is
   older than ``segment.ms``, then write it at the end of the active segment.
3. Flush when ``flush.messages`` or ``flush.ms`` say so: fsync what was written and move the recovery point (what
   an owner registered with ``register_before_fsync`` is made durable first; rolls do the same).

Reading never takes the lock: it looks at the files, widens its memory maps and stops at the last complete batch,
so readers never block writers and see every batch a writer in any process has appended.

Deleting (retention and delete-records, whose policy is storage/retention.py's) also holds the writer lock: it moves
the log start offset, then renames a prefix of segments ``.deleted`` (``delete_segments_before``).

Cleaning (storage/cleaner.py) holds the writer lock too and swaps each cleaned segment in for the segments it
replaces with Kafka's ``.cleaned`` -> ``.swap`` -> ``.deleted`` renames (``replace_segments``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage import faults
from storage.binary_arrays import value_lengths
from storage.codec import HEADER_BYTES, BatchHeader, encode_batch
from storage.config import TopicConfig
from storage.errors import OffsetOutOfRangeError
from storage.fileio import fsync_folder
from storage.files import CLEANED_SUFFIX, SWAP_SUFFIX
from storage.loader import complete_interrupted_swaps, read_segments
from storage.locks import FileLock
from storage.schema import APPENDED_SCHEMA
from storage.segment import NO_TIMESTAMP, Segment, SegmentReads, batches_of_segments, segments_from

MAX_RELATIVE_OFFSET = 2**31 - 1
MTIME_TICK_NS = 1_000_000_000
Clock = Callable[[], int]


@dataclass(frozen=True)
class PartitionCheckpoints:
    """Where this partition records its recovery point and log start offset (files shared by the store)."""

    save_recovery_point: Callable[[int], None]
    read_recovery_point: Callable[[], int]
    """The recovery point as last saved, by whichever process holds the writer lock."""
    save_log_start_offset: Callable[[int], None]
    read_log_start_offset: Callable[[], int]


class PartitionLog:
    def __init__(
        self,
        folder: Path,
        topic: str,
        partition: int,
        *,
        config: TopicConfig,
        segments: list[Segment],
        log_start_offset: int,
        recovery_point: int,
        writer_lock: FileLock,
        checkpoints: PartitionCheckpoints,
        clock: Clock,
        verify_reads: bool,
        load_remote: Callable[[], list[SegmentReads]] | None = None,
    ) -> None:
        """``load_remote``: the segments of the partition's remote log now (storage/remote_tier.py), for a store
        with a remote tier; reads go there for offsets whose local segments are gone."""
        self.folder, self.topic, self.partition = folder, topic, partition
        self.config = config
        self.segments = segments
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.writer_lock = writer_lock
        self.checkpoints = checkpoints
        self.clock = clock
        self.verify_reads = verify_reads
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self._folder_mtime_ns = folder.stat().st_mtime_ns
        self._listing = _listing(folder)
        self._active_file_bytes = 0
        """The active segment's file size when ``refresh`` last looked."""
        self._load_remote = load_remote
        self._remote_segments: list[SegmentReads] | None = None
        self._sync_before_fsync: list[Callable[[], None]] = []

    # ------------------------------------------------------------------------------------------------- state
    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def end_offset(self) -> int:
        """The offset the next appended message gets (Kafka's log end offset)."""
        return self.active.next_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole log, both tiers."""
        return sum(segment.size_bytes for segment in self.tiered_segments())

    @property
    def local_size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self.segments)

    @property
    def is_tiered(self) -> bool:
        return self._load_remote is not None and self.config.remote_storage_enable

    @property
    def remote_segments(self) -> list[SegmentReads]:
        """The remote segments below the first local one, oldest first, read from the remote log when first needed
        after a change (so appends never wait for the remote tier, and never fail with it)."""
        if not self.is_tiered:
            return []
        if self._remote_segments is None:
            assert self._load_remote is not None
            first_local = self.segments[0].base_offset
            self._remote_segments = [segment for segment in self._load_remote() if segment.next_offset <= first_local]
        return self._remote_segments

    def tiered_segments(self) -> list[SegmentReads]:
        """Every segment of the log in offset order: remote ones where no local copy is left, then local ones."""
        return [*self.remote_segments, *self.segments]

    def segments_from(self, offset: int) -> list[SegmentReads]:
        """The segments from the one holding ``offset`` on; the remote tier is asked only for offsets below the
        first local segment."""
        local_first = self.segments[0].base_offset
        return segments_from(self.tiered_segments() if offset < local_first else list(self.segments), offset)

    def reload_remote(self) -> None:
        """Forget the remote segments: the next read that needs them reads the remote log again."""
        self._remote_segments = None

    def bytes_above(self, offset: int) -> int:
        """Bytes of the batches holding offsets above ``offset``."""
        segments = self.segments_from(offset + 1)
        return sum(segment.size_bytes for segment in segments) - segments[0].position_of(offset + 1)

    def refresh(self) -> None:
        """Catch up with what other processes did to the files: new or removed segments, appended batches."""
        mtime_ns = self.folder.stat().st_mtime_ns
        # A folder's mtime moves in ticks of the kernel's coarse clock: a segment created within the tick of the
        # last look leaves it unchanged, so a recent mtime is no proof that nothing changed. Then the names and
        # inodes of the files decide (a cleaned segment keeps its name but not its inode).
        unsettled = time.time_ns() - mtime_ns < MTIME_TICK_NS
        if mtime_ns != self._folder_mtime_ns or unsettled:
            self._folder_mtime_ns = mtime_ns
            listing = _listing(self.folder)
            if listing != self._listing:
                self._listing = listing
                self._relist_segments()
        self._active_file_bytes = self.active.follow_growth()
        if self._active_file_bytes > self.active.size_bytes:
            self._check_unparsed_tail()
        # A tiered log's first local segment may be well above its start (local retention): its checkpoint, which
        # retention moves on both tiers, is the start then, and the remote tier is not asked.
        first = self._remote_segments[0] if self._remote_segments else None if self.is_tiered else self.segments[0]
        self.log_start_offset = max(self.checkpoints.read_log_start_offset(), first.base_offset if first else 0)

    def _check_unparsed_tail(self) -> None:
        """Bytes past the active segment's last batch that parses are a batch another process is writing, or one
        a writer that died left torn, unless the recovery point is above that batch: then it was fsynced whole,
        and the bytes are damage (CorruptSegmentError, as a recovering open raises: storage/loader.py). The
        recovery point is read before the segment is looked at again, so a batch written and flushed meanwhile
        is seen whole rather than taken for damage."""
        recovery_point = self.checkpoints.read_recovery_point()
        self._active_file_bytes = self.active.follow_growth()
        if self._active_file_bytes > self.active.size_bytes and self.active.next_offset < recovery_point:
            self.active.raise_unparsed_tail()

    def _relist_segments(self) -> None:
        known = {segment.base_offset: segment for segment in self.segments}
        on_disk = read_segments(self.folder, index_interval_bytes=self.config.index_interval_bytes, known=known)
        kept = {id(segment) for segment in on_disk}
        for segment in self.segments:
            if id(segment) not in kept:
                # Deleted or replaced by another process (retention, cleaning): a read in progress here finishes
                # through the segment's memory map, so only the write handle is closed.
                segment.close_write_handle()
        self.segments = on_disk
        self.reload_remote()  # local segments go once uploaded (or by retention): the remote log tells which

    def settle(self) -> None:
        """Under the writer lock, before changing segments: finish a swap that a crashed cleaner in another
        process left half done (storage/loader.py, pass 2), then catch up with the files."""
        with self.writer_lock:
            complete_interrupted_swaps(self.folder, index_interval_bytes=self.config.index_interval_bytes)
            self._relist_segments()
            self.refresh()

    # ------------------------------------------------------------------------------------------------ append
    def append(self, table: pa.Table, *, sizes: np.ndarray | None, compression: str | None) -> int:
        """Append messages (key, value, timestamp, headers; timestamps set) and return the first offset.

        ``sizes`` are the messages' estimated_message_bytes, used to split the table into batches (None: computed
        only if the table may need splitting).
        """
        with self.writer_lock:
            self.refresh()
            self._cut_torn_tail()
            first_offset = self.end_offset
            for batch in _batches_of(table, sizes, self.config.segment_bytes):
                self._append_batch(batch, compression)
            self._maybe_flush(table.num_rows)
            return first_offset

    def _cut_torn_tail(self) -> None:
        """Under the writer lock nobody else is writing: bytes past the last complete batch are what a writer
        that died mid-append left (``refresh`` raised had they been below the recovery point). Cut them, or the
        next batch would land after them and never be read. Called right after ``refresh`` under the lock, so the
        file's size refresh saw is still its size."""
        active = self.active
        if self._active_file_bytes > active.size_bytes:
            active.truncate(active.size_bytes)

    def _append_batch(self, table: pa.Table, compression: str | None) -> None:
        base = self.end_offset
        batch = pa.RecordBatch.from_arrays([_single_array(table.column(name)) for name in APPENDED_SCHEMA.names],
                                           schema=APPENDED_SCHEMA)
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        encoded = encode_batch(batch, compression=compression, log_append_time=log_append_time,
                               offset_range=(base, base + table.num_rows - 1))
        if self._should_roll(encoded.header):
            self.roll()
        self.active.append(encoded)

    def _should_roll(self, incoming: BatchHeader) -> bool:
        """Kafka's rule: the active segment would pass segment.bytes, has aged past segment.ms (by message
        time), or could not hold the batch's offsets relative to its base; an empty segment never rolls."""
        active = self.active
        if active.size_bytes == 0:
            return False
        if active.size_bytes + incoming.batch_length > self.config.segment_bytes:
            return True
        if incoming.max_timestamp - active.first_timestamp > self.config.segment_roll_ms:
            return True
        return incoming.last_offset - active.base_offset > MAX_RELATIVE_OFFSET

    def roll(self) -> Segment:
        """Seal the active segment (if it holds anything) and start a new one at the end offset."""
        with self.writer_lock:
            self.refresh()
            self._cut_torn_tail()  # or sealing would keep a dead writer's partial batch below the recovery point
            if self.active.size_bytes == 0:
                return self.active
            self._sync_dependents()
            self.active.seal()
            segment = Segment.create(self.folder, self.end_offset,
                                     index_interval_bytes=self.config.index_interval_bytes)
            faults.crash_point("roll.after_create")
            self.segments.append(segment)
            self._folder_mtime_ns = self.folder.stat().st_mtime_ns
            # Sealing fsynced everything before the new segment, so the recovery point may move up to it.
            self._save_recovery_point(segment.base_offset)
            return segment

    # ---------------------------------------------------------------------------------------------- deletion
    def move_log_start_offset(self, offset: int) -> None:
        """Raise the log start offset to ``offset`` (never lower it) and save it in the log-start-offset
        checkpoint; reads below it are then out of range, in every process that refreshes."""
        with self.writer_lock:
            if not self.log_start_offset <= offset <= self.end_offset:
                raise ValueError(f"log start offset {offset} outside [{self.log_start_offset}, {self.end_offset}]")
            if offset > self.log_start_offset:
                self.checkpoints.save_log_start_offset(offset)
                self.log_start_offset = offset

    def delete_segments_before(self, base_offset: int, *, now_ms: int, move_log_start: bool = True) -> (
        list[Segment]
    ):
        """Delete every segment before the one starting at ``base_offset``, asynchronously as Kafka does
        (``UnifiedLog.deleteSegments``); returns the deleted segments. The policy is storage/retention.py's (and
        storage/remote_tier.py's, whose local retention passes ``move_log_start=False``: the segments stay in the
        log, on the remote tier, so step 1 is skipped).

        1. Move the log start offset up to ``base_offset`` (checkpoint saved). A crash after this leaves the
           segments below it on disk but unreadable; the next retention run deletes them.
        2. Drop them from the segment list and rename their files ``.deleted`` (Segment.rename_to_deleted).
           A crash after this leaves ``.deleted`` files, which opening the partition removes.
        3. Later, storage/retention.py removes ``.deleted`` files older than ``file.delete.delay.ms``.
        """
        with self.writer_lock:
            bases = [segment.base_offset for segment in self.segments]
            if base_offset not in bases:
                raise ValueError(f"no segment of {self.topic}-{self.partition} starts at {base_offset}")
            doomed = self.segments[: bases.index(base_offset)]
            if not doomed:
                return []
            if move_log_start:
                self.move_log_start_offset(max(self.log_start_offset, base_offset))
            faults.crash_point("retention.after_log_start_offset")
            self.segments = self.segments[len(doomed) :]
            for segment in doomed:
                segment.rename_to_deleted(deleted_ms=now_ms)
                faults.crash_point("retention.after_rename")
            self.reload_remote()
            return doomed

    def create_cleaned_segment(self, base_offset: int) -> Segment:
        """A new ``.cleaned`` segment for the cleaner to write into, after removing any left by an aborted pass."""
        stale = Segment(self.folder, base_offset, index_interval_bytes=self.config.index_interval_bytes,
                        temporary_suffix=CLEANED_SUFFIX)
        for path in (stale.log_path, stale.offset_index.path, stale.time_index.path):
            path.unlink(missing_ok=True)
        return Segment.create(self.folder, base_offset, index_interval_bytes=self.config.index_interval_bytes,
                              temporary_suffix=CLEANED_SUFFIX)

    def replace_segments(self, cleaned: Segment, old: list[Segment], *, now_ms: int) -> None:
        """Swap the ``.cleaned`` segment ``cleaned`` in for the consecutive segments ``old``, Kafka's
        ``LocalLog.replaceSegments``. ``cleaned`` has the base offset of ``old[0]`` and exactly their offset range
        (its next offset is the base offset of the segment after them), which is what recovery relies on.

        1. Seal ``cleaned``: final time-index entry, log and indexes fsynced. A crash before step 2 leaves
           ``.cleaned`` files, which opening the partition removes: the old segments stay (rolled back).
        2. Commit: rename its files ``.cleaned`` -> ``.swap``, indexes first and the log last, then fsync the
           folder. From the log's rename on, opening the partition rolls the swap forward (storage/loader.py,
           pass 2) and readers already see the new segment in place of the old ones.
        3. Rename each old segment's files ``.deleted`` (removed after ``file.delete.delay.ms``; readers that hold
           them keep reading their memory maps). A crash here: recovery removes the old files still in the range.
        4. Rename the ``.swap`` files to their final names, log last, and fsync the folder. A crash before the log's
           rename: recovery finishes the renames.
        """
        with self.writer_lock:
            cleaned.seal()
            faults.crash_point("swap.after_cleaned")
            cleaned.rename_files(SWAP_SUFFIX)
            fsync_folder(self.folder)
            faults.crash_point("swap.after_swap")
            for segment in old:
                segment.rename_to_deleted(deleted_ms=now_ms)
                faults.crash_point("swap.after_delete")
            cleaned.rename_files(None)
            fsync_folder(self.folder)
            first = self.segments.index(old[0])
            self.segments[first : first + len(old)] = [cleaned]
            self._folder_mtime_ns = self.folder.stat().st_mtime_ns

    def _maybe_flush(self, appended_messages: int) -> None:
        self._unflushed_messages += appended_messages
        if self._unflushed_messages >= self.config.flush_messages:
            self.flush()
        else:
            self.flush_if_due(self.clock())

    def flush_if_due(self, now_ms: int) -> bool:
        """Flush if this process appended messages that have waited ``flush.ms`` or longer since the last flush
        (Kafka's log flusher, which checks on a schedule as well as after appends); True if it flushed."""
        if self._unflushed_messages and now_ms - self._last_flush_ms >= self.config.flush_ms:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """fsync every segment at or above the recovery point and move the recovery point to the end offset.

        Waits for the writer lock whatever ``lock_wait`` says: the flush is of this process's own appends."""
        with self.writer_lock.waiting():
            self.refresh()  # another process may have replaced or deleted segments (cleaning, retention)
            self._sync_dependents()
            for segment in segments_from(self.segments, self.recovery_point):
                segment.fsync()
            faults.crash_point("flush.before_checkpoint")
            self._unflushed_messages = 0
            self._last_flush_ms = self.clock()
            self._save_recovery_point(self.end_offset)

    def register_before_fsync(self, sync: Callable[[], None]) -> None:
        """Call ``sync`` (under the writer lock) before every fsync that makes appended bytes durable and moves the
        recovery point (flush, roll): for what must be durable no later than the log, such as the journal of
        storage/producer_state.py."""
        self._sync_before_fsync.append(sync)

    def _sync_dependents(self) -> None:
        for sync in self._sync_before_fsync:
            sync()

    def _save_recovery_point(self, offset: int) -> None:
        if offset != self.recovery_point:
            self.recovery_point = offset
            self.checkpoints.save_recovery_point(offset)

    @property
    def has_unflushed_appends(self) -> bool:
        """Whether this process appended since its last flush (only then does closing flush)."""
        return self._unflushed_messages > 0

    def close(self) -> None:
        for segment in self.segments:
            segment.close()

    # -------------------------------------------------------------------------------------------------- read
    def read_batches(self, start_offset: int, end_offset: int | None = None, *, join_bytes: int = 0
                     ) -> Iterator[pa.RecordBatch]:
        """Stored record batches with start_offset <= offset < end_offset (default: the end offset now); with
        ``join_bytes``, consecutive ones of a segment joined until they hold that many stored bytes."""
        self.refresh()
        end = self.end_offset if end_offset is None else min(end_offset, self.end_offset)
        if not self.log_start_offset <= start_offset <= self.end_offset:
            raise OffsetOutOfRangeError(self.topic, self.partition, start_offset, self.log_start_offset,
                                        self.end_offset)
        yield from batches_of_segments(self.segments_from(start_offset), start_offset, end, verify=self.verify_reads,
                                       join_bytes=join_bytes)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Kafka's offsetsForTimes: the first offset whose timestamp is >= ``timestamp``, None past the end."""
        self.refresh()
        for segment in self.tiered_segments():
            if segment.max_timestamp != NO_TIMESTAMP and segment.max_timestamp >= timestamp:
                found = segment.offset_for_timestamp(timestamp, from_offset=self.log_start_offset)
                if found is not None:
                    return found
        return None


def _listing(folder: Path) -> frozenset[tuple[str, int]]:
    """The folder's file names with their inodes, from one directory read (no stat per file)."""
    with os.scandir(folder) as entries:
        return frozenset((entry.name, entry.inode()) for entry in entries)


def _single_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when it already is one chunk (often a zero-copy slice)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _batches_of(table: pa.Table, sizes: np.ndarray | None, segment_bytes: int) -> Iterator[pa.Table]:
    """Split into batches of at most TARGET_BATCH_BYTES (or segment.bytes, if smaller) by estimated size
    (``sizes``: estimated_message_bytes, computed here when None and the table may need cutting)."""
    target = max(1, min(TARGET_BATCH_BYTES, segment_bytes - HEADER_BYTES))
    total = estimated_total_bytes(table) if sizes is None else int(sizes.sum())
    if table.num_rows <= MAX_BATCH_MESSAGES and total <= target:
        yield table
        return
    ends = np.cumsum(estimated_message_bytes(table) if sizes is None else sizes)
    start = 0
    while start < table.num_rows:
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, before + target, side="right"))
        stop = min(max(stop, start + 1), start + MAX_BATCH_MESSAGES, table.num_rows)
        yield table.slice(start, stop - start)
        start = stop


TARGET_BATCH_BYTES = 4 * 1024 * 1024
MAX_BATCH_MESSAGES = 1 << 20
MESSAGE_OVERHEAD_BYTES = 24  # offset, timestamp and the offsets into key and value


def _binary_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Length of each binary value from the offsets buffer (a null's slot is empty, so it counts 0)."""
    parts = [value_lengths(chunk) for chunk in column.chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, np.int64)


def estimated_total_bytes(table: pa.Table) -> int:
    """The sum of ``estimated_message_bytes``; without a pass over the messages when none has headers."""
    if table.column("headers").null_count < table.num_rows:
        return int(estimated_message_bytes(table).sum())
    total: int = MESSAGE_OVERHEAD_BYTES * table.num_rows
    for name in ("key", "value"):
        total += sum(chunk.total_values_length for chunk in table.column(name).chunks)
    return total


def estimated_message_bytes(table: pa.Table) -> np.ndarray:
    """Bytes each message adds to a batch payload (key, value, headers and fixed columns), without a loop."""
    sizes = np.full(table.num_rows, MESSAGE_OVERHEAD_BYTES, dtype=np.int64)
    for name in ("key", "value"):
        sizes += _binary_lengths(table.column(name))
    if table.column("headers").null_count < table.num_rows:
        headers = table.column("headers").combine_chunks()
        flat = headers.flatten()
        pair_bytes = (pa.compute.binary_length(flat.field("key")).fill_null(0).to_numpy()
                      + pa.compute.binary_length(flat.field("value")).fill_null(0).to_numpy() + 8)
        list_offsets = headers.offsets.to_numpy()
        cumulative = np.concatenate([[0], np.cumsum(pair_bytes)])
        sizes += cumulative[list_offsets[1:] - list_offsets[0]] - cumulative[list_offsets[:-1] - list_offsets[0]]
    return sizes
