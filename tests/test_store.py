"""The store's public API: topics, append, read, rolling, indexes, offsetsForTimes, recovery and bad input
(invariants 1, 2 and 10)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import storage.loader
import storage.segment
from storage import Store
from storage.checkpoints import CorruptCheckpointError, read_checkpoint
from storage.codec import HEADER, MAGIC, BatchFormatError, BatchHeader
from storage.config import InvalidConfigError, UnknownConfigError
from storage.errors import (
    CorruptSegmentError,
    InvalidMessagesError,
    InvalidTopicNameError,
    LedgerviewError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    TopicDeletedError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from storage.files import LOG_SUFFIX, MAX_PARTITIONS, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX
from storage.partitioner import partition_for_keys
from storage.remote_store import RemoteStore
from storage.segment import Segment, scan_headers
from tests.conftest import TINY, ManualClock


def changelog(count: int, start: int = 0, timestamp0: int = 1_000) -> pa.Table:
    keys = [f"k{i % 7}".encode() for i in range(start, start + count)]
    values = [f"v{i}".encode() for i in range(start, start + count)]
    timestamps = [timestamp0 + 10 * i for i in range(start, start + count)]
    return pa.table({"key": pa.array(keys), "value": pa.array(values), "timestamp": pa.array(timestamps)})


def segment_files(data_dir: Path, topic: str, partition: int, suffix: str = LOG_SUFFIX) -> list[Path]:
    return sorted((data_dir / f"{topic}-{partition}").glob(f"*{suffix}"))


# ------------------------------------------------------------------------------------------------------- topics
def test_topics_are_created_listed_described_altered_and_deleted(store: Store) -> None:
    store.create_topic("prices", partitions=3, config={"segment.bytes": "1048576"})
    store.create_topic("users")
    assert store.list_topics() == ["prices", "users"]
    description = store.describe_topic("prices")
    assert [p.partition for p in description.partitions] == [0, 1, 2]
    assert description.overrides == {"segment.bytes": "1048576"}
    assert description.config["retention.ms"] == "604800000"
    store.alter_topic_config("prices", set={"retention.ms": "1000"}, delete=["segment.bytes"])
    assert store.describe_topic("prices").overrides == {"retention.ms": "1000"}
    store.delete_topic("prices")
    assert store.list_topics() == ["users"]
    with pytest.raises(UnknownTopicError, match="Topics in this store: users"):
        store.append("prices", [(b"k", b"v")])


def test_creating_an_existing_topic_fails_and_keeps_its_data(store: Store) -> None:
    store.create_topic("prices")
    store.append("prices", [(b"k", b"v")])
    with pytest.raises(TopicExistsError):
        store.create_topic("prices", partitions=2)
    assert store.read("prices", 0)["value"].to_pylist() == [b"v"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [("", "empty"), (".", "reserved"), ("..", "reserved"), ("a/b", "contains '/'"), ("../up", "contains '/'"),
     ("x" * 250, "250 characters"), ("white space", "contains ' '"), ("é", "contains 'é'")],
)
def test_bad_topic_names_are_refused(store: Store, data_dir: Path, name: str, reason: str) -> None:
    with pytest.raises(InvalidTopicNameError, match=reason):
        store.create_topic(name)
    assert sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(".")) == ["__topics"]


@pytest.mark.parametrize("partitions", [0, -1, MAX_PARTITIONS + 1, 2**31 - 1, True, 2.0])
def test_a_partition_count_outside_1_to_the_bound_is_refused_on_both_tiers(store: Store, data_dir: Path,
                                                                           tmp_path: Path, partitions: int) -> None:
    """A mistyped count (2**31 - 1 partitions) would have created folders for hours; each tier refuses it at once,
    saying what is allowed, and creates nothing."""
    allowed = rf"partitions must be an integer from 1 to {MAX_PARTITIONS:,}, got {partitions!r}"
    with pytest.raises(LedgerviewError, match=allowed):
        store.create_topic("t", partitions)
    assert store.list_topics() == [] and not list(data_dir.glob("t-*"))
    (tmp_path / "tier").mkdir()
    remote = RemoteStore.open(f"file://{tmp_path / 'tier'}")
    with pytest.raises(LedgerviewError, match=allowed):
        remote.create_topic("t", partitions)
    assert remote.list_topics() == []


def test_a_topic_name_of_249_allowed_characters_is_accepted(store: Store) -> None:
    name = ("a.B_9-" * 42)[:249]
    store.create_topic(name)
    assert store.list_topics() == [name]


def test_bad_config_is_refused_and_nothing_is_created(store: Store) -> None:
    with pytest.raises(UnknownConfigError, match=r"Did you mean 'segment.bytes'"):
        store.create_topic("prices", config={"segment.byte": "10"})
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
        store.create_topic("prices", config={"segment.bytes": "-5"})
    assert store.list_topics() == []


# ------------------------------------------------------------------------------------------------------ append
def test_append_then_read_returns_every_message_with_its_offset(store: Store) -> None:
    store.create_topic("t")
    result = store.append("t", changelog(100), partition=0)
    assert list(result) == [(0, offset) for offset in range(100)]
    table = store.read("t", 0)
    assert table.column_names == ["partition", "offset", "timestamp", "key", "value", "headers"]
    assert table["offset"].to_pylist() == list(range(100))
    assert table["value"].to_pylist() == changelog(100)["value"].to_pylist()
    assert store.start_offset("t", 0) == 0 and store.end_offset("t", 0) == 100


def test_messages_may_be_a_list_of_mappings_or_pairs(store: Store, clock: ManualClock) -> None:
    store.create_topic("t")
    store.append("t", [{"key": "a", "value": "1", "headers": [("trace", b"x")]}, (b"b", None)], partition=0)
    rows = store.read("t", 0).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(b"a", b"1"), (b"b", None)]
    assert rows[0]["headers"] == [{"key": "trace", "value": b"x"}] and rows[1]["headers"] is None
    assert {r["timestamp"] for r in rows} == {clock.now_ms}


def test_keyed_messages_go_where_kafka_partitions_them(store: Store) -> None:
    store.create_topic("t", partitions=4)
    data = changelog(200)
    result = store.append("t", data)
    expected = partition_for_keys(data["key"].combine_chunks(), 4)
    assert result.partitions.tolist() == expected.tolist()
    for partition in range(4):
        assert store.read("t", partition)["key"].to_pylist() == [
            k for k, p in zip(data["key"].to_pylist(), expected, strict=True) if p == partition
        ]


def test_a_partition_column_chooses_the_partition(store: Store) -> None:
    store.create_topic("t", partitions=2)
    table = changelog(4).append_column("partition", pa.array([1, 0, 1, 1], pa.int32()))
    assert list(store.append("t", table)) == [(1, 0), (0, 0), (1, 1), (1, 2)]


def test_a_null_in_the_partition_column_leaves_that_message_to_the_partitioner(store: Store) -> None:
    store.create_topic("t", partitions=4)
    data = changelog(200)
    given = [3 if row % 3 == 0 else None for row in range(200)]
    result = store.append("t", data.append_column("partition", pa.array(given, pa.int32())))
    by_key = partition_for_keys(data["key"].combine_chunks(), 4)
    assert result.partitions.tolist() == [3 if p is not None else int(k) for p, k in zip(given, by_key, strict=True)]
    with pytest.raises(UnknownPartitionError):
        store.append("t", data.slice(0, 2).append_column("partition", pa.array([None, 9], pa.int32())))


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_batches_read_back_the_same(store: Store, compression: str) -> None:
    store.create_topic("t")
    store.append("t", changelog(500), partition=0, compression=compression)
    assert store.read("t", 0)["value"].to_pylist() == changelog(500)["value"].to_pylist()


def test_topic_compression_type_overrides_the_producer(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config={"compression.type": "zstd"})
    store.append("t", [(b"k", b"v" * 10_000)], partition=0)
    assert segment_files(data_dir, "t", 0)[0].stat().st_size < 2_000


def test_log_append_time_replaces_producer_timestamps(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={"message.timestamp.type": "LogAppendTime"})
    store.append("t", changelog(3), partition=0)
    assert store.read("t", 0)["timestamp"].to_pylist() == [clock.now_ms] * 3


def test_messages_without_a_timestamp_beside_ones_with_get_the_appends_time(store: Store, clock: ManualClock) -> None:
    """As a null in a table's timestamp column is: a list of messages may give a timestamp on some only."""
    store.create_topic("t")
    store.append("t", [{"key": b"a", "value": b"1", "timestamp": 5}, (b"b", b"2"),
                       {"key": b"c", "value": b"3", "timestamp": None}], partition=0)
    store.append("t", pa.table({"key": [b"d"], "value": [b"4"], "timestamp": pa.array([None], pa.int64())}),
                 partition=0)
    assert store.read("t", 0)["timestamp"].to_pylist() == [5, clock.now_ms, clock.now_ms, clock.now_ms]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pa.table({"key": [b"k"], "value": [1]}), "Column 'value' has type int64"),
        (pa.table({"key": [b"k"], "value": [b"v"], "colour": [1]}), "Unknown columns \\['colour'\\]"),
        (pa.table({"key": [b"k"]}), "need a 'value' column"),
        (pa.table({"value": [b"v"], "timestamp": ["noon"]}), "Column 'timestamp' has type string"),
        ([42], "Message at row 0 is a int"),
        ([{"key": b"k", "val": b"v"}], "it needs 'value'"),
        (None, "Cannot append a NoneType"),
        ({"key": b"k", "value": b"v"}, "Cannot append a dict"),
        (pa.table({"value": [b"a", b"b"], "timestamp": [5, -1]}), "row 1 has timestamp -1; allowed: 0 or more"),
        (pa.table({"value": [b"v"], "timestamp": pa.array([2**63], pa.uint64())}), "values outside int64"),
        (pa.table({"value": [b"v"], "partition": [2**40]}), "Column 'partition' has values outside int32"),
    ],
)
def test_wrong_input_is_refused_and_nothing_is_written(store: Store, data: object, message: str) -> None:
    store.create_topic("t")
    store.append("t", [(b"k", b"before")], partition=0)
    with pytest.raises(InvalidMessagesError, match=message):
        store.append("t", data, partition=0)
    assert store.read("t", 0)["value"].to_pylist() == [b"before"]


