"""The Spark streaming source: ``spark.readStream.format("ledgerview")`` over a topic's raw log or its compacted
view.

``view=raw`` (the default) reads every message. ``view=compacted`` reads as Pulsar's readCompacted consumer does:
from earliest, the latest-per-key snapshot first (the compacted ledger, whole: a snapshot is never skipped
because retention passed its offsets), then every later change (each raw message above the horizon, tombstones
included). The planner runs in one long-lived Python process per query; ``read`` runs in executors and hands
Arrow batches through.

Offsets (the checkpoint's JSON) are per partition, each the next offset to read: ``{"0": 120, "1": 98}`` for the raw
log, with the topic's creation time beside them (``"created_ms"``, below). The compacted view adds the ledger that
the messages below it came from, and that ledger's horizon, ``{"0": {"offset": 120, "ledger": 3, "horizon": 99}}``
(the horizon says which deletions the query may not have seen, below), because continuing on a different ledger
would skip tombstones: a consumer that got key k's value from ledger 3 must see k's tombstone even if ledger 4,
published since, no longer holds k. So a micro-batch [s, e) of the compacted view serves the current ledger from s
(then the raw tail) when the messages below s came from that very ledger, or s is 0; otherwise it reads the raw log
from s, every version, the ledger standing in only for offsets retention removed (readers/partition_read.py,
``Resume``). Its end is tagged with the ledger it was planned to serve, or none when it was planned to read raw; a
compaction published between planning and reading makes the task read raw and the next batch see the tag differ, so
no batch ever skips a tombstone.
That keeps a query resumable from its checkpoint across any number of compactions and retention.

A topic deleted and created again is data loss, as the offsets read belong to the old log and going on from them
would skip the new log's first messages. It is told by a partition whose log now ends below the query's position
(TopicRecreatedError; also a partition that lost messages it had not flushed), or else by the topic's creation
time, which offsets hold as ``"created_ms"`` (TopicReplacedError; offsets checkpointed before they held it are
not checked so, nor is a topic created again within the same millisecond). With failOnDataLoss the query fails;
without it those partitions are read again from the view's start (the raw log start; the compacted view's whole
snapshot), as by a query started from earliest.

Options (streaming/options.py): ``path``, ``topic``, ``view``, ``startingOffsets`` (Kafka's, used only when the
query first starts), ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` with ``maxTriggerDelay``,
``failOnDataLoss``.

Data loss: retention (or delete_records) may delete raw offsets a query has not read yet, and the compacted view
loses them too when its ledger does not cover them. With failOnDataLoss the query fails with DataLossError naming
the partition and the lost range; without it the source skips to the log start and goes on, as Kafka's does. When
the ledger does cover them but the query read raw below them, the ledger cannot show the deletions among them (it
leaves deleted keys out): if the compaction cursor says a compaction left out a tombstone there, the query fails
with DeletionLossError, and without failOnDataLoss it goes on from the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from readers.partition_read import open_partition_read
from readers.positions import Resume
from storage.compacted import CompactionCursor
from storage.dropped_tombstones import meeting
from storage.readable import ReadableStore
from storage.segment import JOINED_READ_BYTES
from streaming.options import STREAM_READ, InvalidOptionError, Options, resolve_offsets, topic_offsets
from streaming.rows import SparkRows
from streaming.scan import DEFAULT_MAX_PARTITION_BYTES, segment_runs
from streaming.source_offsets import (
    EARLIEST,
    LATEST,
    DeletionLossError,
    TopicRecreatedError,
    TopicReplacedError,
    admitted,
    checked_start,
)
from streaming.store_cache import cached_readable_store

VIEWS = ("raw", "compacted")
WHERE = "spark.readStream.format('ledgerview')"
DEFAULT_MAX_TRIGGER_DELAY = "15m"
CREATED_MS = "created_ms"
"""The offsets' key for the topic's creation time (see the module docstring)."""


@dataclass(frozen=True)
class SourceOptions:
    path: str
    topic: str
    compacted: bool
    starting: str | dict[int, int]
    max_offsets: int | None
    min_offsets: int | None
    max_trigger_delay_ms: int
    fail_on_data_loss: bool
    max_partition_bytes: int

    @classmethod
    def parse(cls, given: Any) -> SourceOptions:
        options = Options(given, STREAM_READ, WHERE)
        topic = options.required("topic")
        starting = options.offsets("startingOffsets", "latest", words=("earliest", "latest"))
        max_offsets, min_offsets = options.positive("maxOffsetsPerTrigger"), options.positive("minOffsetsPerTrigger")
        if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
            # as Spark's Kafka source refuses it: no micro-batch could ever hold the minimum
            raise InvalidOptionError(WHERE, "minOffsetsPerTrigger", min_offsets,
                                     f"a positive integer no greater than maxOffsetsPerTrigger ({max_offsets})")
        return cls(options.required("path"), topic, options.choice("view", VIEWS, "raw") == "compacted",
                   starting if isinstance(starting, str) else topic_offsets(WHERE, "startingOffsets", starting, topic),
                   max_offsets, min_offsets,
                   options.duration_ms("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY),
                   options.flag("failOnDataLoss", True),
                   options.positive("maxPartitionBytes") or DEFAULT_MAX_PARTITION_BYTES)


@dataclass(frozen=True)
class Position:
    """A partition's next offset, and for the compacted view the ledger the messages below it came from."""

    offset: int
    ledger: int | None = None
    horizon: int = -1
    """The horizon of ``ledger``: a key the query holds from it is live there, so only a deletion above it can be
    one the query has not seen. -1 without a ledger (and in offsets checkpointed before it was kept)."""


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    partition: int
    start_offset: int
    end_offset: int
    ledger: int | None
    """Compacted view: the tag of ``start_offset`` (see the module docstring); raw view: None."""
    horizon: int = -1
    """The tag's horizon (Position.horizon)."""


class TopicStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a topic's raw log or compacted view; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target: dict[int, int] | None = None
        self.rows = SparkRows(options.topic)
        self._last_batch_ms: float | None = None
        self.clock_ms: Callable[[], float] = lambda: time.monotonic() * 1000
        """The planner's clock for maxTriggerDelay (tests set their own)."""

    @property
    def store(self) -> ReadableStore:
        """The data folder's store, or the remote tier read alone (``path`` ``s3://bucket/prefix``)."""
        return cached_readable_store(self.options.path)

    # ------------------------------------------------------------------------------------- offsets (planner)
    def _encode(self, positions: dict[int, Position]) -> dict[str, Any]:
        offsets: dict[str, Any] = {CREATED_MS: self._created_ms()}
        if self.options.compacted:
            return offsets | {str(p): {"offset": pos.offset, "ledger": pos.ledger, "horizon": pos.horizon}
                              for p, pos in sorted(positions.items())}
        return offsets | {str(p): pos.offset for p, pos in sorted(positions.items())}

    def _decode(self, offsets: dict[str, Any]) -> dict[int, Position]:
        return {int(p): Position(int(v["offset"]), v["ledger"], int(v.get("horizon", -1))) if isinstance(v, dict)
                else Position(int(v)) for p, v in offsets.items() if p != CREATED_MS}

    def _created_ms(self) -> int:
        return self.store.topic_metadata(self.options.topic).created_ms

    def _continued(self, start: dict[str, Any], ends: dict[int, int]) -> dict[int, Position]:
        """Where each partition's range up to ``ends`` begins: at ``start``, unless the topic was created again
        since (another creation time, or the partition's log now ends below ``start``); then, as data loss,
        TopicReplacedError or TopicRecreatedError with failOnDataLoss, else the view's start (see the module
        docstring). A partition ``start`` lacks begins at 0."""
        decoded = self._decode(start)
        begin = {partition: decoded.get(partition, Position(0)) for partition in ends}
        gone_back = sorted(partition for partition, end in ends.items() if end < begin[partition].offset)
        created_ms = self._created_ms()
        replaced = start.get(CREATED_MS, created_ms) != created_ms  # offsets written without it: not told so
        if self.options.fail_on_data_loss and gone_back:
            first = gone_back[0]
            raise TopicRecreatedError(self.options.topic, first, begin[first].offset, ends[first])
        if self.options.fail_on_data_loss and replaced:
            raise TopicReplacedError(self.options.topic, int(start[CREATED_MS]), created_ms)
        return {partition: Position(self._earliest(partition)) if replaced or partition in gone_back else position
                for partition, position in begin.items()}

    def _earliest(self, partition: int) -> int:
        """The view's first offset: the raw log start, or in the compacted view of a compacted partition 0 (the
        whole ledger, even where retention passed its offsets). A partition never compacted is its raw log."""
        if self._cursor(partition) is not None:
            return 0
        return self.store.start_offset(self.options.topic, partition)

    def _partitions(self) -> range:
        return range(self.store.topic_metadata(self.options.topic).partitions)

    def _end_offsets(self) -> dict[int, int]:
        return {p: self.store.end_offset(self.options.topic, p) for p in self._partitions()}

    def _cursor(self, partition: int) -> CompactionCursor | None:
        if not self.options.compacted:
            return None
        return self.store.compacted_ledgers(self.options.topic, partition).read_cursor()

    def initialOffset(self) -> dict[str, Any]:
        topic = self.options.topic
        ends = self._end_offsets()
        earliest = {p: self._earliest(p) for p in ends}
        starting = self.options.starting
        if starting in ("earliest", "latest"):
            chosen = earliest if starting == "earliest" else ends
        else:
            assert isinstance(starting, dict)
            chosen = resolve_offsets(WHERE, "startingOffsets", starting, topic, earliest=earliest, latest=ends,
                                     allowed_codes=(EARLIEST, LATEST))
            for p, offset in chosen.items():
                checked_start(topic, p, offset, earliest[p], fail_on_data_loss=self.options.fail_on_data_loss)
        # A chosen start is a fresh read of the view as it is now: the messages below it count as the current
        # ledger's, so the ledger is served from there.
        return self._encode({p: _served(offset, self._cursor(p)) for p, offset in chosen.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._end_offsets()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next micro-batch's end: every partition's end (or the availableNow target), at most
        maxOffsetsPerTrigger offsets, nothing new while fewer than minOffsetsPerTrigger wait and
        maxTriggerDelay has not passed (availableNow takes what there is: waiting could never end)."""
        ends = self.target if self.target is not None else self._end_offsets()
        begin = self._continued(start, ends)
        offsets = {p: max(end, begin[p].offset) for p, end in ends.items()}
        if isinstance(limit, ReadMaxRows):
            offsets = admitted({p: pos.offset for p, pos in begin.items()}, offsets, limit.max_rows)
        if self._waits_for_more(begin, offsets):
            return start
        self._last_batch_ms = self.clock_ms()
        return self._encode({p: self._tagged(p, begin[p], end) for p, end in offsets.items()})

    def _waits_for_more(self, begin: dict[int, Position], ends: dict[int, int]) -> bool:
        now = self.clock_ms()
        if self._last_batch_ms is None:
            self._last_batch_ms = now
        minimum = self.options.min_offsets
        if minimum is None or self.target is not None:
            return False
        waiting = sum(end - begin[p].offset for p, end in ends.items())
        return waiting < minimum and now - self._last_batch_ms < self.options.max_trigger_delay_ms

    def _tagged(self, partition: int, begin: Position, end: int) -> Position:
        """The end of a planned range with its ledger tag (see the module docstring)."""
        if not self.options.compacted:
            return Position(end)
        if end <= begin.offset:
            return begin
        cursor = self._cursor(partition)
        if cursor is None:
            return Position(end)
        reads_raw = 0 < begin.offset <= cursor.horizon and begin.ledger != cursor.ledger_id
        return Position(end) if reads_raw else _served(end, cursor)

    def reportLatestOffset(self) -> dict[str, Any]:
        return {str(p): end for p, end in sorted(self._end_offsets().items())}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        stop = self._decode(end)
        begin = self._continued(start, {p: position.offset for p, position in stop.items()})
        ranges = []
        for partition, end_position in sorted(stop.items()):
            first = begin[partition]
            start_offset = self._checked_start(partition, first)
            if start_offset >= end_position.offset:
                continue
            if self.options.compacted:  # the ledger tag belongs to the range's start: one task
                ranges.append(OffsetRange(partition, start_offset, end_position.offset, first.ledger, first.horizon))
                continue
            segments = self.store.segments(self.options.topic, partition)
            ranges += [OffsetRange(partition, low, high, None) for low, high in
                       segment_runs(segments, start_offset, end_position.offset, self.options.max_partition_bytes)]
        return ranges

    def _checked_start(self, partition: int, position: Position) -> int:
        """Where a read planned from ``position`` (its offset: ``wanted``) starts. Raw offsets it needs that
        retention deleted are data loss (DataLossError with failOnDataLoss; else the read goes on from the log
        start). The compacted view needs raw offsets from ``wanted``, or only from above the horizon when it serves
        the ledger (as ``Resume`` does: the tag matches, or ``wanted`` is 0 or below the log start).

        Where the ledger stands in for deleted offsets the query would have read raw (``wanted`` below the log
        start, under another tag), a tombstone a compaction left out among them is data loss too
        (DeletionLossError), as the ledger cannot show the deletion; with an older ledger's tag, only one above
        that ledger's horizon (the keys the query holds from it were live there)."""
        wanted, ledger = position.offset, position.ledger
        topic = self.options.topic
        log_start = self.store.start_offset(topic, partition)
        fail = self.options.fail_on_data_loss
        if not self.options.compacted:
            return checked_start(topic, partition, wanted, log_start, fail_on_data_loss=fail)
        cursor = self._cursor(partition)
        needed = wanted
        if cursor is not None and wanted <= cursor.horizon and (
                wanted == 0 or wanted < log_start or ledger == cursor.ledger_id):
            needed = cursor.horizon + 1
            stands_in = 0 < wanted < log_start and ledger != cursor.ledger_id
            unseen = max(wanted, position.horizon + 1)
            dropped = meeting(cursor.dropped_tombstones, unseen, log_start - 1) if stands_in else None
            if fail and dropped is not None:
                raise DeletionLossError(topic, partition, wanted, log_start, dropped)
        checked_start(topic, partition, needed, log_start, fail_on_data_loss=fail)
        return wanted

    # ------------------------------------------------------------------------------------- reads (executors)
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())
        return self._read(partition)

    def _read(self, planned: OffsetRange) -> Iterator[pa.RecordBatch]:
        start = self._checked_start(planned.partition, Position(planned.start_offset, planned.ledger, planned.horizon))
        if not self.options.compacted:
            for batch in self.store.read_batches(self.options.topic, planned.partition, start, planned.end_offset,
                                                 join_bytes=JOINED_READ_BYTES):
                yield self.rows.convert(batch)
            return
        read = open_partition_read(self.store, self.options.topic, planned.partition,
                                   Resume(start, planned.ledger), read_compacted=True)
        try:
            read.end_offset = min(read.end_offset, planned.end_offset)
            for batch in read.batches():
                if batch.num_rows:
                    yield self.rows.convert(batch)
        finally:
            read.close()

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the store keeps no per-query state for readers."""


def _served(offset: int, cursor: CompactionCursor | None) -> Position:
    """``offset`` as the end of messages served by the current view: tagged with its ledger, if it has one."""
    return Position(offset) if cursor is None else Position(offset, cursor.ledger_id, cursor.horizon)


class RefusedStream(DataSourceStreamReader):
    """The reader of a query whose options were refused: its first call raises the error.

    PySpark 4.3's stream runner calls ``stop()`` on the reader even when creating it failed, so an error raised
    by ``streamReader`` comes with a second traceback (an UnboundLocalError in PySpark) after ours; raised from the
    first call instead, it arrives alone."""

    def __init__(self, error: Exception) -> None:
        self.error = error.with_traceback(None)

    def initialOffset(self) -> dict[str, Any]:
        raise self.error from None

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise self.error from None

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self.error from None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        raise self.error from None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error from None

    def commit(self, end: dict[str, Any]) -> None:
        raise self.error from None

