"""The compacted streaming source (streaming/source.py, view=compacted) driven as Spark drives it, without Spark:
offsets round-trip through JSON as the checkpoint keeps them, micro-batches are planned and then read. Against a
dict model, with appends, compactions (also between a batch's planning and its read), retention up to the
horizon, rate limits and restarts from the checkpoint: a consumer that applies every row in order (a null value
deletes its key) holds exactly each key's latest live value once it has caught up; no tombstone is ever skipped.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from compactor import Compactor
from storage import Store
from streaming.source import SourceOptions, TopicStream
from streaming.source_offsets import DataLossError, DeletionLossError

PARTITIONS = 2
CONFIG = {"segment.bytes": "1024", "index.interval.bytes": "128"}
KEYS = [b"a", b"b", b"c", b"d"]
Pair = tuple[bytes | None, bytes | None]
messages = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(KEYS)),
                              st.one_of(st.none(), st.binary(min_size=1, max_size=8))), min_size=1, max_size=12)


def stream(folder: Path, **options: str) -> TopicStream:
    return TopicStream(SourceOptions.parse({"path": str(folder), "topic": "t", "view": "compacted", **options}))


class CompactedStreamModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="ledgerview-stream-"))
        self.store = Store.open(self.folder)
        self.store.create_topic("t", partitions=PARTITIONS, config=CONFIG)
        self.logs: list[list[Pair]] = [[] for _ in range(PARTITIONS)]
        self.horizons = [-1] * PARTITIONS
        self.source = stream(self.folder, startingOffsets="earliest")
        self.offsets: dict[str, Any] = json.loads(json.dumps(self.source.initialOffset()))
        self.seen: dict[tuple[int, bytes], bytes] = {}

    @rule(batch=messages, partition=st.integers(0, PARTITIONS - 1))
    def append(self, batch: list[Pair], partition: int) -> None:
        self.store.append("t", batch, partition=partition)
        self.logs[partition].extend(batch)

    @rule()
    def compact(self) -> None:
        for result in Compactor(self.store).compact("t"):
            self.horizons[result.partition] = result.horizon

    @rule(partition=st.integers(0, PARTITIONS - 1), data=st.data())
    def retention_up_to_the_horizon(self, partition: int, data: st.DataObject) -> None:
        """What the ledger covers may go: the compacted view loses nothing (retention never passes it)."""
        start = self.store.start_offset("t", partition)
        hold = self.store.retention_hold("t", partition)  # a retiring ledger's horizon holds too
        limit = min(self.horizons[partition] + 1, start if hold is None else hold)
        if limit > start:
            self.store.delete_records("t", partition, data.draw(st.integers(start, limit)))

    @rule(limit=st.one_of(st.none(), st.integers(1, 15)), compact_between=st.booleans())
    def micro_batch(self, limit: int | None, compact_between: bool) -> None:
        read_limit: ReadLimit = ReadAllAvailable() if limit is None else ReadMaxRows(limit)
        end = json.loads(json.dumps(self.source.latestOffset(self.offsets, read_limit)))
        try:
            planned = self.source.partitions(self.offsets, end)
        except DeletionLossError as error:
            self.start_again_on_a_new_checkpoint(error)
            return
        if compact_between:
            self.compact()
        for task in planned:
            for batch in self.source.read(task):
                for key, value in zip(batch["key"].to_pylist(), batch["value"].to_pylist(), strict=True):
                    if key is None:
                        continue
                    if value is None:
                        self.seen.pop((batch["partition"][0].as_py(), key), None)
                    else:
                        self.seen[(batch["partition"][0].as_py(), key)] = value
        self.offsets = end

    def start_again_on_a_new_checkpoint(self, error: DeletionLossError) -> None:
        """What the error tells a user to do, once it is shown to be true: the ledger stands in for raw offsets
        the query needs, and a tombstone lies in those the error names, above the horizon of the ledger the query
        read from, if any (ranges are exact on logs this small)."""
        position = self.offsets[str(error.partition)]
        cursor = self.store.compacted_ledgers("t", error.partition).read_cursor()
        assert cursor is not None and position["ledger"] != cursor.ledger_id  # the ledger stands in
        assert position["offset"] == error.wanted < error.log_start == self.store.start_offset("t", error.partition)
        first, last = error.dropped
        assert first > position["horizon"]  # not a deletion the query's ledger already showed
        assert any(key is not None and value is None for key, value in self.logs[error.partition][first:last + 1])
        self.source = stream(self.folder, startingOffsets="earliest")
        self.offsets = json.loads(json.dumps(self.source.initialOffset()))
        self.seen = {}

    @rule()
    def restart_from_the_checkpoint(self) -> None:
        self.source = stream(self.folder, startingOffsets="earliest")

    @invariant()
    def caught_up_the_consumer_holds_every_live_key(self) -> None:
        caught_up = all(position["offset"] == self.store.end_offset("t", int(p))
                        for p, position in self.offsets.items() if p != "created_ms")
        if not caught_up:
            return
        latest: dict[tuple[int, bytes], bytes | None] = {}
        for partition, log in enumerate(self.logs):
            for key, value in log:
                if key is not None:
                    latest[(partition, key)] = value
        assert self.seen == {key: value for key, value in latest.items() if value is not None}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TestCompactedStreamModel = CompactedStreamModel.TestCase
TestCompactedStreamModel.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)


def test_from_earliest_the_snapshot_comes_first_then_every_change(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.create_topic("t")
        store.append("t", [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1")])
        Compactor(store).compact("t")
        store.append("t", [(b"b", None), (b"a", b"3")])
    source = stream(tmp_path, startingOffsets="earliest")
    start = source.initialOffset()
    assert start["0"] == {"offset": 0, "ledger": 1, "horizon": 3}
    end = source.latestOffset(start, ReadAllAvailable())
    rows = [(row["offset"], row["key"], row["value"]) for task in source.partitions(start, end)
            for batch in source.read(task) for row in batch.to_pylist()]
    assert rows == [(1, b"b", b"1"), (2, b"a", b"2"), (3, b"c", b"1"), (4, b"b", None), (5, b"a", b"3")]


def test_raw_offsets_no_ledger_covers_are_data_loss(tmp_path: Path) -> None:
    """Once compacted, retention never passes the horizon (the retention hold); before the first compaction the
    compacted view is the raw log, and offsets deleted under the query are lost."""
    with Store.open(tmp_path) as store:
        store.create_topic("t", config=CONFIG)
        store.append("t", [(b"a", b"x" * 200) for _ in range(20)])
    source = stream(tmp_path, startingOffsets="earliest")
    start = source.initialOffset()
    with Store.open(tmp_path) as store:
        store.delete_records("t", 0, 10)
    end = source.latestOffset(start, ReadAllAvailable())
    with pytest.raises(DataLossError, match=r"Data loss in t-0: the query needs offsets from 0, .* below 10"):
        source.partitions(start, end)
    lenient = stream(tmp_path, startingOffsets="earliest", failOnDataLoss="false")
    rows = [row["offset"] for task in lenient.partitions(start, end) for batch in lenient.read(task)
            for row in batch.to_pylist()]
    assert rows == list(range(10, 20))


def test_a_consumer_that_read_raw_below_a_new_horizon_keeps_reading_raw_up_to_it(tmp_path: Path) -> None:
    """Read raw up to offset 2, then a compaction covers up to offset 5: the rest below the horizon comes from
    the raw log, every version, batch after batch (serving the new ledger from offset 2 on would skip b's
    tombstone at 4, which the consumer must see, having seen b's value at 1)."""
    with Store.open(tmp_path) as store:
        store.create_topic("t")
        store.append("t", [(b"a", b"1"), (b"b", b"1")])
    source = stream(tmp_path, startingOffsets="earliest")
    position = source.initialOffset()
    seen: list[tuple[int, bytes, bytes | None]] = []

    def batch(limit: int) -> None:
        nonlocal position
        end = json.loads(json.dumps(source.latestOffset(position, ReadMaxRows(limit))))
        seen.extend((row["offset"], row["key"], row["value"]) for task in source.partitions(position, end)
                    for part in source.read(task) for row in part.to_pylist())
        position = end

    batch(2)
    with Store.open(tmp_path) as store:
        store.append("t", [(b"a", b"2"), (b"c", b"1"), (b"b", None), (b"a", b"3")])
        Compactor(store).compact("t")
    batch(1)
    batch(10)
    assert seen == [(0, b"a", b"1"), (1, b"b", b"1"), (2, b"a", b"2"), (3, b"c", b"1"), (4, b"b", None),
                    (5, b"a", b"3")]


def test_a_tombstone_retention_left_is_delivered_to_a_query_behind_the_log_start() -> None:
    """Found by the model: a query at offset 2 (read raw), a tombstone at 3, a compaction that drops the key, then
    retention to offset 3. The ledger stands in only for the removed offset; the tombstone is still read."""
    model = CompactedStreamModel()

    class Three:
        @staticmethod
        def draw(strategy: object) -> int:
            return 3

    try:
        model.append([(None, None), (b"a", b"\x00"), (None, None)], 0)
        model.micro_batch(limit=2, compact_between=True)  # reads offsets 0-1 raw: a compaction came between
        model.append([(b"a", None)], 0)
        model.compact()
        model.retention_up_to_the_horizon(0, Three())  # type: ignore[arg-type]
        model.micro_batch(limit=None, compact_between=False)
        assert model.offsets["0"]["offset"] == 4 and model.seen == {}
    finally:
        model.teardown()


def test_a_tombstone_the_ledger_dropped_and_retention_removed_is_data_loss() -> None:
    """Found by the model: a query reads a's value raw (offset 14), a's tombstone comes at 26, a compaction up to 26
    drops the key (the ledger keeps no tombstones), and delete-records removes every raw offset up to 27. The query
    resumes at 15: the ledger stands in for the removed offsets, but it cannot show that a was deleted. The query
    is told (failOnDataLoss); without failOnDataLoss it goes on from the ledger, and a stays."""
    model = CompactedStreamModel()
    try:
        model.append([(None, None)] * 11 + [(b"c", b"C")], 1)
        model.append([(None, None), (None, None), (b"a", b"A")], 1)
        model.micro_batch(limit=None, compact_between=False)  # reads offsets 0-14 raw
        model.append([(None, None)] * 11 + [(b"a", None)], 1)  # a's tombstone at 26
        model.compact()
        model.store.delete_records("t", 1, 27)
        end = model.source.latestOffset(model.offsets, ReadAllAvailable())
        with pytest.raises(DeletionLossError, match=r"Data loss in t-1: the query goes on from offset 15 .* every raw "
                           r"offset below 27\..* \(tombstones\) it cannot show may lie in offset 26:"):
            model.source.partitions(model.offsets, end)
        lenient = stream(model.folder, startingOffsets="earliest", failOnDataLoss="false")
        rows = [(row["offset"], row["key"], row["value"]) for task in lenient.partitions(model.offsets, end)
                for batch in lenient.read(task) for row in batch.to_pylist()]
        assert rows == []  # the ledger holds no key in 15-26: a's deletion is not shown, and a stays
    finally:
        model.teardown()


def test_a_query_behind_the_log_start_with_no_tombstone_dropped_at_or_above_it_goes_on() -> None:
    """The ledger may stand in for deleted offsets when no deletion it left out lies at or above the query's
    position: the query goes on, with failOnDataLoss, and ends holding every live key."""
    model = CompactedStreamModel()
    try:
        model.append([(b"a", None), (b"b", b"B")], 0)  # a's tombstone at 0 is dropped, below the query
        model.micro_batch(limit=1, compact_between=False)  # reads offset 0 raw
        model.append([(b"c", b"C"), (b"b", b"B2")], 0)
        model.compact()
        model.store.delete_records("t", 0, 4)
        model.micro_batch(limit=None, compact_between=False)
        model.caught_up_the_consumer_holds_every_live_key()
        assert model.seen == {(0, b"b"): b"B2", (0, b"c"): b"C"}
    finally:
        model.teardown()


def read_all(source: TopicStream, start: dict[str, Any]) -> tuple[list[tuple[int, bytes, bytes | None]], Any]:
    end = json.loads(json.dumps(source.latestOffset(start, ReadAllAvailable())))
    rows = [(row["offset"], row["key"], row["value"]) for task in source.partitions(start, end)
            for batch in source.read(task) for row in batch.to_pylist()]
    return rows, end


@pytest.mark.parametrize("deleted_after", [False, True])
def test_a_query_that_read_an_older_ledger_is_told_only_of_deletions_above_its_horizon(
        tmp_path: Path, deleted_after: bool) -> None:
    """A query read ledger 1 (horizon 3) up to offset 3: a@0 and c@2, not b, whose deletion at 3 ledger 1 had
    already folded in. Ledger 2 is published and retention removes the raw offsets below 5, so ledger 2 stands in
    for them. b's deletion is nothing the query missed, so it goes on; a deletion of c at 4, above ledger 1's
    horizon, is one it did miss, so it is told."""
    with Store.open(tmp_path) as store:
        store.create_topic("t", config={**CONFIG, "file.delete.delay.ms": "0"})  # no hold for ledger 1's readers
        store.append("t", [(b"a", b"A"), (b"b", b"B"), (b"c", b"C"), (b"b", None)])
        Compactor(store).compact("t")
    source = stream(tmp_path, startingOffsets="earliest")
    start = source.initialOffset()
    end = json.loads(json.dumps(source.latestOffset(start, ReadMaxRows(3))))
    assert end["0"] == {"offset": 3, "ledger": 1, "horizon": 3}
    assert [row["key"] for task in source.partitions(start, end) for batch in source.read(task)
            for row in batch.to_pylist()] == [b"a", b"c"]
    with Store.open(tmp_path) as store:
        store.append("t", [(b"c", None) if deleted_after else (b"d", b"D"), (b"e", b"E")])
        Compactor(store).compact("t")
        store.enforce_retention("t")  # ledger 1 retired: its hold on the raw log goes
        store.delete_records("t", 0, 5)
    if deleted_after:
        with pytest.raises(DeletionLossError, match=r"may lie in offset 4:"):
            read_all(source, end)
    else:
        rows, _ = read_all(source, end)
        assert rows == [(4, b"d", b"D"), (5, b"e", b"E")]


def test_a_first_compaction_after_retention_covers_the_offsets_it_never_read(tmp_path: Path) -> None:
    """Found in review: the query read a at offset 0 raw, a's tombstone came at 2, delete-records removed the raw
    offsets below 5 before any compaction, and then the first compaction read from 5. It never saw the tombstone,
    so the cursor counts offsets 0 to 4 as possibly holding one, and the resumed query is told."""
    with Store.open(tmp_path) as store:
        store.create_topic("t", config=CONFIG)
        store.append("t", [(b"a", b"A"), (b"x", b"X")])
    source = stream(tmp_path, startingOffsets="earliest")
    start = source.initialOffset()
    end = json.loads(json.dumps(source.latestOffset(start, ReadMaxRows(1))))
    list(source.read(source.partitions(start, end)[0]))
    with Store.open(tmp_path) as store:
        store.append("t", [(b"a", None), (b"x", b"X2")] + [(b"k%02d" % n, b"v" * 30) for n in range(60)])
        store.delete_records("t", 0, 5)
        Compactor(store).compact("t")
        cursor = store.compacted_ledgers("t", 0).read_cursor()
        assert cursor is not None and cursor.dropped_tombstones == ((0, 4),)
    with pytest.raises(DeletionLossError, match=r"may lie in offsets 1 to 4:"):
        read_all(source, end)
