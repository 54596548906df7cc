"""Reader over the raw and the compacted view, held against a plain-dict model of what was appended.

Invariants checked: 4 (compacted view = latest live message per key up to the horizon, in offset order, then
every raw message above it; keys stay after retention removed their raw segments), 5 (a reader that opened a
ledger finishes on it while a newer one is published), 8 (a reader in another process sees the same).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from compactor import Compactor
from readers import EARLIEST, LATEST, InvalidPositionError, Reader, ReaderClosedError, Timestamp, read_table
from storage import MESSAGE_SCHEMA, Message, Store
from storage.compacted import CompactedLedgers
from storage.errors import OffsetOutOfRangeError, UnknownPartitionError
from storage.files import DELETED_SUFFIX, ledger_file
from tests.conftest import TINY

Row = tuple[bytes | None, bytes | None]


class Model:
    """What was appended, per partition in offset order, and the horizons of the compactions: the reference both
    views are held against."""

    def __init__(self, store: Store, topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        self.store, self.topic = store, topic
        store.create_topic(topic, partitions=partitions, config=config if config is not None else TINY)
        self.messages: dict[int, list[Message]] = {p: [] for p in range(partitions)}
        self.horizons: dict[int, int] = dict.fromkeys(range(partitions), -1)
        self.next_timestamp_ms = 1_000

    def append(self, rows: Sequence[Row], partition: int | None = None) -> list[Message]:
        timestamps = list(range(self.next_timestamp_ms, self.next_timestamp_ms + 10 * len(rows), 10))
        self.next_timestamp_ms += 10 * len(rows)
        table = pa.table({"key": pa.array([k for k, _ in rows], pa.binary()),
                          "value": pa.array([v for _, v in rows], pa.binary()),
                          "timestamp": pa.array(timestamps, pa.int64())})
        result = self.store.append(self.topic, table, partition)
        appended = []
        for (p, offset), (key, value), timestamp in zip(result, rows, timestamps, strict=True):
            message = Message(p, offset, timestamp, key, value, [])
            self.messages[p].append(message)
            appended.append(message)
        for messages in self.messages.values():
            messages.sort(key=lambda m: m.offset)
        return appended

    def compact(self) -> None:
        for result in Compactor(self.store).compact(self.topic):
            self.horizons[result.partition] = result.horizon

    def raw(self, partition: int, start: int = 0) -> list[Message]:
        return [m for m in self.messages[partition] if m.offset >= start]

    def snapshot(self, partition: int, horizon: int | None = None) -> list[Message]:
        """Latest live keyed message per key at or below the horizon, in offset order."""
        horizon = self.horizons[partition] if horizon is None else horizon
        latest: dict[bytes, Message] = {}
        for message in self.messages[partition]:
            if message.offset <= horizon and message.key is not None:
                latest[message.key] = message
        return sorted((m for m in latest.values() if m.value is not None), key=lambda m: m.offset)

    def compacted(self, partition: int, start: int = 0, horizon: int | None = None,
                  end: int | None = None) -> list[Message]:
        horizon = self.horizons[partition] if horizon is None else horizon
        if horizon < 0:
            return [m for m in self.raw(partition, start) if end is None or m.offset < end]
        tail = [m for m in self.messages[partition] if m.offset > horizon and m.offset >= start]
        return ([m for m in self.snapshot(partition, horizon) if m.offset >= start]
                + [m for m in tail if end is None or m.offset < end])

    def latest(self) -> dict[bytes, bytes]:
        """The latest live value per key over everything appended (keys live in one partition here)."""
        state: dict[bytes, bytes | None] = {}
        for messages in self.messages.values():
            for message in messages:
                if message.key is not None:
                    state[message.key] = message.value
        return {key: value for key, value in state.items() if value is not None}


def random_rows(rng: random.Random, count: int, keys: int = 12) -> list[Row]:
    rows: list[Row] = []
    for _ in range(count):
        key = None if rng.random() < 0.05 else f"k{rng.randrange(keys)}".encode()
        value = None if key is not None and rng.random() < 0.2 else f"v{rng.randrange(10**6)}".encode()
        rows.append((key, value))
    return rows


def by_partition(messages: list[Message]) -> dict[int, list[Message]]:
    grouped: dict[int, list[Message]] = {}
    for message in messages:
        grouped.setdefault(message.partition, []).append(message)
    return grouped


def read_all(store: Store | Path, topic: str, **options: object) -> list[Message]:
    with Reader(store, topic, **options) as reader:  # type: ignore[arg-type]
        return list(reader)


def retire_raw_below(store: Store, topic: str, partition: int, offset: int) -> int:
    """What retention does: delete the sealed segments wholly below ``offset`` and move the log start; returns
    the new log start (the base of the segment holding ``offset``)."""
    log = store.partition_log(topic, partition)
    log.refresh()
    new_start = max(s.base_offset for s in log.segments if s.base_offset <= offset)
    for segment in log.segments:
        if segment.base_offset < new_start:
            for path in (segment.log_path, segment.offset_index.path, segment.time_index.path):
                path.unlink()
    log.checkpoints.save_log_start_offset(new_start)
    log.refresh()
    return new_start


# --------------------------------------------------------------------------------------------- compacted view
@pytest.mark.parametrize("seed", range(4))
def test_compacted_read_equals_the_model_for_several_partitions(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    model = Model(store, "prices", partitions=3)
    for _ in range(6):
        model.append(random_rows(rng, rng.randrange(1, 15)))
    model.compact()
    for _ in range(4):
        model.append(random_rows(rng, rng.randrange(1, 10)))
    for step in range(2):
        got = by_partition(read_all(store, "prices", read_compacted=True))
        for partition in range(3):
            assert got.get(partition, []) == model.compacted(partition), (step, partition)
        raw = by_partition(read_all(store, "prices"))
        assert {p: raw.get(p, []) for p in range(3)} == {p: model.raw(p) for p in range(3)}
        model.compact()
        model.append(random_rows(rng, 8))


def test_batches_are_arrow_with_the_message_schema_and_match_the_messages(store: Store) -> None:
    model = Model(store, "prices", partitions=2)
    model.append(random_rows(random.Random(1), 40))
    model.compact()
    model.append(random_rows(random.Random(2), 10))
    batches = list(Reader(store, "prices", read_compacted=True).batches())
    assert all(isinstance(batch, pa.RecordBatch) and batch.schema == MESSAGE_SCHEMA for batch in batches)
    table = pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)
    expected = model.compacted(0) + model.compacted(1)
    assert table.column("offset").to_pylist() == [m.offset for m in expected]
    assert table.column("partition").to_pylist() == [m.partition for m in expected]
    assert table.column("value").to_pylist() == [m.value for m in expected]
    assert read_table(store, "prices", read_compacted=True).equals(table)


def test_a_partition_never_compacted_is_read_raw_in_the_compacted_view(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"a", b"2"), (b"a", None)])
    assert read_all(store, "prices", read_compacted=True) == model.raw(0)


def test_the_tail_above_the_horizon_has_every_version_and_tombstone(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"b", b"1"), (b"a", b"2")])
    model.compact()
    tail = model.append([(b"a", b"3"), (b"a", None), (b"b", b"2"), (b"b", b"3")])
    got = read_all(store, "prices", read_compacted=True)
    assert [(m.key, m.value) for m in got] == [(b"b", b"1"), (b"a", b"2")] + [(m.key, m.value) for m in tail]


def test_earliest_compacted_reader_gets_the_ledger_after_retention_removed_raw_segments(store: Store) -> None:
    """Pulsar bug #11287: the raw log start is past the horizon's keys, yet 'earliest' still gets the snapshot."""
    model = Model(store, "prices")
    for i in range(30):
        model.append([(f"k{i % 5}".encode(), f"v{i}".encode())])
    model.compact()
    for i in range(30, 40):
        model.append([(f"k{i % 5}".encode(), f"v{i}".encode())])
    log_start = retire_raw_below(store, "prices", 0, model.horizons[0] + 1)  # the compactor pins the tail
    assert log_start > model.snapshot(0)[0].offset  # raw messages of the snapshot are gone
    expected = model.snapshot(0) + model.raw(0, model.horizons[0] + 1)
    assert read_all(store, "prices", read_compacted=True) == expected
    assert read_all(store, "prices", read_compacted=True, start=EARLIEST) == expected
    assert read_all(store, "prices", read_compacted=True, start=0) == expected
    assert read_all(store, "prices") == model.raw(0, log_start)  # raw earliest: clamped to the log start
    with pytest.raises(OffsetOutOfRangeError, match="Offset 0 is outside prices-0"):
        read_all(store, "prices", start=0)


