"""Model-based test of both views under the operations that remove data: retention (retention.bytes,
retention.ms on a manual clock), delete-records, the in-place cleaner on compact,delete topics, with two-phase
compaction (layered views or not), rolls, reopens, durable compacted or raw consumers that acknowledge and resume,
and reads left open while a new view is published, against plain lists and dicts.

The rules held (DESIGN.md invariants 2 to 5, docs/FORMAT.md "Retention" and "Compacted ledgers"):

- the compacted view is, for each key, its latest message at or below the horizon unless a tombstone, then every
  raw message above the horizon; a key stays in it after retention removed its raw messages;
- while two-phase compaction is on (a threshold set, or a cursor), the log start offset never passes the hold (the
  horizon + 1, lower while a replaced view is still there), and neither the cleaner nor retention touches raw data
  above it;
- the raw view serves the log from the log start offset: every message on a delete topic, on a compacted one a
  subsequence holding every key's latest live message and everything the hold protects;
- delete-records moves the log start offset exactly where asked, within the log and the hold, on delete topics;
- a read keeps the view it opened (invariant 5); a consumer that is never overtaken by retention ends with the
  latest live value of every key; TableView and the snapshot serve the latest live value of every key the views
  hold.

The default run is small, for the fast tier. To hunt: RETENTION_MODEL_EXAMPLES=1500 RETENTION_MODEL_STEPS=60, with
``--hypothesis-show-statistics`` to see how often each removal happened.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pyarrow as pa
import pytest
from hypothesis import Phase, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from compactor import Compactor
from readers import Consumer, Reader, TableView, Timestamp
from readers.snapshot import snapshot_batches
from storage import MESSAGE_SCHEMA, Store
from storage.errors import KeylessMessageError, OffsetOutOfRangeError, SegmentDeletedError
from storage.retention import (
    DeleteRecordsOutOfRangeError,
    RecordDeletionNotAllowedError,
    RetentionHoldError,
    RetentionReason,
)
from storage.segment import NO_TIMESTAMP
from tests.conftest import ManualClock

KEYS = [b"a", b"b", b"c", b"d", b"e"]
Row = tuple[int, bytes | None, bytes | None]
LONG_DELAY_MS = 3_600_000
"""file.delete.delay.ms long enough that nothing replaced is removed during an example (ledgers: wall clock)."""

messages = st.lists(
    st.tuples(st.one_of(st.none(), st.sampled_from(KEYS)),
              st.one_of(st.none(), st.binary(min_size=1, max_size=40))),
    min_size=1, max_size=15,
)


def rows_of(batches: list[pa.RecordBatch]) -> list[Row]:
    table = pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


class RetentionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="ledgerview-retention-"))
        self.clock = ManualClock()
        self.store: Store | None = None
        self.log: list[tuple[bytes | None, bytes | None]] = []
        self.timestamps: list[int] = []
        self.lso = 0
        self.view: dict[bytes, tuple[int, bytes | None]] = {}
        """The compacted view's ledger part: each key's latest message at or below the horizon, tombstones too."""
        self.horizon = -1
        self.has_cursor = False
        self.retiring: list[int] = []
        """Horizons of replaced views that may still be there (so may still hold raw data)."""
        self.consumer: Consumer | None = None
        self.consumer_seen: dict[bytes, bytes | None] = {}
        self.consumer_last = -1
        self.consumer_acked = 0
        self.consumer_received: list[int] = []
        self.consumer_lagged = False
        self.long_table: TableView | None = None
        self.open_read: tuple[Reader, list[pa.RecordBatch], object, list[Row]] | None = None

    # ------------------------------------------------------------------------------------------------ setup
    @initialize(policy=st.sampled_from(["delete", "compact,delete", "compact"]),
                layers=st.sampled_from([1, 4]), threshold=st.sampled_from([0, 1 << 30]),
                delay=st.sampled_from([0, LONG_DELAY_MS]), retention_ms=st.sampled_from([-1, 5_000]),
                retention_bytes=st.sampled_from([-1, 800]), delete_retention=st.sampled_from([0, 10**12]),
                compacted_consumer=st.booleans())
    def setup(self, policy: str, layers: int, threshold: int, delay: int, retention_ms: int, retention_bytes: int,
              delete_retention: int, compacted_consumer: bool) -> None:
        self.policy = set(policy.split(","))
        self.threshold, self.delay, self.delete_retention = threshold, delay, delete_retention
        self.retention_ms, self.retention_bytes = retention_ms, retention_bytes
        self.compacted_consumer = compacted_consumer
        self.store = Store.open(self.folder, clock=self.clock)
        self.store.create_topic("t", partitions=1, config={
            "segment.bytes": "512", "index.interval.bytes": "128", "compaction.memory.bytes": "4096",
            "cleanup.policy": policy, "compaction.max.layers": str(layers),
            "compaction.threshold.bytes": str(threshold), "file.delete.delay.ms": str(delay),
            "retention.ms": str(retention_ms), "retention.bytes": str(retention_bytes),
            "delete.retention.ms": str(delete_retention), "min.cleanable.dirty.ratio": "0.01",
        })

    # ------------------------------------------------------------------------------------------------ model
    @property
    def held(self) -> bool:
        return self.has_cursor or self.threshold > 0

    def hold(self) -> int | None:
        """Store.retention_hold: None without two-phase compaction; 0 before the first compaction; then above the
        lowest horizon of the current view and the replaced ones still there."""
        if not self.held:
            return None
        if not self.has_cursor:
            return 0
        return min([self.horizon, *self.retiring]) + 1

    def tail_start(self) -> int:
        return max(self.horizon + 1, self.lso)

    def ledger_rows(self, start: int = 0) -> list[Row]:
        return sorted((offset, key, value) for key, (offset, value) in self.view.items()
                      if value is not None and offset >= start)

    def compacted_from(self, start: int) -> list[Row]:
        """Invariant 4 from ``start`` (at or below the horizon, or the earliest)."""
        tail = [(offset, *self.log[offset]) for offset in range(self.tail_start(), len(self.log))]
        return [*self.ledger_rows(start), *tail]

    def table(self) -> dict[bytes, bytes]:
        """The latest live value of every key the views still hold."""
        latest = {key: value for key, (_, value) in self.view.items()}
        for offset in range(self.tail_start(), len(self.log)):
            key, value = self.log[offset]
            if key is not None:
                latest[key] = value
        return {key: value for key, value in latest.items() if value is not None}

    def check_raw(self, rows: list[Row], start: int) -> None:
        """The raw view from ``start``: exactly the log on a delete topic; on a compacted one a subsequence that
        holds each key's latest live message and everything above the cleaner's bound (the hold)."""
        end = len(self.log)
        offsets = [offset for offset, _, _ in rows]
        assert offsets == sorted(set(offsets)), offsets
        assert all(start <= offset < end and (key, value) == self.log[offset] for offset, key, value in rows), rows
        if "compact" not in self.policy:
            assert offsets == list(range(start, end))
            return
        present = set(offsets)
        hold = self.hold()
        if hold is not None:
            protected = range(max(start, hold), end)
            assert present.issuperset(protected), (sorted(set(protected) - present), hold)
        latest = {key: offset for offset, (key, _) in enumerate(self.log) if key is not None}
        live = {offset for offset in latest.values() if self.log[offset][1] is not None and offset >= start}
        assert present.issuperset(live), sorted(live - present)
        last_seen = {key: offset for offset, key, _ in rows if key is not None}
        for key, offset in last_seen.items():  # a removed tombstone must not bring an older value back
            assert offset == latest[key], (key, offset, latest[key])

    def removing(self) -> None:
        """Retention, delete-records or cleaning runs: with no file.delete.delay.ms, a read left open may lose the
        raw data it has not opened yet once a compaction removed the view it reads."""
        if self.open_read is not None and self.delay == 0:
            self.open_read_unprotected = True

    def moved_log_start(self, new: int) -> None:
        assert new >= self.lso, (new, self.lso)
        hold = self.hold()
        if hold is not None:
            assert new <= hold, (new, hold)
        if new > self.lso and self.consumer is not None and min(self.consumer_acked, self.consumer_last + 1) < new:
            self.consumer_lagged = True
        self.lso = new

    # ------------------------------------------------------------------------------------------------ rules
    @rule(batch=messages)
    def append(self, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        assert self.store is not None
        if "delete" not in self.policy and any(key is None for key, _ in batch):
            with pytest.raises(KeylessMessageError):
                self.store.append("t", batch, partition=0)
            return
        self.store.append("t", batch, partition=0)
        self.log.extend(batch)
        self.timestamps.extend([self.clock.now_ms] * len(batch))

    @rule()
    def roll(self) -> None:
        assert self.store is not None
        self.store.roll("t", 0)

    @rule(milliseconds=st.sampled_from([1, 1_000, 6_000]))
    def advance_clock(self, milliseconds: int) -> None:
        self.clock.advance(milliseconds)

    @rule()
    def compact(self) -> None:
        assert self.store is not None
        [result] = Compactor(self.store).compact("t")
        if self.delay == 0:
            self.retiring = []  # the run removed the replaced views first
        if result.skipped:
            assert result.horizon == self.horizon
            return
        assert result.horizon == len(self.log) - 1
        if self.has_cursor:
            self.retiring.append(self.horizon)
        for offset in range(self.tail_start(), len(self.log)):
            key, value = self.log[offset]
            if key is not None:
                self.view[key] = (offset, value)
        self.horizon, self.has_cursor = result.horizon, True

    @rule(milliseconds=st.sampled_from([0, 6_000]))
    def enforce_retention(self, milliseconds: int) -> None:
        assert self.store is not None
        self.clock.advance(milliseconds)
        if self.delay == 0:
            self.retiring = []
        self.removing()
        size_before = self.store.size_bytes("t", 0)
        deleted = self.store.enforce_retention("t")
        event(f"retention deleted {min(len(deleted), 2)} segments, held={self.held}")
        self.moved_log_start(self.store.start_offset("t", 0))
        for segment in deleted:
            if segment.reason is RetentionReason.RETENTION_MS and "compact" not in self.policy:
                newest = max(self.timestamps[segment.base_offset:segment.next_offset], default=None)
                assert newest is None or self.clock.now_ms - newest > self.retention_ms, segment
        self.check_retention_done()
        by_size = sum(segment.size_bytes for segment in deleted if segment.reason is RetentionReason.RETENTION_BYTES)
        assert by_size == 0 or size_before - by_size >= self.retention_bytes

    def check_retention_done(self) -> None:
        """What a retention run leaves: its first segment is one no predicate may take (storage/retention.py)."""
        assert self.store is not None
        if "delete" not in self.policy:
            return
        segments = self.store.segments("t", 0)
        first = segments[0]
        upper = segments[1].base_offset if len(segments) > 1 else len(self.log)
        hold = self.hold()
        if (hold is not None and upper > hold) or (len(segments) == 1 and first.size_bytes == 0):
            return
        if self.retention_bytes >= 0:
            total = sum(segment.size_bytes for segment in segments)
            assert total - first.size_bytes < self.retention_bytes, (total, first)
        if self.retention_ms >= 0 and "compact" not in self.policy:
            newest = max(self.timestamps[first.base_offset:upper], default=None)
            assert newest is not None and self.clock.now_ms - newest <= self.retention_ms, (first, newest)

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        assert self.store is not None
        before = data.draw(st.integers(self.lso - 1, len(self.log) + 1), label="before")
        hold = self.hold()
        self.removing()
        try:
            result = self.store.delete_records("t", 0, before)
        except RecordDeletionNotAllowedError:
            assert "delete" not in self.policy
            return
        except DeleteRecordsOutOfRangeError:
            assert "delete" in self.policy and not self.lso <= before <= len(self.log)
            return
        except RetentionHoldError:
            assert "delete" in self.policy and self.lso <= before <= len(self.log)
            assert hold is not None and before > hold, (before, hold)
            return
        assert "delete" in self.policy and self.lso <= before <= len(self.log)
        assert hold is None or before <= hold, (before, hold)
        assert result.log_start_offset == max(before, self.lso)
        event(f"delete-records succeeded, cursor={self.has_cursor}")
        self.moved_log_start(self.store.start_offset("t", 0))
        assert self.lso == max(before, self.lso)

    @rule()
    def clean(self) -> None:
        assert self.store is not None
        self.removing()
        stats = self.store.clean("t")
        event(f"cleaned, removed something={any(s.messages_read > s.messages_written for s in stats)}")
        if self.consumer is not None and self.delete_retention == 0:
            self.consumer_lagged = True  # tombstones may go before the consumer reads them (Kafka's rule too)

    @rule()
    def reopen(self) -> None:
        assert self.store is not None
        self.finish_open_read_if_any()
        consumer_open = self.consumer is not None
        self.close_consumer()
        if self.long_table is not None:
            self.long_table.close()
            self.long_table = None
        self.store.close()
        self.store = Store.open(self.folder, clock=self.clock)
        assert self.store.start_offset("t", 0) == self.lso
        assert self.store.end_offset("t", 0) == len(self.log)
        if consumer_open:
            self.open_consumer()

    @rule(data=st.data(), compacted=st.booleans())
    def read_from_anywhere(self, data: st.DataObject, compacted: bool) -> None:
        assert self.store is not None
        start = data.draw(st.integers(max(0, self.lso - 2), len(self.log) + 1), label="start")
        expect_error = start > len(self.log) or (start < self.lso and not (compacted and self.has_cursor
                                                                          and start <= self.horizon))
        try:
            with Reader(self.store, "t", read_compacted=compacted, start={0: start}) as reader:
                rows = rows_of(list(reader.batches()))
        except OffsetOutOfRangeError:
            assert expect_error, (start, self.lso, self.horizon)
            return
        assert not expect_error, (start, self.lso, self.horizon, rows)
        if compacted and self.has_cursor and start <= self.horizon:
            assert rows == self.compacted_from(start)
            event(f"compacted read below horizon with lso={min(self.lso, 1)}")
        else:
            self.check_raw(rows, start)

    @precondition(lambda self: self.log)
    @rule(data=st.data(), compacted=st.booleans())
    def read_from_a_timestamp(self, data: st.DataObject, compacted: bool) -> None:
        """Kafka's offsetsForTimes as a start (timestamps here never decrease with offsets: the clock only moves on).
        Raw: from the first message at or after it; compacted: from the first ledger message at or after it, else
        the first raw one above the horizon."""
        assert self.store is not None
        when = data.draw(st.sampled_from(sorted({stamp + delta for stamp in self.timestamps for delta in (-1, 0, 1)})),
                         label="timestamp")
        with Reader(self.store, "t", read_compacted=compacted, start={0: Timestamp(when)}) as reader:
            rows = rows_of(list(reader.batches()))
        if compacted and self.has_cursor:
            in_ledger = [row for row in self.ledger_rows() if self.timestamps[row[0]] >= when]
            if in_ledger:
                assert rows == self.compacted_from(in_ledger[0][0])
                return
            tail = [offset for offset in range(self.tail_start(), len(self.log)) if self.timestamps[offset] >= when]
            assert rows == [(offset, *self.log[offset]) for offset in tail]
            return
        first = next((offset for offset in range(self.lso, len(self.log)) if self.timestamps[offset] >= when),
                     len(self.log))
        self.check_raw(rows, first)

    @rule()
    def read_compacted_earliest(self) -> None:
        assert self.store is not None
        with Reader(self.store, "t", read_compacted=True) as reader:
            rows = rows_of(list(reader.batches()))
        if self.has_cursor:
            assert rows == self.compacted_from(0)
        else:
            self.check_raw(rows, self.lso)

    @rule()
    def table_view(self) -> None:
        assert self.store is not None
        expected = self.table()
        view = TableView(self.store, "t")
        try:
            for key in KEYS:
                assert view.get(key) == expected.get(key), key
        finally:
            view.close()

    @precondition(lambda self: self.long_table is None)
    @rule()
    def open_table_view(self) -> None:
        assert self.store is not None
        self.long_table = TableView(self.store, "t")

    @precondition(lambda self: self.long_table is not None and self.held)
    @rule()
    def long_lived_table_view(self) -> None:
        """A TableView kept open across compactions, retention and cleaning follows them (it refreshes)."""
        assert self.long_table is not None
        expected = self.table()
        assert {key: self.long_table.get(key) for key in KEYS} == {key: expected.get(key) for key in KEYS}
        assert sorted(self.long_table.items()) == sorted(expected.items())
        assert sorted(self.long_table.keys()) == sorted(expected)
        assert len(self.long_table) == len(expected)

    @rule(data=st.data())
    def snapshot(self, data: st.DataObject) -> None:
        """The table shape (Spark SQL's snapshot): one row per live key, its latest message the views hold."""
        assert self.store is not None
        keys = data.draw(st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS))), label="keys")
        rows = rows_of(list(snapshot_batches(self.store, "t", 0, len(self.log), keys=keys)))
        latest = {key: (offset, value) for key, (offset, value) in self.view.items()}
        for offset in range(self.tail_start(), len(self.log)):
            key, value = self.log[offset]
            if key is not None:
                latest[key] = (offset, value)
        expected = sorted((offset, key, value) for key, (offset, value) in latest.items()
                          if value is not None and (keys is None or key in keys))
        assert sorted(rows) == expected

    @rule()
    def segment_timestamps(self) -> None:
        """A segment's largest timestamp (what retention.ms reads) is one of its messages': the cleaner's delete
        horizon stamp must not pass for one."""
        assert self.store is not None
        segments = self.store.segments("t", 0)
        for segment, following in zip(segments, [*segments[1:], None], strict=True):
            upper = following.base_offset if following is not None else len(self.log)
            if segment.max_timestamp != NO_TIMESTAMP:
                assert segment.max_timestamp <= max(self.timestamps[segment.base_offset:upper]), segment

    # ------------------------------------------------------------------------ a read left open (invariant 5)
    @precondition(lambda self: self.open_read is None and self.held)
    @rule()
    def start_read(self) -> None:
        assert self.store is not None
        reader = Reader(self.store, "t", read_compacted=True)
        iterator = iter(reader.batches())
        first = list(next(iterator, None) for _ in range(1))
        expected = self.compacted_from(0) if self.has_cursor else None
        if expected is None:
            expected = [(offset, *self.log[offset]) for offset in range(self.lso, len(self.log))]
            if "compact" in self.policy:
                expected = []  # a raw read of a cleaned log: checked as a subsequence when it finishes
        self.open_read = (reader, [batch for batch in first if batch is not None], iterator, expected)
        self.open_read_raw = not self.has_cursor
        self.open_read_unprotected = False

    @precondition(lambda self: self.open_read is not None)
    @rule()
    def finish_read(self) -> None:
        self.finish_open_read_if_any()

    def finish_open_read_if_any(self) -> None:
        if self.open_read is None:
            return
        reader, batches, iterator, expected = self.open_read
        self.open_read = None
        try:
            batches.extend(iterator)  # type: ignore[call-overload]
        except (OffsetOutOfRangeError, SegmentDeletedError):
            # file.delete.delay.ms=0: what the read had not opened yet may be gone, which it says (as Kafka does)
            assert self.open_read_unprotected
            return
        finally:
            reader.close()
        rows = rows_of(batches)
        if self.open_read_unprotected:
            return
        if self.open_read_raw and "compact" in self.policy:
            offsets = [offset for offset, _, _ in rows]
            assert offsets == sorted(set(offsets))
            assert all((key, value) == self.log[offset] for offset, key, value in rows)
        else:
            assert rows == expected
            event("open read checked")

    # ------------------------------------------------------------------------------------ a durable consumer
    def open_consumer(self) -> None:
        assert self.store is not None
        self.consumer = Consumer(self.store, "t", "sub", read_compacted=self.compacted_consumer)
        self.consumer_acked = self.consumer.acknowledged[0]
        self.consumer_last = self.consumer_acked - 1
        if not self.compacted_consumer and self.consumer_acked < self.lso:
            self.consumer_lagged = True  # the raw view no longer holds what only the compacted one keeps
        if not self.compacted_consumer and self.has_cursor and self.lso > 0:
            self.consumer_lagged = True

    def close_consumer(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None

    @precondition(lambda self: self.consumer is None)
    @rule()
    def consumer_opens(self) -> None:
        self.open_consumer()

    @precondition(lambda self: self.consumer is not None)
    @rule(max_messages=st.one_of(st.none(), st.integers(1, 10)))
    def consumer_receives(self, max_messages: int | None) -> None:
        assert self.consumer is not None
        rows = rows_of(list(self.consumer.receive_batches(max_messages)))
        for offset, key, value in rows:
            assert offset > self.consumer_last, (offset, self.consumer_last, rows)
            assert (key, value) == self.log[offset]
            self.consumer_last = offset
            self.consumer_received.append(offset)
            if key is not None:
                self.consumer_seen[key] = value
        if max_messages is None and not self.consumer_lagged:
            seen = {key: value for key, value in self.consumer_seen.items() if value is not None}
            assert seen == self.table()
            event("consumer checked")

    @precondition(lambda self: self.consumer is not None and self.consumer_received)
    @rule(data=st.data())
    def consumer_acknowledges(self, data: st.DataObject) -> None:
        assert self.consumer is not None
        offset = data.draw(st.sampled_from(self.consumer_received), label="ack")
        self.consumer.acknowledge_cumulative(0, offset)
        self.consumer_acked = max(self.consumer_acked, offset + 1)
        assert self.consumer.acknowledged[0] == self.consumer_acked

    @precondition(lambda self: self.consumer is not None)
    @rule()
    def consumer_reopens(self) -> None:
        self.close_consumer()
        self.open_consumer()

    def teardown(self) -> None:
        try:
            if self.open_read is not None:
                self.open_read[0].close()
            self.close_consumer()
            if self.long_table is not None:
                self.long_table.close()
            if self.store is not None:
                self.store.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


TestRetentionModel = RetentionModel.TestCase
TestRetentionModel.settings = settings(
    max_examples=int(os.environ.get("RETENTION_MODEL_EXAMPLES", "25")),
    stateful_step_count=int(os.environ.get("RETENTION_MODEL_STEPS", "30")), deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