def test_oversized_message_is_refused_and_nothing_is_written(store: Store) -> None:
    store.create_topic("t", config={"max.message.bytes": "1000"})
    with pytest.raises(MessageTooLargeError, match=r"row 1 is 1\d+ bytes, over max\.message\.bytes=1000"):
        store.append("t", [(b"k", b"small"), (b"k", b"x" * 1000), (b"k", b"small")], partition=0)
    assert store.end_offset("t", 0) == 0


def test_unknown_partition_is_refused(store: Store) -> None:
    store.create_topic("t", partitions=2)
    with pytest.raises(UnknownPartitionError, match="partitions are 0 to 1"):
        store.append("t", [(b"k", b"v")], partition=2)
    with pytest.raises(UnknownPartitionError):
        store.append("t", [(b"k", b"v")], partition=True)  # type: ignore[arg-type]
    assert store.end_offset("t", 0) == store.end_offset("t", 1) == 0


def test_a_negative_max_messages_is_refused(store: Store) -> None:
    store.create_topic("t")
    store.append("t", changelog(3), partition=0)
    with pytest.raises(LedgerviewError, match="max_messages must be None or an integer >= 0, got -1"):
        store.read("t", 0, max_messages=-1)
    assert store.read("t", 0, max_messages=0).num_rows == 0