# -------------------------------------------------------------------------------------------- start positions
@pytest.fixture
def compacted_topic(store: Store) -> Model:
    """One partition: 20 messages over 4 keys compacted (horizon 19), then a tail of 6 with a tombstone."""
    model = Model(store, "prices")
    for i in range(20):
        model.append([(f"k{i % 4}".encode(), f"v{i}".encode())])
    model.compact()
    model.append([(b"k0", b"t0"), (b"k1", None), (b"k9", b"t1")])
    model.append([(b"k0", b"t2"), (b"k2", b"t3"), (b"k1", b"t4")])
    return model


def test_start_positions_on_the_raw_view(store: Store, compacted_topic: Model) -> None:
    model = compacted_topic
    raw = model.raw(0)
    end = raw[-1].offset + 1
    assert read_all(store, "prices", start="earliest") == raw
    assert read_all(store, "prices", start=EARLIEST) == raw
    assert read_all(store, "prices", start="latest") == []
    assert read_all(store, "prices", start=LATEST) == []
    assert read_all(store, "prices", start=7) == raw[7:]
    assert read_all(store, "prices", start=end) == []
    assert read_all(store, "prices", start={0: 12}) == raw[12:]
    assert read_all(store, "prices", start=Timestamp(raw[5].timestamp)) == raw[5:]
    assert read_all(store, "prices", start=Timestamp(raw[5].timestamp - 1)) == raw[5:]
    assert read_all(store, "prices", start=Timestamp(raw[-1].timestamp + 1)) == []
    with pytest.raises(OffsetOutOfRangeError):
        read_all(store, "prices", start=end + 1)


