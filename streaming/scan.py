"""The Spark SQL batch source over a topic: ``spark.read.format("ledgerview")`` (a PySpark Python Data Source).

Three views (``option("view", ...)``):

- ``compacted`` (the default, and the views ``register_views`` makes): a **table**, one row per live key with its
  latest message as of planning, tombstoned keys absent: the ledger merged with the raw tail at read time
  (readers/snapshot.py).
- ``read_compacted``: the rows a ``read_compacted`` consumer gets, Pulsar's shape (DESIGN.md invariant 4): the
  ledger, then every raw message above the horizon, tombstones and older versions included.
- ``raw``: every message of the log.

Planning (one Python planner process): options are checked (streaming/options.py), pushed filters are folded into
ScanFilters, and each log partition the filters allow is read up to its end offset then, so every task reads one
consistent cut. Tasks are sized as Spark sizes file splits (``_piece_bytes``): a raw partition is cut into offset
ranges (``segment_runs``), a table's ledger into offset ranges whose tasks all read the ledger planned on, the
last of them also folding and serving the raw tail; a ``read_compacted`` partition is one task, which reads the
ledger planned on too.
``startingOffsets`` / ``endingOffsets`` bound ``raw`` and ``read_compacted`` reads, as in Spark's Kafka source; a
table is always read whole, as of planning (filter ``offset`` to narrow it).

Reading (executor processes): batches stay Arrow from the segment to Spark. With keys pushed down, the ledger is
answered through its key index instead of a scan (a ledger written without one: the task's offset range of it is
read and filtered).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from readers.partition_read import PartitionRead
from readers.snapshot import LedgerRemovedError, fold_tail, ledger_rows_of_keys, live_rows, snapshot_batches
from storage.compacted import CompactionCursor
from storage.readable import ReadableStore
from storage.schema import with_partition_column
from storage.segment import JOINED_READ_BYTES
from streaming.options import BATCH_READ, InvalidOptionError, Options, resolve_offsets, topic_offsets
from streaming.rows import SparkRows
from streaming.scan_filters import ScanFilters
from streaming.source_offsets import EARLIEST, LATEST, checked_start
from streaming.store_cache import cached_readable_store

VIEWS = ("compacted", "read_compacted", "raw")
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
MIN_PIECE_BYTES = 4 * 1024 * 1024
"""No task reads less (Spark's spark.sql.files.openCostInBytes): a task costs a few milliseconds to start."""
WHERE = "spark.read.format('ledgerview')"


@dataclass(frozen=True)
class ScanOptions:
    """What ``spark.read.format("ledgerview")`` is asked for."""

    path: str
    topic: str
    view: str
    starting: str | dict[int, int]
    """"earliest", or an offset (or -2 / -1) per partition."""
    ending: str | dict[int, int]
    """"latest", or an offset (or -1) per partition."""
    fail_on_data_loss: bool
    max_partition_bytes: int
    min_partitions: int
    """Split partitions so that a read has at least this many tasks (Kafka's minPartitions)."""

    @classmethod
    def parse(cls, given: Any) -> ScanOptions:
        options = Options(given, BATCH_READ, WHERE)
        topic = options.required("topic")
        view = options.choice("view", VIEWS, "compacted")
        for bound in ("startingOffsets", "endingOffsets"):
            if view == "compacted" and options.get(bound) is not None:
                raise InvalidOptionError(WHERE, bound, options.get(bound), "no offset bounds with view=compacted (a "
                                         "table is read whole, as of planning); use view=read_compacted or raw for "
                                         "offset ranges, or filter on offset")
        starting = options.offsets("startingOffsets", "earliest", words=("earliest",))
        ending = options.offsets("endingOffsets", "latest", words=("latest",))
        return cls(options.required("path"), topic, view,
                   starting if isinstance(starting, str) else topic_offsets(WHERE, "startingOffsets", starting, topic),
                   ending if isinstance(ending, str) else topic_offsets(WHERE, "endingOffsets", ending, topic),
                   options.flag("failOnDataLoss", True),
                   options.positive("maxPartitionBytes") or DEFAULT_MAX_PARTITION_BYTES,
                   options.positive("minPartitions") or os.cpu_count() or 1)


@dataclass(frozen=True)
class ScanPartition(InputPartition):
    """One Spark task: log partition ``partition``, offsets [start_offset, end_offset); a ``read_compacted``
    start of -2 is the compacted view's earliest (the whole ledger)."""

    partition: int
    start_offset: int
    end_offset: int
    pinned: CompactionCursor | None = None
    """``read_compacted``: the cursor of the ledger planned on; None when the partition had none (raw: None)."""


@dataclass(frozen=True)
class TablePiece(InputPartition):
    """One Spark task of the table view: the live rows of ledger offsets [ledger_start, ledger_end) of the
    ledger planned on, and (one piece per partition) the raw tail's up to ``end_offset``."""

    partition: int
    end_offset: int
    pinned: tuple[int, int] | None
    """(ledger id, horizon) planned on; None before the first compaction: the raw log is read, folded."""
    ledger_start: int
    ledger_end: int
    with_tail: bool


class TopicScan(DataSourceReader):
    """Batch reads of one topic's view; see the module docstring."""

    def __init__(self, options: ScanOptions) -> None:
        self.options = options
        self.filters = ScanFilters()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.filters, rejected = ScanFilters().accept(filters)
        yield from rejected

    def partitions(self) -> Sequence[InputPartition]:
        store, topic = cached_readable_store(self.options.path), self.options.topic
        count = store.topic_metadata(topic).partitions
        earliest, latest, log_starts = {}, {}, {}
        for partition in range(count):
            log_starts[partition] = store.start_offset(topic, partition)
            earliest[partition] = 0 if self.options.view == "read_compacted" else log_starts[partition]
            latest[partition] = store.end_offset(topic, partition)
        starts = self._bounds("startingOffsets", self.options.starting, earliest, latest, (EARLIEST, LATEST))
        ends = self._bounds("endingOffsets", self.options.ending, earliest, latest, (LATEST,))
        for partition, end in ends.items():
            if end < starts[partition]:  # as Spark's Kafka source refuses it, rather than read nothing
                raise InvalidOptionError(WHERE, "endingOffsets", end, f"an offset of {topic}-{partition} at or "
                                         f"after its startingOffsets, {starts[partition]}")
        chosen = [p for p in range(count) if self.filters.partitions is None or p in self.filters.partitions]
        if self.options.view == "compacted":
            return self._table_pieces(store, chosen, latest)
        piece_bytes = self._piece_bytes(sum(store.size_bytes(topic, p) for p in chosen))
        planned: list[InputPartition] = []
        for partition in chosen:
            start, end = starts[partition], ends[partition]
            if self.options.view == "raw":
                start = checked_start(topic, partition, start, log_starts[partition],
                                      fail_on_data_loss=self.options.fail_on_data_loss)
                start, end = self.filters.offsets.contains_range(start, end)
                planned += [ScanPartition(partition, low, high)
                            for low, high in segment_runs(store.segments(topic, partition), start, end, piece_bytes)]
            else:  # read_compacted: offset 0 of the compacted view is its earliest
                cursor = store.compacted_ledgers(topic, partition).read_cursor()
                if start != 0:
                    start = self._compacted_start(partition, cursor, start, log_starts[partition])
                planned.append(ScanPartition(partition, EARLIEST if start == 0 else start, end, cursor))
        return planned

    def _compacted_start(self, partition: int, cursor: CompactionCursor | None, start: int, log_start: int) -> int:
        """Where a ``read_compacted`` read from offset ``start`` begins: the ledger serves offsets up to its
        horizon, the raw log those above; a raw offset retention deleted is data loss (DataLossError with
        failOnDataLoss, else the read begins at the log start), as in the raw view."""
        if cursor is not None and start <= cursor.horizon:
            return start
        return checked_start(self.options.topic, partition, start, log_start,
                             fail_on_data_loss=self.options.fail_on_data_loss)

    def _piece_bytes(self, total_bytes: int) -> int:
        """Bytes per task, as Spark sizes file splits: enough for minPartitions tasks, but at least
        MIN_PIECE_BYTES, and never more than maxPartitionBytes."""
        return min(self.options.max_partition_bytes,
                   max(MIN_PIECE_BYTES, -(-total_bytes // self.options.min_partitions)))

    def _table_pieces(self, store: ReadableStore, chosen: list[int], latest: dict[int, int]) -> (
        list[InputPartition]
    ):
        """The table view: each partition's ledger split into offset ranges of about the piece size, every task
        pinned to the ledger the cursor names now; the last piece of a partition also serves its tail."""
        cursors = {p: store.compacted_ledgers(self.options.topic, p).read_cursor() for p in chosen}
        piece_bytes = self._piece_bytes(sum(c.ledger_bytes for c in cursors.values() if c is not None))
        pieces: list[InputPartition] = []
        for partition in chosen:
            cursor = cursors[partition]
            if cursor is None:
                pieces.append(TablePiece(partition, latest[partition], None, 0, 0, True))
                continue
            count = max(1, -(-cursor.ledger_bytes // piece_bytes))
            bounds = [cursor.horizon * index // count + (index > 0) for index in range(count)] + [cursor.horizon + 1]
            pinned = (cursor.ledger_id, cursor.horizon)
            pieces += [TablePiece(partition, latest[partition], pinned, low, high, index == count - 1)
                       for index, (low, high) in enumerate(itertools.pairwise(bounds))]
        return pieces

    def _bounds(self, option: str, chosen: str | dict[int, int], earliest: dict[int, int],
                latest: dict[int, int], codes: tuple[int, ...]) -> dict[int, int]:
        if chosen == "earliest":
            return earliest
        if chosen == "latest":
            return latest
        assert isinstance(chosen, dict)
        return resolve_offsets(WHERE, option, chosen, self.options.topic, earliest=earliest, latest=latest,
                               allowed_codes=codes)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, (ScanPartition, TablePiece)):  # Spark's stand-in for no partitions
            return iter(())
        return self._read(partition)

    def _read(self, planned: ScanPartition | TablePiece) -> Iterator[pa.RecordBatch]:
        store = cached_readable_store(self.options.path)
        rows = SparkRows(self.options.topic)
        batches = self._table_rows(store, planned) if isinstance(planned, TablePiece) else \
            self._stored_batches(store, planned)
        for batch in batches:
            selected = self.filters.apply(rows.convert(batch))
            if selected.num_rows:
                yield selected

    def _table_rows(self, store: ReadableStore, piece: TablePiece) -> Iterator[pa.RecordBatch]:
        offsets = self.filters.offsets
        low = piece.ledger_start if offsets.low is None else max(offsets.low, piece.ledger_start)
        high = piece.ledger_end if offsets.high is None else min(offsets.high, piece.ledger_end)
        if offsets.high is not None and offsets.high <= (0 if offsets.low is None else offsets.low):
            return  # an empty range reads nothing, not even the tail
        if piece.pinned is None:
            # No ledger at planning: the table is the raw log's up to the planned end, even when a compaction has
            # published one since (its ledger would answer as of its horizon, not as planned).
            # From the log start the read finds, not one asked for first as snapshot_batches does for its tail.
            yield from live_rows(fold_tail(store.read_batches(self.options.topic, piece.partition, None,
                                                              piece.end_offset), self.filters.keys))
            return
        yield from snapshot_batches(store, self.options.topic, piece.partition, piece.end_offset,
                                    keys=self.filters.keys, ledger_offsets=(low, max(low, high)),
                                    pinned=piece.pinned, with_tail=piece.with_tail)

    def _stored_batches(self, store: ReadableStore, planned: ScanPartition) -> Iterator[pa.RecordBatch]:
        topic, partition = self.options.topic, planned.partition
        if self.options.view == "raw":
            if planned.start_offset < planned.end_offset:
                yield from store.read_batches(topic, partition, planned.start_offset, planned.end_offset,
                                              join_bytes=JOINED_READ_BYTES)
            return
        offsets = self.filters.offsets
        low = 0 if offsets.low is None else offsets.low  # 0 is a bound too: never test bounds by truth
        if offsets.high is not None and offsets.high <= low:
            return
        yield from self._read_compacted(store, planned, low)

    def _read_compacted(self, store: ReadableStore, planned: ScanPartition, low: int) -> Iterator[pa.RecordBatch]:
        read = _pinned_read(store, self.options.topic, planned)
        try:
            high = self.filters.offsets.high
            read.ledger_start, read.raw_start = max(read.ledger_start, low), max(read.raw_start, low)
            read.end_offset = min(read.end_offset, planned.end_offset, planned.end_offset if high is None else high)
            if self.filters.keys is not None and read.ledger is not None:
                yield from _ledger_lookups(read, self.filters.keys)
                read.ledger.close()
                read.ledger = read.cursor = None
            yield from read.batches()
        finally:
            read.close()


def _pinned_read(store: ReadableStore, topic: str, planned: ScanPartition) -> PartitionRead:
    """The read of a ``read_compacted`` task on the ledger planned on, whether current or retired since by a
    compaction (or on none, as planned), so that the answer is the one planned: a newer ledger no longer holds
    the versions it replaced. Its start resolves as readers/partition_read.py resolves an earliest or offset
    start: the ledger from 0 (earliest) or from an offset up to its horizon, then the raw log above it; an
    offset above the horizon reads the raw log from there."""
    partition, cursor, start = planned.partition, planned.pinned, planned.start_offset
    log_start, end = store.start_offset(topic, partition), store.end_offset(topic, partition)
    if cursor is None or start > cursor.horizon:
        return PartitionRead(store, topic, partition, None, None, end, log_start if start == EARLIEST else start, end)
    ledger = store.compacted_ledgers(topic, partition).open_ledger(cursor.ledger_id, verify=store.verify_reads)
    if ledger is None:
        raise LedgerRemovedError(topic, partition, cursor.ledger_id)
    return PartitionRead(store, topic, partition, cursor, ledger, max(start, 0), max(cursor.horizon + 1, log_start),
                         end)


def _ledger_lookups(read: PartitionRead, keys: frozenset[bytes]) -> Iterator[pa.RecordBatch]:
    """The ledger messages of ``keys`` (readers/snapshot.py ``ledger_rows_of_keys``), in offset order, within the
    offsets the read's ledger part serves (``PartitionRead.batches``): from ``ledger_start`` to the horizon (or
    ``ledger_end``), below ``end_offset``."""
    assert read.ledger is not None
    stop = min(read.horizon + 1 if read.ledger_end is None else read.ledger_end, read.end_offset)
    for batch in ledger_rows_of_keys(read.ledger, keys, read.ledger_start, stop):
        yield with_partition_column(batch, read.partition)


def segment_runs(segments: Sequence[Any], start: int, end: int, max_bytes: int) -> list[tuple[int, int]]:
    """Split offsets [start, end) into runs of about ``max_bytes`` each (at least one run when the range is not
    empty): whole segments together, and a segment larger than that cut into equal offset ranges (a read
    starts anywhere through the offset index)."""
    if start >= end:
        return []
    chunks: list[tuple[int, int, float]] = []
    for index, segment in enumerate(segments):
        following = segments[index + 1].base_offset if index + 1 < len(segments) else end
        low, high = max(start, segment.base_offset), min(end, following)
        if low >= high:
            continue
        covered = segment.size_bytes * (high - low) / max(following - segment.base_offset, 1)
        pieces = max(1, min(high - low, int(covered // max_bytes)))
        cuts = [low + (high - low) * piece // pieces for piece in range(pieces)] + [high]
        chunks += [(a, b, covered / pieces) for a, b in itertools.pairwise(cuts)]
    runs: list[tuple[int, int]] = []
    run_start, run_bytes = chunks[0][0] if chunks else start, 0.0
    for low, _, size in chunks:
        if run_bytes and run_bytes + size > max_bytes * 1.25:
            runs.append((run_start, low))
            run_start, run_bytes = low, 0.0
        run_bytes += size
    runs.append((run_start, end))
    return runs