# ----------------------------------------------------------------------------------------- segments and indexes
def test_segments_roll_on_segment_bytes_and_reads_cross_them(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config=TINY)
    for start in range(0, 300, 10):
        store.append("t", changelog(10, start), partition=0)
    logs = segment_files(data_dir, "t", 0)
    assert len(logs) > 5
    assert all(path.stat().st_size <= 2048 for path in logs[:-1])
    assert [int(path.name[:20]) for path in logs] == sorted(int(path.name[:20]) for path in logs)
    assert store.read("t", 0)["offset"].to_pylist() == list(range(300))
    assert store.read("t", 0, start_offset=137, max_messages=50)["offset"].to_pylist() == list(range(137, 187))


def test_segments_roll_on_segment_ms_by_message_time(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config={"segment.ms": "1000"})
    store.append("t", changelog(5, timestamp0=0), partition=0)
    store.append("t", changelog(5, timestamp0=500), partition=0)
    assert len(segment_files(data_dir, "t", 0)) == 1
    store.append("t", changelog(5, timestamp0=5_000), partition=0)
    assert len(segment_files(data_dir, "t", 0)) == 2


def test_roll_seals_the_active_segment(store: Store, data_dir: Path) -> None:
    store.create_topic("t")
    store.append("t", changelog(5), partition=0)
    store.roll("t", 0)
    store.roll("t", 0)  # an empty active segment is not rolled again
    store.append("t", changelog(5, 5), partition=0)
    assert [p.name for p in segment_files(data_dir, "t", 0)] == [f"{0:020d}.log", f"{5:020d}.log"]


def test_sparse_index_has_entries_and_reads_from_every_offset_agree(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config={"index.interval.bytes": "100"})
    for start in range(0, 400, 4):
        store.append("t", changelog(4, start), partition=0)
    index = segment_files(data_dir, "t", 0, OFFSET_INDEX_SUFFIX)[0]
    assert index.stat().st_size > 8 * 20
    everything = store.read("t", 0)["offset"].to_pylist()
    for start in range(0, 400, 13):
        assert store.read("t", 0, start_offset=start, max_messages=5)["offset"].to_pylist() == everything[start:start+5]


def test_offset_for_timestamp_finds_the_first_message_at_or_after(store: Store) -> None:
    store.create_topic("t", config=TINY)
    for start in range(0, 200, 10):
        store.append("t", changelog(10, start, timestamp0=1_000), partition=0)  # timestamp = 1000 + 10 * offset
    assert store.offset_for_timestamp("t", 0, 0) == 0
    assert store.offset_for_timestamp("t", 0, 1_000) == 0
    assert store.offset_for_timestamp("t", 0, 1_555) == 56
    assert store.offset_for_timestamp("t", 0, 1_000 + 10 * 199) == 199
    assert store.offset_for_timestamp("t", 0, 1_000 + 10 * 199 + 1) is None


def test_offset_for_timestamp_with_timestamps_out_of_order(store: Store) -> None:
    store.create_topic("t", config=TINY)
    timestamps = [50, 10, 70, 20, 90, 30, 60]
    store.append("t", pa.table({"key": [b"k"] * 7, "value": [b"v"] * 7, "timestamp": timestamps}), partition=0)
    assert store.offset_for_timestamp("t", 0, 65) == 2
    assert store.offset_for_timestamp("t", 0, 80) == 4
    assert store.offset_for_timestamp("t", 0, 55) == 2


def test_reading_outside_the_log_is_an_error(store: Store) -> None:
    store.create_topic("t")
    store.append("t", changelog(3), partition=0)
    assert store.read("t", 0, start_offset=3).num_rows == 0
    with pytest.raises(OffsetOutOfRangeError, match="holds offsets 0 to 3"):
        store.read("t", 0, start_offset=4)


