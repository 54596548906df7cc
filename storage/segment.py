"""One segment: a ``.log`` file of batches with its sparse offset and time indexes.

A segment knows how many of its bytes are valid (``size_bytes``), the next offset after its last batch and its
largest timestamp. Reads go through a read-only memory map that is widened when the file has grown, so batches
are decoded straight from the page cache without copies. Writes go through a plain file descriptor; on Linux both
see the same pages, which is what lets readers in other processes follow the writer.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Final, NamedTuple, NoReturn, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import faults
from storage.codec import (
    HEADER_BYTES,
    BatchFormatError,
    BatchHeader,
    EncodedBatch,
    decode_payload,
    joined_payloads,
    read_header,
    read_payload,
    same_payload_schema,
    verify_batch,
)
from storage.errors import CorruptSegmentError, SegmentDeletedError
from storage.fileio import write_all
from storage.files import (
    DELETED_SUFFIX,
    LOG_SUFFIX,
    OFFSET_INDEX_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_file,
    with_temporary_suffix,
)
from storage.index import OffsetIndex, TimeIndex

NO_TIMESTAMP = -1
JOINED_READ_BYTES: Final = 1 << 20
"""What readers whose costs are per batch and who keep nothing of a batch ask ``read_batches`` to join stored
batches up to (the compactor, the cleaner's key map, Spark's raw reads): a Kafka producer's batches are often about
a hundred messages (batch.size 16 KiB). A joined batch is a copy, so a slice of it keeps the whole copy alive."""
logger = logging.getLogger(__name__)


class TakenBytes(NamedTuple):
    """A segment's bytes as one read took them, and the generation of the verified range they belong to."""

    buffer: pa.Buffer
    generation: int