def test_start_positions_on_the_compacted_view(store: Store, compacted_topic: Model) -> None:
    model = compacted_topic
    horizon = model.horizons[0]
    snapshot, tail = model.snapshot(0), model.raw(0, horizon + 1)
    assert [m.offset for m in snapshot] == [16, 17, 18, 19]
    assert read_all(store, "prices", read_compacted=True, start="latest") == []
    # an offset inside the ledger's range starts at the first ledger message at or after it
    assert read_all(store, "prices", read_compacted=True, start=3) == snapshot + tail
    assert read_all(store, "prices", read_compacted=True, start=18) == snapshot[2:] + tail
    # an offset above the horizon reads the raw tail from it
    assert read_all(store, "prices", read_compacted=True, start=horizon + 2) == tail[1:]
    # a timestamp: the first ledger message at or after it, then everything after
    assert read_all(store, "prices", read_compacted=True, start=Timestamp(snapshot[1].timestamp)) == (
        snapshot[1:] + tail)
    # a timestamp past the ledger: the first tail message at or after it
    assert read_all(store, "prices", read_compacted=True, start=Timestamp(tail[2].timestamp - 5)) == tail[2:]
    assert read_all(store, "prices", read_compacted=True, start=Timestamp(10**15)) == []
    with pytest.raises(OffsetOutOfRangeError):
        read_all(store, "prices", read_compacted=True, start=tail[-1].offset + 2)


def test_a_compacted_timestamp_start_finds_the_tail_message_when_timestamps_go_back(store: Store) -> None:
    """offsetsForTimes on the whole log hits a message below the horizon; the tail is scanned instead."""
    store.create_topic("prices", config=TINY)
    store.append("prices", [{"key": b"a", "value": b"1", "timestamp": 100},
                            {"key": b"a", "value": b"2", "timestamp": 500}])
    Compactor(store).compact("prices")
    store.append("prices", [{"key": b"b", "value": b"3", "timestamp": 200},
                            {"key": b"c", "value": b"4", "timestamp": 600}])
    got = read_all(store, "prices", read_compacted=True, start=Timestamp(550))
    assert [(m.offset, m.value) for m in got] == [(3, b"4")]
    got = read_all(store, "prices", read_compacted=True, start=Timestamp(450))
    assert [(m.offset, m.value) for m in got] == [(1, b"2"), (2, b"3"), (3, b"4")]


