"""One bounded read of one partition, in the raw or the compacted view, fixed when it opens.

Opening a read, in this order:

1. Compacted view: open the ledger the compaction cursor names (storage.compacted.CompactedLedgers.open_current)
   and keep it for the whole read. A compaction that publishes a newer ledger later renames this one ``.deleted``;
   the open memory map and index handle stay valid, so the read finishes on the ledger it opened and then reads
   the raw log above *its* horizon: never a mix of two ledgers (invariant 5).
2. Take the raw log start and end offsets. The end is taken after the ledger, so it is above the ledger's horizon;
   the read stops there (a bounded read: messages appended later are left for the next read).
3. Resolve the start position into ``ledger_start`` (serve ledger messages with offset >= it, up to the horizon)
   and ``raw_start`` (then every raw message from it to the end: all versions, tombstones included), by the rules
   in ``_resolve_compacted`` / ``_resolve_raw``.

Compacted view = the ledger from the start, then the raw tail above the horizon (invariant 4). A partition never
compacted is read raw. An "earliest" compacted read gets the whole ledger even when retention moved the raw log
start past the requested start (Pulsar bug #11287: never skip the snapshot).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from readers.batches import first_offset_at_or_after
from readers.positions import Earliest, Latest, Position, Resume, Timestamp
from storage.compacted import CompactionCursor
from storage.dropped_tombstones import meeting
from storage.errors import OffsetOutOfRangeError
from storage.ledger import LedgerReads
from storage.readable import ReadableStore
from storage.schema import with_partition_column

log = logging.getLogger(__name__)


@dataclass
class PartitionRead:
    """What one read of one partition serves: ledger messages in [ledger_start, horizon] (or below ledger_end)
    below end_offset, then raw messages in [raw_start, end_offset)."""

    store: ReadableStore
    topic: str
    partition: int
    cursor: CompactionCursor | None
    """The compaction cursor of the ledger this read serves; None when it serves no ledger."""
    ledger: LedgerReads | None
    ledger_start: int
    raw_start: int
    end_offset: int
    ledger_end: int | None = None
    """Where the ledger part stops when not above the horizon: a continuation from another ledger whose raw
    messages retention removed gets the ledger only below the raw log start, then every raw version from there."""

    @property
    def horizon(self) -> int:
        return self.cursor.horizon if self.cursor is not None else -1

    @property
    def source_ledger_id(self) -> int | None:
        """The ledger the delivered messages come from, recorded in positions (see positions.Resume); None when
        raw messages at or below the horizon are delivered too."""
        return self.cursor.ledger_id if self.cursor is not None and self.ledger_end is None else None

    @property
    def start_offset(self) -> int:
        """The first offset this read may deliver."""
        return self.ledger_start if self.ledger is not None else self.raw_start

    def batches(self) -> Iterator[pa.RecordBatch]:
        """MESSAGE_SCHEMA batches in offset order: the ledger part, then the raw part; zero-copy where stored."""
        if self.ledger is not None:
            ledger_end = self.horizon + 1 if self.ledger_end is None else self.ledger_end
            for batch in self.ledger.read_batches(self.ledger_start, min(ledger_end, self.end_offset)):
                yield with_partition_column(batch, self.partition)
        if self.raw_start < self.end_offset:
            # as stored, not joined: the Kafka endpoint's fetch keeps slices of these until its response is
            # written, and a slice of a joined batch would keep the whole copy (up to 1 MiB) alive for one message
            yield from self.store.read_batches(self.topic, self.partition, self.raw_start, self.end_offset)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None


def open_partition_read(store: ReadableStore, topic: str, partition: int, position: Position, *,
                        read_compacted: bool) -> PartitionRead:
    """Open one bounded read from ``position`` (see the module docstring for the steps)."""
    ledgers = store.compacted_ledgers(topic, partition)
    opened = ledgers.open_current(verify=store.verify_reads) if read_compacted else None
    try:
        log_start = store.start_offset(topic, partition)
        end = store.end_offset(topic, partition)
        read = PartitionRead(store, topic, partition, None, None, end, end, end)
        if opened is None:
            read.raw_start = _resolve_raw(read, position, log_start)
            return read
        cursor, ledger = opened
        read.cursor, read.ledger = cursor, ledger
        _resolve_compacted(read, position, log_start)
        if read.ledger_start > cursor.horizon:  # nothing to serve from the ledger: release it at once
            ledger.close()
            read.cursor = read.ledger = None
        return read
    except BaseException:
        if opened is not None:
            opened[1].close()
        raise


def _resolve_raw(read: PartitionRead, position: Position, log_start: int) -> int:
    """The raw view: Kafka's rules. Earliest is the log start; an explicit offset outside [log start, end] is an
    error; a timestamp past every message, and latest, are the end; a continuation is clamped into the log (what
    retention removed is gone)."""
    end = read.end_offset
    if isinstance(position, Earliest):
        return log_start
    if isinstance(position, Latest):
        return end
    if isinstance(position, Timestamp):
        found = read.store.offset_for_timestamp(read.topic, read.partition, position.timestamp_ms)
        return end if found is None else min(max(found, log_start), end)
    if isinstance(position, Resume):
        return min(max(position.offset, log_start), end)
    if not log_start <= position <= end:
        raise OffsetOutOfRangeError(read.topic, read.partition, position, log_start, end)
    return position


def _resolve_compacted(read: PartitionRead, position: Position, log_start: int) -> None:
    """The compacted view of a compacted partition (horizon h, ledger L):

    - earliest: all of L, then raw from h+1 (or the raw log start, if retention passed it).
    - latest: the end offset now; nothing from L.
    - offset o: o <= h serves L from o, then the raw tail; o > h reads raw from o, which must be in the log.
    - Timestamp(t): the first message of L with timestamp >= t (batches skipped by their header's max timestamp,
      then one vectorised compare); if L has none, the first raw message above h with timestamp >= t; if none,
      the end. The read then serves everything from that offset, as Kafka's offsetsForTimes does.
    - continuation at o with ledger id l: o > h reads raw from o. o <= h serves L from o when the messages below o
      came from L too (l is L) or when nothing was read (o = 0, unless o is a subscription's acknowledgement:
      a reopened consumer at 0 may have received messages it never acknowledged, whose later tombstones a
      newer ledger folded away); otherwise it reads raw from o, every version:
      serving the new ledger would skip the tombstones between the old and the new horizon (Pulsar PR #26190).
      When the raw log no longer holds o, L stands in for what retention removed: L below the raw log start,
      then every raw version from there (the tombstones retention left are still delivered). L cannot show the
      deletions among the removed offsets; where its cursor says some may lie, a warning is logged (a streaming
      query fails instead: streaming/source.py).
    """
    assert read.cursor is not None and read.ledger is not None
    horizon, end = read.cursor.horizon, read.end_offset
    tail_start = max(horizon + 1, log_start)
    read.ledger_start, read.raw_start = end, end
    if isinstance(position, Earliest):
        read.ledger_start, read.raw_start = 0, tail_start
    elif isinstance(position, Latest):
        pass
    elif isinstance(position, Timestamp):
        in_ledger = first_offset_at_or_after(_ledger_batches_reaching(read.ledger, position.timestamp_ms),
                                             position.timestamp_ms)
        if in_ledger is not None:
            read.ledger_start, read.raw_start = in_ledger, tail_start
        else:
            read.raw_start = _raw_tail_offset_for_timestamp(read, position.timestamp_ms, tail_start)
    elif isinstance(position, Resume):
        offset = position.offset
        if offset > horizon:
            read.raw_start = min(max(offset, log_start), end)
        elif position.ledger_id == read.cursor.ledger_id or (offset == 0 and not position.acknowledged):
            read.ledger_start, read.raw_start = offset, tail_start
        elif offset < log_start:
            read.ledger_start, read.ledger_end, read.raw_start = offset, min(log_start, horizon + 1), log_start
            _warn_of_deletions_not_shown(read, offset, log_start)
        else:
            read.raw_start = offset
    else:
        if position > end or (position > horizon and position < log_start):
            raise OffsetOutOfRangeError(read.topic, read.partition, position, log_start, end)
        if position <= horizon:
            read.ledger_start, read.raw_start = position, tail_start
        else:
            read.raw_start = position


def _warn_of_deletions_not_shown(read: PartitionRead, offset: int, log_start: int) -> None:
    assert read.cursor is not None
    dropped = meeting(read.cursor.dropped_tombstones, offset, log_start - 1)
    if dropped is not None:
        log.warning("%s-%d: a compacted read goes on from offset %d, below the raw log start %d; the compacted "
                    "ledger stands in for the removed offsets but cannot show deletions, and deletions may lie at "
                    "offsets %d to %d: a key this reader holds may have been deleted without it being told",
                    read.topic, read.partition, offset, log_start, *dropped)


def _ledger_batches_reaching(ledger: LedgerReads, timestamp_ms: int) -> Iterator[pa.RecordBatch]:
    """The ledger batches whose max timestamp reaches ``timestamp_ms``; the others are skipped by header."""
    for header in ledger.headers:
        if header.max_timestamp >= timestamp_ms:
            yield from ledger.read_batches(header.base_offset, header.last_offset + 1)


def _raw_tail_offset_for_timestamp(read: PartitionRead, timestamp_ms: int, tail_start: int) -> int:
    """The first raw offset >= ``tail_start`` with timestamp >= ``timestamp_ms``, else the end offset.

    offsetsForTimes on the whole log answers at once when its hit is in the tail; when the hit lies below the
    horizon (timestamps need not grow with offsets) the tail is scanned, one vectorised compare per batch.
    """
    found = read.store.offset_for_timestamp(read.topic, read.partition, timestamp_ms)
    if found is None:
        return read.end_offset
    if found >= tail_start:
        return found
    batches = read.store.read_batches(read.topic, read.partition, tail_start, read.end_offset)
    scanned = first_offset_at_or_after(batches, timestamp_ms)
    return read.end_offset if scanned is None else scanned