class SegmentReads:
    """What reading a segment needs, wherever its bytes are: a local file (Segment) or an object of the remote tier
    (storage/remote_segment.py). A subclass provides the bytes (``buffer``), the indexes and the end state."""

    base_offset: int
    size_bytes: int
    next_offset: int
    first_timestamp: int
    max_timestamp: int
    offset_index: OffsetIndex
    time_index: TimeIndex
    offset_shift: int = 0
    """Added to every offset the bytes hold: a segment written before its offsets were known (a Spark task's part
    of a micro-batch on the remote tier) stores them from 0 and is placed in the log by its manifest entry alone."""

    def __init__(self) -> None:
        self._verified_from = self._verified_bytes = 0
        """The batches in [_verified_from, _verified_bytes) had their CRC checked by this process (or were written
        by it): one range of consecutive batches, which the first batch checked starts."""
        self._verified_generation = 0
        """Moves on whenever the range is forgotten or cut, so that a read of bytes taken before records nothing."""
        self._verified_lock = threading.Lock()
        """Held to change the range, whose readers may be threads (the HTTP service's)."""

    @property
    def source(self) -> str:
        """Where the bytes are, for errors."""
        raise NotImplementedError

    def buffer(self) -> pa.Buffer:
        raise NotImplementedError

    def written_ms(self) -> int:
        """When the segment was last written, for the age of a segment without timestamps."""
        raise NotImplementedError

    def prefetch(self) -> None:
        """Start bringing the bytes close, for a read that comes next (a local segment has them already)."""

    def take_bytes(self) -> TakenBytes:
        """The segment's valid bytes now, for one read to take its headers and payloads from."""
        buffer = self.buffer()  # first: a remote segment fetched again forgets what it checked
        return TakenBytes(buffer, self._verified_generation)

    def scan(self, start_position: int, *, verify: bool = False, taken: TakenBytes | None = None,
             check_first: bool = False) -> Iterator[BatchHeader]:
        """Batch headers from ``start_position`` to the end of ``taken`` (by default, the bytes valid now).

        With ``verify``, each batch's CRC is checked once per process: batches in the verified range (read and
        checked before, or written by this process) are not checked again, and a batch checked next to it extends
        it. A read that starts inside a segment (a compaction's new messages, a consumer's position) is checked
        once too, not at every read. Bytes taken before the segment was fetched again are all checked, and what
        is checked in them counts for nothing after. ``check_first``: check the first batch even in the range
        (``start_position`` came from an offset index, which has no checksum).
        """
        taken = self.take_bytes() if taken is None else taken
        view = memoryview(taken.buffer)
        with self._verified_lock:
            current = taken.generation == self._verified_generation
            checked = ((self._verified_from, self._verified_bytes) if current else (0, 0)) if verify else None
        for header in scan_headers(view, start_position, len(view), checked, check_first=check_first):
            # every batch so far was checked now or lies in the range (a header that passes its end is checked)
            if verify and current:
                self._note_verified(start_position, header.end_position, taken.generation)
            yield replace(header, base_offset=header.base_offset + self.offset_shift) if self.offset_shift else header

    def _note_verified(self, start: int, end: int, generation: int) -> None:
        """The batches in [start, end) of the bytes of ``generation`` are checked: the verified range becomes their
        union with it when the two meet (or it when nothing is verified yet), unless the bytes were fetched again
        since."""
        with self._verified_lock:
            if generation != self._verified_generation:
                return
            low, high = self._verified_from, self._verified_bytes
            if low == high:
                self._verified_from, self._verified_bytes = start, end
            elif start <= high and end >= low:
                self._verified_from, self._verified_bytes = min(low, start), max(high, end)

    def forget_verified(self) -> None:
        """Check every batch again at its next read (this segment's bytes were fetched again)."""
        with self._verified_lock:
            self._verified_from = self._verified_bytes = 0
            self._verified_generation += 1

    def decode(self, buffer: pa.Buffer, header: BatchHeader) -> pa.RecordBatch:
        """The batch at ``header`` (from ``scan``), its offsets placed where the log has them."""
        return self._placed(decode_payload(buffer, header), header)

    def _placed(self, batch: pa.RecordBatch, first: BatchHeader) -> pa.RecordBatch:
        """``batch``, decoded from the batches starting with ``first``, its offsets placed where the log has them."""
        if not self.offset_shift or first.offsets_implied:  # those came from the headers, placed already
            return batch
        offsets = pc.add(batch.column(0), pa.scalar(self.offset_shift, pa.int64()))
        return pa.RecordBatch.from_arrays([offsets, *batch.columns[1:]], schema=batch.schema)

    def scan_from_offset(self, offset: int, *, verify: bool = False, taken: TakenBytes | None = None
                         ) -> Iterator[BatchHeader]:
        """Batch headers from the indexed batch at or before ``offset`` to the end (see ``scan``).

        The index has no checksum, so its entry is checked against the batch it points at: an entry whose batch
        starts at another offset would skip messages, and one inside a batch would fail the read of an intact log
        (an index scribbled on but still ordered). Then the scan starts from the segment's first batch instead,
        which is always right, only slower: damage the log really holds is met and reported there. With
        ``verify``, that first batch's CRC is checked even inside the verified range: bytes inside a batch may
        parse as a header of the right offset.
        """
        indexed_offset, position = self.offset_index.lookup(offset - self.base_offset)
        taken = self.take_bytes() if taken is None else taken
        headers = self.scan(position, verify=verify, taken=taken, check_first=position > 0)
        if position:
            try:
                first = next(headers, None)
            except BatchFormatError:
                first = None
            if first is None or first.base_offset != self.base_offset + indexed_offset:
                yield from self.scan(0, verify=verify, taken=taken)
                return
            yield first
        yield from headers

    def position_of(self, offset: int) -> int:
        """File position of the first batch holding ``offset`` or later offsets (the size if there is none)."""
        for header in self.scan_from_offset(offset):
            if header.last_offset >= offset:
                return header.position
        return self.size_bytes

    def read_batches(self, start_offset: int, end_offset: int, *, verify: bool, join_bytes: int = 0
                     ) -> Iterator[pa.RecordBatch]:
        """Record batches holding the messages with start_offset <= offset < end_offset, in offset order.

        ``join_bytes``: consecutive stored batches are returned as one until their stored bytes reach this (a
        batch that large alone, zero-copy), for readers whose costs are per batch rather than per message; 0: as
        stored.
        """
        taken = self.take_bytes()  # headers and payloads from the same fetch of a remote segment
        buffer = taken.buffer
        expected_offset = self.base_offset
        payloads: list[pa.RecordBatch] = []
        headers: list[BatchHeader] = []
        held_bytes = 0
        damage: CorruptSegmentError | None = None
        try:
            for header in self.scan_from_offset(start_offset, verify=verify, taken=taken):
                expected_offset = header.next_offset
                if header.next_offset <= start_offset:
                    continue
                if header.base_offset >= end_offset:
                    break
                if headers and (header.batch_length >= join_bytes or not same_payload_schema(headers[-1], header)):
                    yield from self._joined(payloads, headers, start_offset, end_offset)
                    payloads, headers, held_bytes = [], [], 0
                try:
                    payloads.append(read_payload(buffer, header))
                except BatchFormatError as error:
                    error.position = header.position
                    raise
                headers.append(header)
                held_bytes += header.batch_length
                if held_bytes >= join_bytes:
                    yield from self._joined(payloads, headers, start_offset, end_offset)
                    payloads, headers, held_bytes = [], [], 0
        except BatchFormatError as error:
            damage = CorruptSegmentError(self.source, error.position, expected_offset, error.reason)
            damage.__cause__ = error
        if headers:  # every message before a damaged batch is served before the error, joined or not
            yield from self._joined(payloads, headers, start_offset, end_offset)
        if damage is not None:
            raise damage

    def _joined(self, payloads: list[pa.RecordBatch], headers: list[BatchHeader], start_offset: int,
                end_offset: int) -> Iterator[pa.RecordBatch]:
        """The consecutive batches of ``headers`` as one, less its messages outside [start_offset, end_offset)."""
        batch = self._placed(joined_payloads(payloads, headers), headers[0])
        if headers[0].base_offset < start_offset or headers[-1].last_offset >= end_offset:
            offsets = batch.column(0).to_numpy()
            first, last = np.searchsorted(offsets, [start_offset, end_offset])
            batch = batch.slice(int(first), int(last - first))
        if batch.num_rows:
            yield batch

    def offset_for_timestamp(self, timestamp: int, *, from_offset: int = 0) -> int | None:
        """Offset of the first message at or after ``from_offset`` whose timestamp is >= ``timestamp``, or None
        if there is none here."""
        if self.max_timestamp < timestamp:
            return None
        taken = self.take_bytes()
        for header in self.scan_from_offset(self.base_offset + self.time_index.lookup(timestamp), taken=taken):
            if header.max_timestamp >= timestamp and header.last_offset >= from_offset:
                batch = self.decode(taken.buffer, header)
                offsets = batch.column(0).to_numpy()
                hits = np.flatnonzero((batch.column(1).to_numpy() >= timestamp) & (offsets >= from_offset))
                if len(hits):
                    return int(offsets[hits[0]])
        return None