def test_a_dict_start_names_partitions_and_the_others_start_at_the_earliest(store: Store) -> None:
    model = Model(store, "prices", partitions=2)
    model.append([(b"a", b"1"), (b"a", b"2"), (b"a", b"3")], partition=0)
    model.append([(b"b", b"1"), (b"b", b"2")], partition=1)
    got = read_all(store, "prices", start={1: 1})
    assert got == model.raw(0) + model.raw(1, 1)
    assert read_all(store, "prices", start={0: "latest"}, partitions=[0]) == []


@pytest.mark.parametrize("position", [-1, True, "first", 1.5, Timestamp("5"), {7: 0}])  # type: ignore[arg-type]
def test_invalid_positions_are_refused_with_what_is_allowed(store: Store, position: object) -> None:
    Model(store, "prices")
    with pytest.raises(InvalidPositionError, match="A position is 'earliest', 'latest'"):
        Reader(store, "prices", start=position)  # type: ignore[arg-type]


def test_an_unknown_partition_is_refused(store: Store) -> None:
    Model(store, "prices", partitions=2)
    with pytest.raises(UnknownPartitionError):
        Reader(store, "prices", partitions=[2])


# ----------------------------------------------------------------------------------------- seek and continue
def test_seek_moves_the_reader_in_both_views(store: Store, compacted_topic: Model) -> None:
    model = compacted_topic
    for read_compacted, view in ((False, model.raw(0)), (True, model.compacted(0))):
        reader = Reader(store, "prices", read_compacted=read_compacted)
        assert list(reader) == view
        assert list(reader) == []  # a second read continues at the end
        reader.seek("earliest")
        assert list(reader) == view
        reader.seek(view[2].offset)
        assert list(reader) == view[2:]
        reader.seek(Timestamp(view[3].timestamp))
        assert list(reader) == view[3:]
        reader.seek({0: "latest"})
        assert list(reader) == []
        assert reader.positions == {0: model.raw(0)[-1].offset + 1}
        reader.close()
        with pytest.raises(ReaderClosedError):
            list(reader)


def test_a_reader_continues_with_what_was_appended_after_its_read(store: Store, compacted_topic: Model) -> None:
    model = compacted_topic
    reader = Reader(store, "prices", read_compacted=True)
    assert list(reader) == model.compacted(0)
    appended = model.append([(b"k5", b"x"), (b"k5", None)])
    assert list(reader) == appended


def test_breaking_out_of_a_read_continues_after_the_last_message_handed_out(store: Store,
                                                                            compacted_topic: Model) -> None:
    view = compacted_topic.compacted(0)
    reader = Reader(store, "prices", read_compacted=True)
    first: list[Message] = []
    for message in reader:
        first.append(message)
        if len(first) == 3:
            break
    assert first + list(reader) == view


def test_a_live_reader_gets_the_tombstones_a_newer_compaction_folded_away(store: Store) -> None:
    """Pulsar PR #26190: the reader is between the old and the new horizon; the next read must not jump to the new
    ledger (whose snapshot no longer has the tombstoned key) but read the raw log from where it stands."""
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"b", b"1")])
    model.compact()
    reader = Reader(store, "prices", read_compacted=True)
    first = list(reader)
    tail = model.append([(b"a", None), (b"b", b"2")])
    model.compact()
    assert model.snapshot(0) == [tail[1]]
    assert list(reader) == tail
    state: dict[bytes | None, bytes | None] = {}
    for message in first + tail:
        state[message.key] = message.value
    assert {k: v for k, v in state.items() if v is not None} == model.latest()