# ------------------------------------------------------------------------------------------ reopen and recovery
def test_reopen_keeps_everything_and_appends_continue(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", config=TINY)
        for start in range(0, 100, 10):
            store.append("t", changelog(10, start), partition=0)
    with Store.open(data_dir) as store:
        assert store.end_offset("t", 0) == 100
        store.append("t", changelog(10, 100), partition=0)
        assert store.read("t", 0)["offset"].to_pylist() == list(range(110))


def recovery_point(data_dir: Path, topic: str, partition: int) -> int | None:
    return read_checkpoint(data_dir / "recovery-point-offset-checkpoint").get((topic, partition))


def test_flush_messages_fsyncs_and_moves_the_recovery_point_once_that_many_are_unflushed(store: Store,
                                                                                       data_dir: Path) -> None:
    store.create_topic("t", config={"flush.messages": "5"})
    store.append("t", changelog(3), partition=0)
    assert recovery_point(data_dir, "t", 0) in (None, 0)
    store.append("t", changelog(3, 3), partition=0)
    assert recovery_point(data_dir, "t", 0) == 6


def test_flush_ms_is_honoured_by_the_next_append_and_by_flush_due_without_one(
        store: Store, data_dir: Path, clock: ManualClock) -> None:
    store.create_topic("t", config={"flush.ms": "1000"})
    store.append("t", changelog(2), partition=0)
    clock.advance(999)
    assert store.flush_due() == 0
    assert recovery_point(data_dir, "t", 0) in (None, 0)
    clock.advance(1)
    assert store.flush_due() == 1  # nobody appends any more: the scheduled check flushes
    assert recovery_point(data_dir, "t", 0) == 2
    assert store.flush_due() == 0  # nothing unflushed
    store.append("t", changelog(2, 2), partition=0)
    clock.advance(1000)
    store.append("t", changelog(1, 4), partition=0)  # the append itself sees flush.ms has passed
    assert recovery_point(data_dir, "t", 0) == 5


def test_flush_due_uses_a_flush_ms_another_process_altered_after_the_last_append(
        store: Store, data_dir: Path, clock: ManualClock) -> None:
    store.create_topic("t", config={"flush.ms": "60000"})
    store.append("t", changelog(2), partition=0)
    with Store.open(data_dir, clock=clock) as other:  # the CLI's `topics alter`, say, while the service runs
        other.alter_topic_config("t", {"flush.ms": "1000"})
    clock.advance(1000)
    assert store.flush_due() == 1
    assert recovery_point(data_dir, "t", 0) == 2


def test_checkpoints_use_kafkas_text_format(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", partitions=2)
        store.append("t", changelog(3), partition=1)
    lines = (data_dir / "recovery-point-offset-checkpoint").read_text().splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2
    assert "t 1 3" in lines[2:]


@pytest.mark.parametrize("damage", [b"0\n1\nt 0 x\n", b"\xf4\n1\nt 0 3\n"], ids=["not a number", "not text"])
def test_a_malformed_checkpoint_is_an_error_that_names_it(data_dir: Path, damage: bytes) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", changelog(3), partition=0)
    checkpoint = data_dir / "recovery-point-offset-checkpoint"
    checkpoint.write_bytes(damage)
    with Store.open(data_dir) as store, pytest.raises(CorruptCheckpointError, match=f"{checkpoint} is malformed"):
        store.partition_log("t", 0)


def test_a_torn_tail_is_cut_back_to_the_last_whole_batch(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", changelog(10), partition=0)
        store.append("t", changelog(10, 10), partition=0)
    (data_dir / "recovery-point-offset-checkpoint").unlink()  # as after a crash before the last flush
    log = segment_files(data_dir, "t", 0)[0]
    whole = log.stat().st_size
    with open(log, "r+b") as file:
        file.truncate(whole - 13)
    with Store.open(data_dir) as store:
        assert store.read("t", 0)["offset"].to_pylist() == list(range(10))
        store.append("t", changelog(5, 10), partition=0)
        assert store.read("t", 0)["offset"].to_pylist() == list(range(15))


@pytest.mark.parametrize("seed", range(5))
def test_garbage_from_a_random_byte_to_the_end_keeps_exactly_the_valid_prefix(data_dir: Path, seed: int) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
        for start in range(0, 50, 5):
            store.append("t", changelog(5, start), partition=0)
    (data_dir / "recovery-point-offset-checkpoint").unlink()
    log = segment_files(data_dir, "t", 0)[0]
    data = log.read_bytes()
    rng = np.random.default_rng(seed)
    cut = int(rng.integers(1, len(data)))
    log.write_bytes(data[:cut] + rng.integers(0, 256, len(data) - cut, dtype=np.uint8).tobytes())
    batch_bytes = len(data) // 10
    with Store.open(data_dir) as store:
        assert store.read("t", 0)["offset"].to_pylist() == list(range(5 * (cut // batch_bytes)))


def test_corruption_inside_a_sealed_segment_names_file_and_offset(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", config=TINY)
        for start in range(0, 100, 10):
            store.append("t", changelog(10, start), partition=0)
    first = segment_files(data_dir, "t", 0)[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with Store.open(data_dir) as store, pytest.raises(
        CorruptSegmentError, match=rf"{first.name} at file position \d+, where offset \d+ was expected"
    ) as error:
        store.read("t", 0)
    assert str(first) in str(error.value)


def test_corruption_of_a_sealed_segment_found_in_recovery_is_an_error(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", config=TINY)
        for start in range(0, 100, 10):
            store.append("t", changelog(10, start), partition=0)
    (data_dir / "recovery-point-offset-checkpoint").unlink()
    first = segment_files(data_dir, "t", 0)[0]
    data = bytearray(first.read_bytes())
    data[-20] ^= 0xFF
    first.write_bytes(bytes(data))
    with Store.open(data_dir) as store, pytest.raises(CorruptSegmentError, match=first.name):
        store.read("t", 0)
    assert first.read_bytes() == bytes(data)  # nothing was cut


def test_damage_below_the_recovery_point_of_the_active_segment_is_an_error_not_a_torn_tail(data_dir: Path) -> None:
    """Bytes below the recovery point were fsynced: an invalid batch there is damage, so recovery must not cut the
    log back (which would silently drop acknowledged messages)."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        for start in range(0, 30, 10):
            store.append("t", changelog(10, start), partition=0)
    assert "t 0 30" in (data_dir / "recovery-point-offset-checkpoint").read_text()  # a clean close: all fsynced
    log = segment_files(data_dir, "t", 0)[0]
    data = bytearray(log.read_bytes())
    data[-20] ^= 0xFF  # inside the last batch, which is below the recovery point
    log.write_bytes(bytes(data))
    with Store.open(data_dir) as store, pytest.raises(CorruptSegmentError, match=log.name):
        store.read("t", 0)
    assert log.read_bytes() == bytes(data)  # nothing was cut


def one_segment_of_many_batches(data_dir: Path) -> Path:
    """Topic t of 200 messages in 40 batches, all in its active segment, densely indexed, closed cleanly (the
    recovery point at its end); its log file."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"index.interval.bytes": "100"})
        for start in range(0, 200, 5):  # timestamps going back and forth, so the kept maximum is not the last
            store.append("t", changelog(5, start, timestamp0=1_000 + (500 if start % 20 == 5 else 0)), partition=0)
    return segment_files(data_dir, "t", 0)[0]


def end_state(segment: Segment) -> tuple[object, ...]:
    return (segment.offset_index.keys, segment.offset_index.values, segment.time_index.keys,
            segment.time_index.values, segment.first_timestamp, segment.max_timestamp, segment.next_offset,
            segment.size_bytes)


def write_recovery_point(data_dir: Path, offset: int) -> None:
    (data_dir / "recovery-point-offset-checkpoint").write_text(f"0\n1\nt 0 {offset}\n")


def test_a_writer_reopening_the_active_segment_reads_it_from_the_recovery_points_indexed_batch(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the recovery point the batches were fsynced: a writer's open keeps the sound index's entries there
    and reads only from the last indexed batch at or before it, as Kafka recovers from its recovery point (a
    log of small batches is not read whole at every open), and ends in the state a whole rebuild gives."""
    log = one_segment_of_many_batches(data_dir)
    write_recovery_point(data_dir, 150)
    rebuilt = Segment(log.parent, 0, index_interval_bytes=100)
    assert rebuilt.rebuild_indexes(verify_from=0, persist=False) is None
    starts: list[int] = []

    def recorded(view: memoryview, position: int, end: int, checked: tuple[int, int] | None, *,
                 check_first: bool = False) -> Iterator[BatchHeader]:
        starts.append(position)
        return scan_headers(view, position, end, checked, check_first=check_first)

    monkeypatch.setattr(storage.segment, "scan_headers", recorded)
    with Store.open(data_dir) as store:
        recovered = store.partition_log("t", 0).segments[0]
        assert end_state(recovered) == end_state(rebuilt)
        indexed = max(position for key, position in zip(rebuilt.offset_index.keys, rebuilt.offset_index.values,
                                                        strict=True) if key <= 150)
        assert starts == [indexed] and indexed > 0
        assert store.read("t", 0)["offset"].to_pylist() == list(range(200))


def test_a_damaged_batch_above_the_recovery_point_is_cut_as_a_torn_write_when_recovery_resumes_from_the_index(
        data_dir: Path) -> None:
    """The batches from the recovery point's indexed batch on have their CRC checked: one damaged there (not
    fsynced, so a torn write) ends the log, and appends go on after the last whole batch."""
    log = one_segment_of_many_batches(data_dir)
    write_recovery_point(data_dir, 150)
    data = bytearray(log.read_bytes())
    data[-20] ^= 0xFF  # inside the last batch, offsets 195-199, above the recovery point
    log.write_bytes(bytes(data))
    with Store.open(data_dir) as store:
        assert store.read("t", 0)["offset"].to_pylist() == list(range(195))
        store.append("t", changelog(5, 195), partition=0)
        assert store.read("t", 0)["offset"].to_pylist() == list(range(200))


def test_reads_from_inside_a_segment_check_each_batch_once_per_process_and_never_one_they_did_not_read(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction's new messages and a consumer's position start inside a segment: read again, their batches
    are not checked again; a damaged batch below where they started is still found by the read that reaches it."""
    log = one_segment_of_many_batches(data_dir)
    data = bytearray(log.read_bytes())
    [damaged] = [header for header in scan_headers(memoryview(bytes(data)), 0, len(data), None)
                 if header.base_offset == 100]
    data[damaged.end_position - 3] ^= 0xFF
    log.write_bytes(bytes(data))
    checked: list[int] = []
    verify_batch = storage.segment.verify_batch

    def counted(view: memoryview, header: BatchHeader) -> None:
        checked.append(header.base_offset)
        verify_batch(view, header)

    monkeypatch.setattr(storage.segment, "verify_batch", counted)
    with Store.open(data_dir) as store:
        store.partition_log("t", 0)
        checked.clear()  # the writer's open checks the last batches (recovery); the reads' checks follow
        assert store.read("t", 0, start_offset=150)["offset"].to_pylist() == list(range(150, 200))
        assert sorted(checked) == list(range(150, 200, 5))
        checked.clear()
        for _ in range(2):  # only the batch the offset index sends a read to is checked again (the index has no CRC)
            assert store.read("t", 0, start_offset=150)["offset"].to_pylist() == list(range(150, 200))
        assert checked == [150, 150]
        checked.clear()
        assert store.read("t", 0, start_offset=105)["offset"].to_pylist() == list(range(105, 200))
        assert sorted(checked) == list(range(105, 150, 5))  # the batches just below, once each
        with pytest.raises(CorruptSegmentError, match=log.name):
            store.read("t", 0, start_offset=0)


def test_a_header_that_starts_in_the_checked_range_and_ends_past_it_is_checked() -> None:
    """Bytes inside a checked batch that parse as a header (a read started inside a batch by a scribbled offset
    index) are skipped while they end within the range; one that ends past it is no batch of the range, and passing
    it unchecked would extend the range over bytes nobody checked."""
    fake = HEADER.pack(0, 64, 0xDEADBEEF, MAGIC, 0, 0, 0, 0, 0, 0, 0)
    view = memoryview(bytes(8) + fake + bytes(120))
    [inside] = scan_headers(view, 8, 72, checked=(0, 80))
    assert inside.position == 8 and inside.end_position == 72
    with pytest.raises(BatchFormatError, match="CRC"):
        list(scan_headers(view, 8, 72, checked=(0, 40)))


def test_a_scribbled_index_entry_inside_a_checked_batch_is_not_taken_for_a_batch(tmp_path: Path) -> None:
    """An index entry scribbled to point inside a batch already checked, at bytes of a message's value that parse
    as a header of the entry's own offset: the read checks that first header's CRC, finds no batch there, and
    reads from the segment's start, serving the messages as written."""

    def build(folder: Path, value: bytes) -> Path:
        with Store.open(folder) as store:
            store.create_topic("t", config={"index.interval.bytes": "100"})
            for start in range(0, 200, 5):
                store.append("t", [(b"k%d" % i, value if start == 10 else b"v%d" % start)
                                   for i in range(start, start + 5)], partition=0)
        return segment_files(folder, "t", 0)[0]

    placeholder = HEADER.pack(0, 0, 0, MAGIC, 0, 0, 0, 0, 0, 0, 0)
    for pad in range(8):  # the fake header must end where its batch ends, on a multiple of 8 bytes
        marker = b"M" * (8 + pad)
        data = build(tmp_path / f"probe{pad}", marker + placeholder).read_bytes()
        position = data.index(marker + placeholder) + len(marker)
        host = next(header for header in scan_headers(memoryview(data), 0, len(data), None)
                    if header.position <= position < header.end_position)
        if (host.end_position - position) % 8 == 0:
            break
    assert host.base_offset == 10
    fake = HEADER.pack(10, host.end_position - position, 0, MAGIC, 0, 0, 0, 0, 0, 0, 0)
    log = build(tmp_path / "data", marker + fake)
    segment = Segment.load(log.parent, 0, index_interval_bytes=100, recovering=False)
    assert [o for batch in segment.read_batches(0, 30, verify=True) for o in batch.column(0).to_pylist()] == list(
        range(30))  # the batches holding the fake header are checked now
    entry = segment.offset_index.keys.index(10)
    segment.offset_index.values[entry] = position  # as a scribbled index file would say
    served = [o for batch in segment.read_batches(10, 40, verify=True) for o in batch.column(0).to_pylist()]
    assert served == list(range(10, 40))


@pytest.mark.parametrize("damage", ["scribbled", "shifted"])
def test_an_active_segment_index_that_does_not_match_the_log_is_rebuilt_whole_on_a_writers_open(
        data_dir: Path, damage: str) -> None:
    """The index has no checksum: a scribbled one, or one whose entries are ordered but do not point at their
    batches, is not trusted for the recovery; the segment is read whole and every message is served."""
    one_segment_of_many_batches(data_dir)
    index = segment_files(data_dir, "t", 0, OFFSET_INDEX_SUFFIX)[0]
    if damage == "scribbled":
        index.write_bytes(os.urandom(index.stat().st_size))
    else:
        entries = np.frombuffer(index.read_bytes(), "<i4").reshape(-1, 2).copy()  # (relative offset, position)
        entries[:, 1] += 1  # every position one byte into its batch
        index.write_bytes(entries.tobytes())
    write_recovery_point(data_dir, 150)
    with Store.open(data_dir) as store:
        messages = store.read("t", 0)
        assert messages["offset"].to_pylist() == list(range(200))
        timestamps = messages["timestamp"].to_numpy()
        for wanted in (1_000, 1_000 + 10 * 150, int(timestamps.max())):
            assert store.offset_for_timestamp("t", 0, wanted) == int(np.flatnonzero(timestamps >= wanted)[0])


@pytest.mark.parametrize("damage", ["missing", "scribbled", "truncated"])
def test_a_missing_or_corrupt_index_is_rebuilt(data_dir: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", config={**TINY, "index.interval.bytes": "100"})
        for start in range(0, 200, 5):
            store.append("t", changelog(5, start), partition=0)
        expected = store.read("t", 0)
    for suffix in (OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        for index in segment_files(data_dir, "t", 0, suffix)[:-1]:
            if damage == "missing":
                index.unlink()
            elif damage == "scribbled":
                index.write_bytes(os.urandom(index.stat().st_size))
            else:
                index.write_bytes(index.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING, logger="storage.segment"), Store.open(data_dir) as store:
        assert store.read("t", 0).equals(expected)
        rebuilt = [record.getMessage() for record in caplog.records if "Rebuilding the indexes" in record.getMessage()]
        assert len(rebuilt) == len(segment_files(data_dir, "t", 0)) - 1  # each damaged segment, named
        for start in range(0, 200, 17):
            assert store.read("t", 0, start_offset=start, max_messages=3)["offset"].to_pylist() == [
                start, start + 1, start + 2][: 200 - start]
        assert store.offset_for_timestamp("t", 0, 1_000 + 10 * 150) == 150


def first_segment_index(data_dir: Path) -> tuple[Path, np.ndarray]:
    """Topic t of 200 messages in small segments; its first segment's offset index and a copy of its entries
    (relative offset, file position)."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={**TINY, "index.interval.bytes": "100"})
        for start in range(0, 200, 5):
            store.append("t", changelog(5, start), partition=0)
    index = segment_files(data_dir, "t", 0, OFFSET_INDEX_SUFFIX)[0]
    return index, np.frombuffer(index.read_bytes(), dtype="<i4").reshape(-1, 2).copy()


def test_an_index_entry_pointing_at_the_wrong_batch_is_not_trusted(data_dir: Path) -> None:
    """An index scribbled on but still ordered passes the shape checks; reads must not skip messages by it."""
    index, entries = first_segment_index(data_dir)
    assert len(entries) >= 1
    entries[0, 0] -= 1  # claims the batch at that position starts one offset earlier than it does
    index.write_bytes(entries.tobytes())
    wanted = int(entries[0, 0])
    with Store.open(data_dir) as store:
        assert store.read("t", 0, start_offset=wanted, max_messages=2)["offset"].to_pylist() == [wanted, wanted + 1]


@pytest.mark.parametrize("moved", ["into its batch", "into the next batch"])
def test_an_index_entry_pointing_inside_a_batch_is_not_trusted(data_dir: Path, moved: str) -> None:
    """An entry whose position falls inside a batch (an index scribbled on but still ordered) must not fail a read
    of an intact log: the read starts from the segment's first batch instead."""
    index, entries = first_segment_index(data_dir)
    assert len(entries) >= 3
    wanted = int(entries[1, 0])  # not the last entry: opening the segment follows the log from that one
    entries[1, 1] += 7 if moved == "into its batch" else entries[2, 1] - entries[1, 1] - 1  # still ordered
    index.write_bytes(entries.tobytes())
    with Store.open(data_dir) as store:
        assert store.read("t", 0, start_offset=wanted, max_messages=2)["offset"].to_pylist() == [wanted, wanted + 1]


def test_stray_temporary_files_are_removed_on_open(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", changelog(3), partition=0)
    folder = data_dir / "t-0"
    (folder / "leftover.tmp").write_bytes(b"junk")
    (folder / f"{99:020d}.index").write_bytes(b"")  # an index whose log is gone
    (folder / f"{0:020d}.log.deleted").write_bytes(b"old")
    with Store.open(data_dir) as store:
        assert store.read("t", 0).num_rows == 3
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        f"{0:020d}.index", f"{0:020d}.log", f"{0:020d}.timeindex"]


def test_a_deleted_file_another_process_removes_during_the_open_does_not_fail_it(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention in another process removes an expired ``.deleted`` file without the writer lock, so it may go
    between this open listing the folder and removing it."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", changelog(3), partition=0)
    leftover = data_dir / "t-0" / f"{0:020d}.log.deleted"
    leftover.write_bytes(b"old")
    listed = storage.loader._segment_files

    def listed_then_removed(folder: Path) -> list[tuple[str, int, str, str | None]]:
        files = listed(folder)
        if leftover.exists():
            leftover.unlink()  # the other process's retention, right after the open listed the folder
        return files

    monkeypatch.setattr(storage.loader, "_segment_files", listed_then_removed)
    with Store.open(data_dir) as store:
        assert store.read("t", 0).num_rows == 3


def test_an_append_that_loses_its_topic_to_a_delete_says_so(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process deletes the topic between this one reading its metadata and appending: the append fails
    naming the deletion, not with the OS's error about a lock file."""
    with Store.open(data_dir) as store, Store.open(data_dir) as other:
        store.create_topic("t")
        store.append("t", changelog(3), partition=0)
        metadata = store.topic_metadata("t")
        other.delete_topic("t")
        monkeypatch.setattr(store, "topic_metadata", lambda topic: metadata)  # read just before the delete
        with pytest.raises(TopicDeletedError, match=r"Topic 't' was deleted .* while this one was appending"):
            store.append("t", changelog(1), partition=0)
        with pytest.raises(TopicDeletedError):
            store.append("t", changelog(1))


def test_a_topic_created_again_after_a_crashed_delete_starts_with_no_recovery_point(data_dir: Path) -> None:
    """A deletion that crashed after removing the folders left the old topic's checkpoint entries; the new topic
    must not inherit them (its recovery point would make a batch still being written look like damage)."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", changelog(1000), partition=0)
        store.flush()
    saved = (data_dir / "recovery-point-offset-checkpoint").read_bytes()
    with Store.open(data_dir) as store:
        store.delete_topic("t")
    (data_dir / "recovery-point-offset-checkpoint").write_bytes(saved)  # as if it crashed before the checkpoints
    with Store.open(data_dir) as store:
        store.create_topic("t")
        assert read_checkpoint(data_dir / "recovery-point-offset-checkpoint").get(("t", 0)) is None
        store.append("t", changelog(1), partition=0)
        segment = segment_files(data_dir, "t", 0)[0]
        with segment.open("ab") as file:  # the writer's next batch, half written as a reader looks
            file.write(segment.read_bytes()[:40])
        with Store.open(data_dir, read_only=True) as reader:
            assert len(reader.read("t", 0)) == 1


def test_a_partition_folder_whose_topic_json_was_lost_is_kept_and_named_not_deleted(
        data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every writer's open (any command, 'topics list' too) removed each partition folder without a topic, to
    finish a crashed deletion: one whose topic.json was lost went with every message in it, and so did a folder of
    the operator's named like one (backup-2026). Now only a deletion's folders (its marker is there) and a
    creation's (nothing written yet) go; the rest is kept and named, and creating its topic over it is refused."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", changelog(10), partition=0)
    metadata = data_dir / "__topics" / "t" / "topic.json"
    saved = metadata.read_bytes()
    metadata.unlink()
    (data_dir / "backup-2026").mkdir()
    (data_dir / "backup-2026" / "notes.txt").write_text("mine")
    (data_dir / "half-0").mkdir()  # a creation that crashed before writing its topic.json
    with caplog.at_level(logging.WARNING, logger="storage.catalogue"), Store.open(data_dir) as store:
        assert store.list_topics() == []
        with pytest.raises(TopicExistsError, match=r"t-0 holds data but no topic .* Nothing was created"):
            store.create_topic("t")
    folders = sorted(path.name for path in data_dir.iterdir() if path.is_dir() and not path.name.startswith("__"))
    assert folders == ["backup-2026", "t-0"]
    assert f"{data_dir / 't-0'} holds data, but no topic of that name exists" in caplog.text
    metadata.write_bytes(saved)
    with Store.open(data_dir) as store:
        assert store.read("t", 0)["value"].to_pylist() == changelog(10)["value"].to_pylist()


def test_a_deletion_that_crashed_after_its_first_step_is_finished_by_the_next_open(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", partitions=2)
        store.append("t", changelog(10), partition=0)
    topic_folder = data_dir / "__topics" / "t"
    (topic_folder / "topic.json").rename(topic_folder / "topic.json.deleting")  # the deletion's first step
    with Store.open(data_dir) as store:
        assert store.list_topics() == []
        assert not any(path.exists() for path in (data_dir / "t-0", data_dir / "t-1", topic_folder))
        store.create_topic("t")
        assert store.read("t", 0).num_rows == 0
        store.delete_topic("t")
        assert not topic_folder.exists() and not (data_dir / "t-0").exists()


def test_a_creation_over_an_unfinished_deletion_finishes_it_beyond_its_own_partitions(data_dir: Path) -> None:
    """A deletion that failed half-way in a running process (its marker and some folders left) and a creation of
    the same name with fewer partitions: the old partitions past the new count kept the deleted topic's messages,
    with the marker that said to remove them gone."""
    with Store.open(data_dir) as store:
        store.create_topic("t", partitions=4)
        for partition in range(4):
            store.append("t", changelog(10), partition=partition)
    with Store.open(data_dir) as store:
        topic_folder = data_dir / "__topics" / "t"
        (topic_folder / "topic.json").rename(topic_folder / "topic.json.deleting")  # the deletion's first step
        shutil.rmtree(data_dir / "t-3")  # and its last folder, then it failed
        store.create_topic("t", partitions=2)
        assert [store.read("t", partition).num_rows for partition in range(2)] == [0, 0]
    assert sorted(path.name for path in data_dir.glob("t-*")) == ["t-0", "t-1"]
    with Store.open(data_dir) as store:  # an open finds no orphan, and the new partitions start empty
        assert [store.read("t", partition).num_rows for partition in range(2)] == [0, 0]
    entries = (data_dir / "recovery-point-offset-checkpoint").read_text().splitlines()[2:]
    assert not [entry for entry in entries if entry.split()[:2] in (["t", "2"], ["t", "3"])]


def test_a_partition_that_did_not_open_fails_alike_until_its_files_change(data_dir: Path) -> None:
    """A damaged partition is opened again only once its files change: a client retrying it (a Kafka consumer
    every 100 ms) walked its segments and rewrote its index files on every request. Each failure is a fresh error,
    so the notes retention adds do not pile up on one object. Restored from a copy that keeps the old
    modification time, it opens."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        for _ in range(5):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=0)
    damaged = sorted((data_dir / "t-0").glob("*.log"))[-1]
    intact, modified = damaged.read_bytes(), damaged.stat().st_mtime_ns
    flipped = bytearray(intact)
    flipped[len(flipped) // 2] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    os.utime(damaged, ns=(modified, modified))  # bit rot: the bytes change, the modification time does not
    with Store.open(data_dir) as store:
        errors = []
        for _ in range(3):
            with pytest.raises(CorruptSegmentError) as raised:
                store.partition_log("t", 0)
            errors.append(raised.value)
            if len(errors) == 1:  # the failed open rewrote the indexes once; no retry writes them again
                indexes = {path: path.stat().st_mtime_ns for path in (data_dir / "t-0").glob("*index")}
        assert [str(error) for error in errors] == [str(errors[0])] * 3 and str(damaged) in str(errors[0])
        assert {path: path.stat().st_mtime_ns for path in indexes} == indexes
        for _ in range(2):
            with pytest.raises(CorruptSegmentError) as retention:
                store.enforce_retention("t")
            assert len(retention.value.__notes__) == 1
        damaged.write_bytes(intact)  # restored in place by cp -p: same file, size and modification time
        os.utime(damaged, ns=(modified, modified))
        assert store.partition_log("t", 0).end_offset == 50


def test_known_damaged_partitions_are_those_that_failed_to_open_while_their_folder_is_unchanged(
        data_dir: Path) -> None:
    """It opens nothing, so a damaged partition is known only after an open failed; a flush of another partition,
    which rewrites the shared checkpoints, does not clear it; a repair of its folder does, before any open."""
    with Store.open(data_dir) as store:
        store.create_topic("t", partitions=2)
        for partition in (0, 1):
            store.append("t", [(b"k", b"v")] * 3, partition=partition)
    [damaged] = (data_dir / "t-1").glob("*.log")
    intact = damaged.read_bytes()
    flipped = bytearray(intact)
    flipped[len(flipped) // 2] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    with Store.open(data_dir) as store:
        assert store.known_damaged_partitions("t") == frozenset()
        with pytest.raises(CorruptSegmentError):
            store.read("t", 1)
        assert store.known_damaged_partitions("t") == {1}
        store.append("t", [(b"k", b"w")], partition=0)
        store.flush("t")
        assert store.known_damaged_partitions("t") == {1}
        damaged.write_bytes(intact)
        assert store.known_damaged_partitions("t") == frozenset()
        assert len(store.read("t", 1)) == 3