class Segment(SegmentReads):
    def __init__(self, folder: Path, base_offset: int, *, index_interval_bytes: int,
                 temporary_suffix: str | None = None) -> None:
        """``temporary_suffix``: the segment's files carry one of Kafka's swap suffixes (``.cleaned``, ``.swap``)."""
        super().__init__()
        self.base_offset = base_offset
        self.folder = folder
        self.temporary_suffix = temporary_suffix
        self.log_path = _path(folder, base_offset, LOG_SUFFIX, temporary_suffix)
        self.offset_index = OffsetIndex(_path(folder, base_offset, OFFSET_INDEX_SUFFIX, temporary_suffix))
        self.time_index = TimeIndex(_path(folder, base_offset, TIME_INDEX_SUFFIX, temporary_suffix))
        self.index_interval_bytes = index_interval_bytes
        self.inode = 0
        """The log file's inode when opened: a file of the same name with another inode is another segment (the
        cleaner replaced this one)."""
        self.size_bytes = 0
        self.next_offset = base_offset
        self.first_timestamp = NO_TIMESTAMP
        self.max_timestamp = NO_TIMESTAMP
        self._bytes_since_index_entry = 0
        self._write_fd: int | None = None
        self._map: pa.Buffer | None = None

    # ----------------------------------------------------------------------------------------------- opening
    @classmethod
    def create(cls, folder: Path, base_offset: int, *, index_interval_bytes: int,
               temporary_suffix: str | None = None) -> Segment:
        segment = cls(folder, base_offset, index_interval_bytes=index_interval_bytes,
                      temporary_suffix=temporary_suffix)
        for path in (segment.log_path, segment.offset_index.path, segment.time_index.path):
            path.touch(exist_ok=False)
        segment.inode = segment.log_path.stat().st_ino
        return segment

    @classmethod
    def load(cls, folder: Path, base_offset: int, *, index_interval_bytes: int, recovering: bool,
             sealed: bool = False, temporary_suffix: str | None = None) -> Segment:
        """Open a segment without verifying it: trust its indexes when they look sound, rebuild them from batch
        headers otherwise, and read only the tail to find its end.

        ``recovering``: the caller holds the writer lock and the segment lies below the recovery point, so a
        rebuilt index is written back and an invalid batch is corruption. Otherwise (a reader, or a writer
        catching up with another process) nothing is written, and the segment ends at its last complete batch:
        the one after it may still be being written, unless the segment is ``sealed`` (a later one exists, so
        every write to this one has ended): then an invalid batch is corruption too.
        """
        segment = cls(folder, base_offset, index_interval_bytes=index_interval_bytes,
                      temporary_suffix=temporary_suffix)
        stat = segment.log_path.stat()
        file_bytes = segment.size_bytes = stat.st_size
        segment.inode = stat.st_ino
        sound = segment.offset_index.load() and segment.offset_index.is_consistent(file_bytes)
        sound = sound and segment.time_index.load()
        if sound:
            tail_start = segment.offset_index.values[-1] if segment.offset_index.values else 0
            if tail_start:
                first = read_header(memoryview(segment.buffer()), 0, file_bytes).message_first_timestamp
                segment.first_timestamp = NO_TIMESTAMP if first is None else first
            segment.max_timestamp = segment._last_time_entry()
            segment.size_bytes = tail_start
            segment._follow(file_bytes)
            sound = segment.time_index.is_consistent(segment.next_offset - base_offset)
        if not sound:
            logger.warning("Rebuilding the indexes of %s from its batches: they were missing or did not match the "
                           "log (%s).", segment.log_path, "written back" if recovering else "in memory only")
            failure = segment.rebuild_indexes(verify_from=None, persist=recovering)
            if failure is not None and not recovering:
                segment.size_bytes = failure.position
        if (recovering or sealed) and segment.size_bytes < file_bytes:
            segment.raise_unparsed_tail()
        return segment

    def raise_unparsed_tail(self) -> NoReturn:
        """Raise CorruptSegmentError for the bytes after the last batch that parses, in a segment that no write
        can be adding to (sealed, or below the recovery point)."""
        raise CorruptSegmentError(str(self.log_path), self.size_bytes, self.next_offset,
                                  "a batch of a sealed segment, or below the recovery point (fsynced), does not parse: "
                                  "not a torn write")

    def rebuild_indexes(self, *, verify_from: int | None, persist: bool = True,
                        fsynced_below: int | None = None) -> BatchFormatError | None:
        """Rebuild both indexes and the end state from the log, keeping every batch until the first invalid one.

        Batches starting at or after file position ``verify_from`` have their CRC checked (None: none are).
        ``persist``: write the rebuilt indexes to their files (only a holder of the writer lock may).
        ``fsynced_below``: an offset below which the segment's batches were fsynced (a writer's recovery point).
        When the indexes on disk are sound, their entries up to the last indexed batch at or before it are kept
        and the log is read again from that batch, its CRCs checked from there on, as Kafka recovers a log from
        its recovery point: a segment of many small batches is then not read whole at every open.
        Returns the error that stopped the scan (the log's valid part then ends there) or None.
        """
        self.size_bytes = file_bytes = self.log_path.stat().st_size
        view = memoryview(self.buffer())
        start = 0 if fsynced_below is None else self._keep_entries_below(view, fsynced_below)
        if start:
            verify_from = start
        else:
            self.offset_index.keys, self.offset_index.values = [], []
            self.time_index.keys, self.time_index.values = [], []
            self.next_offset, self.first_timestamp, self.max_timestamp = self.base_offset, NO_TIMESTAMP, NO_TIMESTAMP
        self._bytes_since_index_entry = 0
        failure = None
        headers = scan_headers(view, start, file_bytes, None if verify_from is None else (0, verify_from))
        self.size_bytes = start
        try:
            for header in headers:
                if header.base_offset < self.next_offset:
                    raise BatchFormatError(
                        f"offset {header.base_offset} does not follow {self.next_offset - 1}", header.base_offset
                    )
                self._remember(*self._take_in(header))
        except BatchFormatError as error:
            failure = error
        if persist:
            self.offset_index.rewrite()
            self.time_index.rewrite()
        return failure

    def _keep_entries_below(self, view: memoryview, offset: int) -> int:
        """Load the indexes and keep their entries up to the last indexed batch starting at or before ``offset``,
        with the end state there; returns that batch's position, or 0 (nothing kept) when the indexes on disk are
        missing or unsound, index no such batch but the first, or their entry does not point at its batch."""
        offsets, times = self.offset_index, self.time_index
        if not (offsets.load() and offsets.is_consistent(len(view)) and times.load()):
            return 0
        relative, position = offsets.lookup(offset - self.base_offset)
        if not position:
            return 0
        kept = bisect.bisect_right(offsets.keys, relative)
        del offsets.keys[kept:], offsets.values[kept:]
        kept = bisect.bisect_right(times.values, relative)
        del times.keys[kept:], times.values[kept:]
        try:  # the index has no checksum: its entry must point at the batch it names, as in scan_from_offset
            first = read_header(view, 0, len(view)).message_first_timestamp
            indexed = read_header(view, position, len(view) - position)
        except BatchFormatError:
            return 0
        if indexed.base_offset != self.base_offset + relative or not times.is_consistent(relative):
            return 0
        # the batch at ``position`` earned its offset entry, and a time entry if the time had grown before it
        self.first_timestamp = NO_TIMESTAMP if first is None else first
        self.max_timestamp = self._last_time_entry()
        self.next_offset = self.base_offset + relative
        return position

    def _last_time_entry(self) -> int:
        last = self.time_index.last_timestamp
        return NO_TIMESTAMP if last is None else last

    def _remember(self, offset_entry: tuple[int, int] | None, time_entry: tuple[int, int] | None) -> None:
        if offset_entry:
            self.offset_index.keys.append(offset_entry[0])
            self.offset_index.values.append(offset_entry[1])
        if time_entry:
            self.time_index.keys.append(time_entry[0])
            self.time_index.values.append(time_entry[1])

    def _take_in(self, header: BatchHeader) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """Account for a batch that now ends the segment; returns the (offset, time) index entries it earns.

        The one rule for sparse entries, shared by append, rebuild and following another writer, so all three
        produce the same index.
        """
        offset_entry = time_entry = None
        relative = header.base_offset - self.base_offset
        if self._bytes_since_index_entry > self.index_interval_bytes:
            offset_entry = (relative, header.position)
            if self.max_timestamp > self._last_time_entry():
                time_entry = (self.max_timestamp, relative)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.batch_length
        if self.first_timestamp == NO_TIMESTAMP and header.message_first_timestamp is not None:
            self.first_timestamp = header.message_first_timestamp
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        self.next_offset = header.next_offset
        self.size_bytes = header.end_position
        return offset_entry, time_entry

    # ----------------------------------------------------------------------------------------------- writing
    def append(self, encoded: EncodedBatch) -> None:
        """Append one encoded batch at the end of the valid bytes."""
        header = replace(encoded.header, position=self.size_bytes)
        if self._write_fd is None:
            self._write_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
        if faults.is_armed("segment.torn_write"):
            whole = b"".join(bytes(piece) for piece in encoded.pieces)
            os.write(self._write_fd, whole[: HEADER_BYTES + (len(whole) - HEADER_BYTES) // 2])
            faults.crash()
        write_all(self._write_fd, encoded.pieces)
        faults.crash_point("segment.after_write")
        offset_entry, time_entry = self._take_in(header)
        with self._verified_lock:
            if self._verified_bytes == header.position:  # written from bytes this process checksummed
                self._verified_bytes = self.size_bytes
        if offset_entry:
            self.offset_index.append(*offset_entry)
        if time_entry:
            self.time_index.append(*time_entry)

    def fsync(self) -> None:
        """fsync the log (through any descriptor: the kernel flushes the file's pages whoever wrote them) and
        the indexes."""
        if self._write_fd is not None:
            os.fsync(self._write_fd)
        else:
            fd = os.open(self.log_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.offset_index.fsync()
        self.time_index.fsync()

    def seal(self) -> None:
        """Mark the segment inactive: final time-index entry, everything fsynced, write handle closed."""
        relative_end = self.next_offset - self.base_offset
        if self.max_timestamp > self._last_time_entry():
            self.time_index.append(self.max_timestamp, relative_end)
        faults.crash_point("segment.seal_before_fsync")
        self.fsync()
        self.close()

    def truncate(self, valid_bytes: int) -> None:
        """Cut the log back to ``valid_bytes`` (the end of a verified batch) and rebuild the indexes."""
        self._map = None
        with self._verified_lock:
            self._verified_bytes = min(self._verified_bytes, valid_bytes)
            self._verified_from = min(self._verified_from, self._verified_bytes)
            self._verified_generation += 1
        with open(self.log_path, "r+b") as file:
            file.truncate(valid_bytes)
            os.fsync(file.fileno())
        self.rebuild_indexes(verify_from=None)

    def close(self) -> None:
        self.close_write_handle()
        self._map = None

    def close_write_handle(self) -> None:
        """Close the append descriptors but keep the memory map, so a read in progress can finish."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        self.offset_index.close()
        self.time_index.close()

    def rename_to_deleted(self, *, deleted_ms: int) -> None:
        """Kafka's ``changeFileSuffixes("", ".deleted")``: rename the log and both indexes ``.deleted``, the first
        step of an asynchronous delete; the files are removed after ``file.delete.delay.ms``.

        The segment follows its files: a reader holding it keeps reading through its memory map (a rename or an
        unlink leaves a mapped file's pages alone), or maps the ``.deleted`` file until it is removed. Each
        file's mtime is set to ``deleted_ms``, so the delay is measured on the clock of whoever deleted it.
        """
        self.close_write_handle()
        self.rename_files(DELETED_SUFFIX)
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            try:
                os.utime(path, ns=(deleted_ms * 1_000_000, deleted_ms * 1_000_000))
            except FileNotFoundError:
                continue  # an index a reader rebuilt in memory only was never written

    def rename_files(self, temporary_suffix: str | None) -> None:
        """Give the segment's files another temporary suffix (None: their final names): indexes first, the log
        last, so the log's name is the step that counts for recovery (storage/loader.py)."""
        indexes: tuple[tuple[OffsetIndex | TimeIndex, str], ...] = (
            (self.offset_index, OFFSET_INDEX_SUFFIX), (self.time_index, TIME_INDEX_SUFFIX))
        for index, suffix in indexes:
            target = _path(self.folder, self.base_offset, suffix, temporary_suffix)
            with contextlib.suppress(FileNotFoundError):  # an index a reader rebuilt in memory only was never written
                index.path.rename(target)
            index.path = target
        target = _path(self.folder, self.base_offset, LOG_SUFFIX, temporary_suffix)
        faults.crash_point("segment.before_log_rename")
        self.log_path.rename(target)
        self.log_path = target
        self.temporary_suffix = temporary_suffix

    def follow_rename(self, temporary_suffix: str | None) -> None:
        """Another process renamed this segment's files (same inode): point at the new names."""
        self.temporary_suffix = temporary_suffix
        self.log_path = _path(self.folder, self.base_offset, LOG_SUFFIX, temporary_suffix)
        self.offset_index.path = _path(self.folder, self.base_offset, OFFSET_INDEX_SUFFIX, temporary_suffix)
        self.time_index.path = _path(self.folder, self.base_offset, TIME_INDEX_SUFFIX, temporary_suffix)

    # ----------------------------------------------------------------------------------------------- reading
    @property
    def source(self) -> str:
        return str(self.log_path)

    def written_ms(self) -> int:
        return self.log_path.stat().st_mtime_ns // 1_000_000

    def buffer(self) -> pa.Buffer:
        """The valid bytes as a zero-copy buffer over a memory map, widened when the file has grown; raises
        SegmentDeletedError when retention or cleaning removed the file before this reader mapped it."""
        if self._map is None or self._map.size < self.size_bytes:
            if self.size_bytes == 0:
                return pa.py_buffer(b"")
            try:
                with pa.memory_map(str(self.log_path), "r") as mapped:
                    self._map = mapped.read_buffer()
            except FileNotFoundError:
                raise SegmentDeletedError(str(self.log_path)) from None
        return self._map.slice(0, self.size_bytes)

    def follow_growth(self) -> int:
        """Take in batches another process appended since we last looked; returns the file's size as seen (0 for
        a file not there yet, as a read-only store sees a partition never written): bytes past ``size_bytes`` are
        a batch still being written, or one a dead writer left torn."""
        try:
            file_bytes = self.log_path.stat().st_size
        except FileNotFoundError:
            return 0
        if file_bytes > self.size_bytes:
            self._follow(file_bytes)
        return file_bytes

    def _follow(self, file_bytes: int) -> None:
        """Take in every complete batch between the valid end and ``file_bytes`` (in memory only)."""
        with pa.memory_map(str(self.log_path), "r") as mapped:
            self._map = mapped.read_buffer()
        view = memoryview(self._map)
        while True:
            try:
                header = read_header(view, self.size_bytes, file_bytes - self.size_bytes)
            except BatchFormatError:
                break  # a batch still being written, or the end
            self._remember(*self._take_in(header))


S = TypeVar("S", bound=SegmentReads)


def segments_from(segments: list[S], offset: int) -> list[S]:
    """The segments from the one holding ``offset`` on (from the first if ``offset`` is below it)."""
    bases = [segment.base_offset for segment in segments]
    return segments[max(bisect.bisect_right(bases, offset) - 1, 0) :]


def batches_of_segments(segments: list[S], start_offset: int, end_offset: int, *, verify: bool,
                        join_bytes: int = 0) -> Iterator[pa.RecordBatch]:
    """The batches of ``segments`` (in offset order) with start_offset <= offset < end_offset, joined up to
    ``join_bytes`` within a segment (``SegmentReads.read_batches``); each segment's next one is prefetched while
    it is read."""
    chosen = [segment for segment in segments_from(segments, start_offset) if segment.base_offset < end_offset]
    for number, segment in enumerate(chosen):
        if number + 1 < len(chosen):
            chosen[number + 1].prefetch()
        yield from segment.read_batches(start_offset, end_offset, verify=verify, join_bytes=join_bytes)


def _path(folder: Path, base_offset: int, suffix: str, temporary_suffix: str | None) -> Path:
    path = segment_file(folder, base_offset, suffix)
    return path if temporary_suffix is None else with_temporary_suffix(path, temporary_suffix)


def scan_headers(view: memoryview, position: int, end: int, checked: tuple[int, int] | None, *,
                 check_first: bool = False) -> Iterator[BatchHeader]:
    """Headers of the batches from ``position`` to ``end``, checking the CRC of each one that does not lie within
    the range ``checked`` (None: of none), and of the first one anyway with ``check_first``. A header that starts
    in the range and ends past it is no batch of the range (a read started at a position inside a batch): it is
    checked."""
    first = True
    while position < end:
        try:
            header = read_header(view, position, end - position)
            if checked is not None and ((first and check_first)
                                        or not checked[0] <= position < header.end_position <= checked[1]):
                verify_batch(view, header)
        except BatchFormatError as error:
            error.position = position
            raise
        yield header
        position, first = header.end_position, False