# ------------------------------------------------------------------------------------ compaction during a read
@pytest.mark.parametrize("layers", ["1", "4"], ids=["whole", "layered"])
def test_a_read_finishes_on_the_ledger_it_opened_while_a_new_one_is_published(store: Store, layers: str) -> None:
    """The new view rewrites the old ledger (retired), or is layered over it (the old view's record retired)."""
    model = Model(store, "prices", partitions=2, config={**TINY, "compaction.max.layers": layers})
    rng = random.Random(7)
    model.append(random_rows(rng, 30, keys=6))
    model.compact()
    model.append(random_rows(rng, 12, keys=6))
    old_horizons = dict(model.horizons)
    expected = model.compacted(0) + model.compacted(1)
    ends = {p: model.raw(p)[-1].offset + 1 for p in range(2)}
    old_ledger = ledger_file(store.partition_log("prices", 1).folder,
                             CompactedLedgers(store.partition_log("prices", 1).folder).read_cursor().ledger_id)  # type: ignore[union-attr]

    reader = Reader(store, "prices", read_compacted=True)
    read = reader.batches()
    first = next(read)
    model.append(random_rows(rng, 20, keys=6))  # a tombstone or two for keys of the old ledgers, surely
    model.compact()
    assert model.horizons != old_horizons
    retired = old_ledger if layers == "1" else old_ledger.with_suffix(".layers")
    assert not retired.exists() and retired.with_name(retired.name + DELETED_SUFFIX).exists()
    rest = list(read)

    table = pa.Table.from_batches([first, *rest], schema=MESSAGE_SCHEMA)
    got = [(p, o) for p, o in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                                  strict=True)]
    assert got == [(m.partition, m.offset) for m in expected]
    assert all(o < ends[p] for p, o in got)
    # the next read continues on the new view from where this one stopped: only the new appends
    assert list(reader) == [m for p in range(2) for m in model.raw(p) if m.offset >= ends[p]]


def test_retention_keeps_the_raw_tail_a_reader_of_a_replaced_ledger_still_needs(store: Store) -> None:
    """Invariant 5 with retention running: the replaced ledger's reader goes on to the raw log above the old
    horizon, which the new horizon alone would let retention delete."""
    model = Model(store, "prices", config={**TINY, "retention.ms": "1000"})  # every message is long expired
    rng = random.Random(11)
    model.append(random_rows(rng, 40, keys=6))
    model.compact()
    model.append(random_rows(rng, 40, keys=6))
    old_horizon, end = model.horizons[0], model.raw(0)[-1].offset + 1
    expected = model.compacted(0, horizon=old_horizon)

    read = Reader(store, "prices", read_compacted=True).batches()
    first = next(read)  # the old ledger is open; the raw tail above its horizon is not read yet
    model.append(random_rows(rng, 40, keys=6))
    model.compact()
    deleted = store.enforce_retention("prices")
    assert deleted and store.start_offset("prices", 0) <= old_horizon + 1 < model.horizons[0]
    table = pa.Table.from_batches([first, *read], schema=MESSAGE_SCHEMA)
    assert table.column("offset").to_pylist() == [m.offset for m in expected if m.offset < end]


def test_message_iteration_finishes_on_its_ledger_too(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(12)])
    model.compact()
    expected = model.compacted(0)
    messages = iter(Reader(store, "prices", read_compacted=True))
    first = next(messages)
    model.append([(b"k0", None), (b"k1", b"new")])
    model.compact()
    assert [first, *messages] == expected


# ---------------------------------------------------------------------------------------- other processes
READER_SCRIPT = """
import json, sys
from readers import Reader
with Reader(sys.argv[1], "prices", read_compacted=True) as reader:
    print(json.dumps([[m.partition, m.offset, m.timestamp, m.key and m.key.hex(), m.value and m.value.hex()]
                      for m in reader]))
"""


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_a_reader_in_another_process_sees_the_same_compacted_view(store: Store, data_dir: Path) -> None:
    model = Model(store, "prices", partitions=2)
    rng = random.Random(3)
    model.append(random_rows(rng, 40))
    model.compact()
    model.append(random_rows(rng, 10))
    store.flush()
    done = subprocess.run([sys.executable, "-c", READER_SCRIPT, str(data_dir)], capture_output=True, text=True,
                          check=True, timeout=60)
    in_process = read_all(store, "prices", read_compacted=True)
    from_path = read_all(data_dir, "prices", read_compacted=True)
    assert from_path == in_process == model.compacted(0) + model.compacted(1)
    assert json.loads(done.stdout) == [[m.partition, m.offset, m.timestamp, m.key and m.key.hex(),
                                        m.value and m.value.hex()] for m in in_process]
