"""Defects found by reading the Spark paths as an outside checker would, each pinned by the smallest test that
shows it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from compactor import Compactor
from storage import Store
from storage.errors import LedgerviewError
from storage.faults import CRASH_AT_ENV
from streaming import register_views
from streaming.compaction import InvalidTaskBytesError, compact_with_spark
from streaming.kafka_source import KafkaSource
from streaming.sink import SinkOptions, stage_task_rows
from streaming.sink_commit import SinkFolders, SinkRecord, commit_batch
from streaming.views import ViewNameClashError
from tests.kafka_support import Running, kafka

__all__ = ["kafka"]

pytestmark = pytest.mark.spark

TOPIC = "events"


def read(spark: SparkSession, data: Path, **options: str) -> DataFrame:
    reader = spark.read.format("ledgerview").option("topic", TOPIC)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(data))


def test_a_key_lookup_in_read_compacted_stops_at_ending_offsets(spark: SparkSession, tmp_path: Path) -> None:
    """The ledger answered through its key index gave rows past endingOffsets that the scan leaves out."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [(f"k{i}", f"v{i}") for i in range(10)])
        Compactor(store).compact(TOPIC)
    frame = read(spark, data, view="read_compacted", endingOffsets='{"events": {"0": 3}}')
    assert sorted(row.offset for row in frame.collect()) == [0, 1, 2]
    assert frame.where("key = 'k7'").collect() == []
    assert [row.offset for row in frame.where("key IN ('k1', 'k7')").collect()] == [1]


@pytest.mark.parametrize("view", ["raw", "read_compacted", "compacted"])
def test_offset_bounds_at_the_largest_long_are_bounds(spark: SparkSession, tmp_path: Path, view: str) -> None:
    """``offset <= 9223372036854775807`` (Long.MaxValue) failed every task with an OverflowError."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [(f"k{i}", f"v{i}") for i in range(5)])
    frame = read(spark, data, view=view)
    assert frame.where("offset <= 9223372036854775807").count() == 5
    assert frame.where("offset > 9223372036854775807").count() == 0
    assert frame.where("offset = 9223372036854775807").count() == 0


def test_register_views_refuses_names_that_two_views_would_take(spark: SparkSession, tmp_path: Path) -> None:
    """Topics ``a`` and ``a_raw``: the raw view of ``a`` was silently replaced by the table of ``a_raw``."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("a")
        store.create_topic("a_raw")
    with pytest.raises(ViewNameClashError, match=r"raw view of topic 'a' and the table of topic 'a_raw' 'a_raw'"):
        register_views(spark, data)
    assert register_views(spark, data, raw_suffix="__raw") == ["a", "a__raw", "a_raw", "a_raw__raw"]
    assert [row.n for row in spark.sql("SELECT count(*) AS n FROM a_raw").collect()] == [0]


def run_stream(spark: SparkSession, data: Path, checkpoint: Path, **options: str) -> list[bytes]:
    """The values a ``trigger(availableNow=True)`` run of the stream reads from its checkpoint on."""
    reader = spark.readStream.format("ledgerview").option("path", str(data)).option("topic", TOPIC) \
        .option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    values: list[bytes] = []
    query = reader.load().writeStream.foreachBatch(lambda batch, _: values.extend(r.value for r in batch.collect())) \
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return sorted(values)


def recreate(data: Path, values: list[str]) -> None:
    with Store.open(data) as store:
        store.delete_topic(TOPIC)
        store.create_topic(TOPIC)
        store.append(TOPIC, [("k", value) for value in values])


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_a_stream_over_a_topic_created_again_fails_or_reads_the_new_log_from_its_start(
        spark: SparkSession, tmp_path: Path, view: str) -> None:
    """The query's offsets named the old log: it read nothing until the new log passed them, then skipped the new
    log's first messages."""
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("k", f"old{i}") for i in range(10)])
    assert len(run_stream(spark, data, checkpoint, view=view)) == 10
    recreate(data, ["a0", "a1", "a2"])
    with pytest.raises(StreamingQueryException, match=r"Data loss in events-0: the query read up to offset 10, but "
                                                      r"the log now ends at 3: the topic was deleted and created"):
        run_stream(spark, data, checkpoint, view=view)
    assert run_stream(spark, data, checkpoint, view=view, failOnDataLoss="false") == [b"a0", b"a1", b"a2"]
    with Store.open(data) as store:
        store.append(TOPIC, [("k", f"b{i:02d}") for i in range(12)])
    assert run_stream(spark, data, checkpoint, view=view) == [f"b{i:02d}".encode() for i in range(12)]


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_a_stream_over_a_topic_created_again_past_its_position_fails_or_reads_the_new_log_from_its_start(
        spark: SparkSession, tmp_path: Path, view: str) -> None:
    """The new log had passed the query's offsets when it next planned: its messages below them were skipped
    unsaid."""
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("k", f"old{i}") for i in range(3)])
    assert len(run_stream(spark, data, checkpoint, view=view)) == 3
    recreate(data, [f"a{i}" for i in range(5)])
    with pytest.raises(StreamingQueryException, match=r"Data loss in events: the query's offsets belong to the "
                                                      r"topic created at .*, but it was deleted and created again"):
        run_stream(spark, data, checkpoint, view=view)
    assert run_stream(spark, data, checkpoint, view=view, failOnDataLoss="false") == [f"a{i}".encode()
                                                                                       for i in range(5)]
    with Store.open(data) as store:
        store.append(TOPIC, [("k", "b0")])
    assert run_stream(spark, data, checkpoint, view=view) == [b"b0"]


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_read_compacted_from_an_offset_retention_deleted_is_data_loss(spark: SparkSession, tmp_path: Path,
                                                                      fail_on_data_loss: str) -> None:
    """failOnDataLoss was ignored by view=read_compacted: a task failed with OffsetOutOfRangeError either way."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, config={"segment.bytes": "2048"})
        store.append(TOPIC, [("k", f"v{i}") for i in range(100)])
        store.delete_records(TOPIC, 0, 50)
    frame = read(spark, data, view="read_compacted", failOnDataLoss=fail_on_data_loss,
                 startingOffsets='{"events": {"0": 20}}')
    if fail_on_data_loss == "true":
        with pytest.raises(PySparkException, match=r"DataLossError: Data loss in events-0: the query needs offsets "
                                                   r"from 20, but retention deleted everything below 50"):
            frame.collect()
    else:
        assert sorted(row.offset for row in frame.collect()) == list(range(50, 100))


def test_the_compacted_stream_from_earliest_starts_a_partition_never_compacted_at_its_log_start(
        spark: SparkSession, tmp_path: Path) -> None:
    """Earliest was offset 0 on every partition, so a partition with no ledger whose start retention had moved
    failed the query's first batch with DataLossError (the raw view's earliest starts at the log start)."""
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    with Store.open(data) as store:
        store.create_topic(TOPIC, config={"segment.bytes": "2048"})
        store.append(TOPIC, [(f"k{i % 10}", f"v{i:03d}") for i in range(100)])
        store.delete_records(TOPIC, 0, 50)
    assert run_stream(spark, data, checkpoint, view="compacted") == [f"v{i:03d}".encode() for i in range(50, 100)]
    with Store.open(data) as store:
        Compactor(store).compact(TOPIC)
        store.append(TOPIC, [("k1", "w")])
    assert run_stream(spark, data, checkpoint, view="compacted") == [b"w"]


COMMIT_IN_CHILD = """
import sys
from storage import Store
from storage.errors import LedgerviewError
from storage.faults import CRASH_AT_ENV
from streaming.sink_commit import commit_batch
with Store.open(sys.argv[1]) as store:
    commit_batch(store, sys.argv[2], "query", 0, {sys.argv[3]: int(sys.argv[4])})
"""


def commit_in_child(data: Path, staged: dict[str, int], crash_at: str) -> None:
    """``commit_batch`` of batch 0 in a child process that the crash point kills (SIGKILL)."""
    [(name, checksum)] = staged.items()
    env = {**os.environ, CRASH_AT_ENV: crash_at}
    ended = subprocess.run([sys.executable, "-c", COMMIT_IN_CHILD, str(data), TOPIC, name, str(checksum)],
                           env=env, capture_output=True, timeout=120, check=False)
    assert ended.returncode == -signal.SIGKILL, ended.stderr.decode()[-2000:]


def test_a_commit_resumed_twice_still_checks_its_pending_file_against_its_crc(tmp_path: Path) -> None:
    """A resumed commit that recorded a new start for a partition wrote the record without the pending files'
    CRC-32C, so after one more crash a pending file damaged by a power loss was trusted and its wrong bytes
    appended (or its rows could not be read), where the replay's files hold the right rows."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
    rows = pa.table({"key": [f"k{i}" for i in range(20)], "value": [f"value{i:02d}" for i in range(20)]})
    options = SinkOptions(str(data), TOPIC)
    staged = stage_task_rows(options, "query", 0, iter(rows.to_batches())).files
    commit_in_child(data, staged, "sink.commit.after_pending_record")
    with Store.open(data) as store:  # the commit's append died after its first 5 rows reached the log
        store.append(TOPIC, rows.slice(0, 5), partition=0)
    commit_in_child(data, staged, "sink.commit.after_partition_append")  # resumed from row 5, died again
    with Store.open(data) as store:
        folders = SinkFolders.of(store, TOPIC, "query")
    assert SinkRecord.read(folders.record).pending_checksums == tuple(staged.values())
    pending = folders.pending / next(iter(staged))
    content = pending.read_bytes()  # a power loss: a block of the unsynced file comes back as zeros
    pending.write_bytes(content.replace(b"value07", bytes(7)))
    replayed = stage_task_rows(options, "query", 0, iter(rows.to_batches())).files
    with Store.open(data) as store:
        assert commit_batch(store, TOPIC, "query", 0, replayed)
        assert store.read(TOPIC, 0).column("value").to_pylist() == rows.column("value").cast(pa.binary()).to_pylist()


def test_a_write_to_a_path_that_holds_no_store_says_so_and_creates_nothing(spark: SparkSession,
                                                                            tmp_path: Path) -> None:
    """A mistyped path was made an empty data folder, then the write failed with 'Unknown topic'."""
    missing = tmp_path / "mistyped"
    frame = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(PySparkException, match=f"No ledgerview data folder at {missing}"):
        frame.write.format("ledgerview").option("path", str(missing)).option("topic", TOPIC).mode("append").save()
    assert not missing.exists()


def test_a_stream_starting_past_the_end_of_a_partition_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """startingOffsets past a partition's end was taken, and the query waited for the log to reach it (with the
    check of a log that went back, it would have been reported as a topic created again)."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("k", f"v{i}") for i in range(10)])
    with pytest.raises(StreamingQueryException, match=r"Offset 50 is outside events-0, which holds offsets 0 to 10"):
        run_stream(spark, data, tmp_path / "checkpoint", startingOffsets='{"events": {"0": 50}}')


@pytest.mark.slow
@pytest.mark.parametrize(("starting", "message"), [
    ('{"orders": {"0": 1}}', r"an offset for every partition of orders \(0, 1; missing \[1\]"),
    ('{"orders": {"0": 1, "1": -2}, "other": {"0": 0}}', r"JSON naming the subscribed topics only \(orders; not other"),
    ('{"orders": {"0": 9, "1": -2}}', r"an offset of orders-0 up to its end, 3"),
])
def test_the_kafka_source_refuses_starting_offsets_that_leave_out_or_name_the_wrong_partitions(
        spark: SparkSession, kafka: Running, tmp_path: Path, starting: str, message: str) -> None:
    """A partition the JSON left out started at latest in silence, a topic not subscribed was ignored, and an
    offset past the end was taken: the messages below it were skipped once they came."""
    kafka.store.create_topic("orders", partitions=2)
    kafka.store.append("orders", [(b"k", b"v%d" % i) for i in range(3)], partition=0)
    spark.dataSource.register(KafkaSource)
    frame = spark.readStream.format("ledgerview-kafka").option("kafka.bootstrap.servers", kafka.bootstrap) \
        .option("subscribe", "orders").option("startingOffsets", starting).load()
    query = frame.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "checkpoint")) \
        .trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException, match=message):
        query.awaitTermination()


@pytest.mark.parametrize("view", ["raw", "read_compacted"])
def test_ending_offsets_before_starting_offsets_are_refused(spark: SparkSession, tmp_path: Path, view: str) -> None:
    """The read returned no rows, as if the range were empty."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("k", f"v{i}") for i in range(10)])
    frame = read(spark, data, view=view, startingOffsets='{"events": {"0": 6}}', endingOffsets='{"events": {"0": 4}}')
    with pytest.raises(PySparkException, match=r"Option endingOffsets=4 is not valid .*allowed: an offset of events-0 "
                                               r"at or after its startingOffsets, 6"):
        frame.collect()
    assert read(spark, data, view=view, startingOffsets='{"events": {"0": 6}}',
                endingOffsets='{"events": {"0": 6}}').collect() == []


def test_register_views_on_a_path_that_holds_no_store_says_so_and_creates_nothing(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    """It opened the folder for writing: a mistyped path was made an empty data folder, and no view registered."""
    missing = tmp_path / "mistyped"
    with pytest.raises(LedgerviewError, match=f"No ledgerview data folder at {missing}"):
        register_views(spark, missing)
    assert not missing.exists()


def test_a_table_planned_before_the_first_compaction_reads_as_planned_when_one_publishes(
        spark: SparkSession, tmp_path: Path) -> None:
    """A partition with no ledger at planning read whatever ledger the cursor named when its task ran, so a
    compaction published in between gave the values of messages appended after planning (a partition compacted
    at planning is pinned to its ledger). Spark reuses a loaded DataFrame's plan, so its second query reads
    the first one's plan after the compaction."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("a", "1"), ("b", "1")])
    table = read(spark, data)
    assert sorted((row.key, row.value) for row in table.collect()) == [(b"a", b"1"), (b"b", b"1")]
    with Store.open(data) as store:
        store.append(TOPIC, [("a", "2"), ("b", None), ("c", "1")])
        Compactor(store).compact(TOPIC)
    assert sorted((row.key, row.value) for row in table.collect()) == [(b"a", b"1"), (b"b", b"1")]
    assert sorted((row.key, row.value) for row in read(spark, data).collect()) == [(b"a", b"2"), (b"c", b"1")]


def test_read_compacted_reads_the_ledger_planned_on_when_a_compaction_publishes_before_its_tasks(
        spark: SparkSession, tmp_path: Path) -> None:
    """Its tasks opened the ledger current when they ran, cut at the planned end: a key whose latest message was
    appended after planning was in neither part of the answer. Spark reuses a loaded DataFrame's plan, so a
    second query of it reads the first one's plan after the compaction."""
    data = tmp_path / "data"

    def keys(frame: DataFrame) -> list[tuple[int, bytes]]:
        return sorted((row.offset, row.key) for row in frame.collect())

    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("a", "1"), ("b", "1")])
    never_compacted = read(spark, data, view="read_compacted")
    assert keys(never_compacted) == [(0, b"a"), (1, b"b")]
    with Store.open(data) as store:
        Compactor(store).compact(TOPIC)
        store.append(TOPIC, [("c", "1")])
    compacted = read(spark, data, view="read_compacted")
    assert keys(compacted) == [(0, b"a"), (1, b"b"), (2, b"c")]
    with Store.open(data) as store:
        store.append(TOPIC, [("a", "2"), ("c", "2")])
        Compactor(store).compact(TOPIC)
    assert keys(never_compacted) == [(0, b"a"), (1, b"b")]
    assert keys(compacted) == [(0, b"a"), (1, b"b"), (2, b"c")]


@pytest.mark.slow
def test_the_kafka_source_over_a_topic_created_again_fails_or_reads_the_new_log_from_its_start(
        spark: SparkSession, kafka: Running, tmp_path: Path) -> None:
    """As the ledgerview source did: the query read nothing until the new log passed its old offsets, then
    skipped the new log's first messages."""
    spark.dataSource.register(KafkaSource)
    checkpoint = tmp_path / "checkpoint"

    def run(**options: str) -> list[bytes]:
        reader = spark.readStream.format("ledgerview-kafka").option("kafka.bootstrap.servers", kafka.bootstrap) \
            .option("subscribe", "orders").option("startingOffsets", "earliest")
        for name, value in options.items():
            reader = reader.option(name, value)
        values: list[bytes] = []
        query = reader.load().writeStream.foreachBatch(lambda b, _: values.extend(r.value for r in b.collect())) \
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        query.awaitTermination()
        return sorted(values)

    kafka.store.create_topic("orders")
    kafka.store.append("orders", [(b"k", b"old%d" % i) for i in range(5)])
    assert len(run()) == 5
    kafka.store.delete_topic("orders")
    kafka.store.create_topic("orders")
    kafka.store.append("orders", [(b"k", b"new%d" % i) for i in range(2)])
    with pytest.raises(StreamingQueryException, match=r"Data loss in orders-0: the query read up to offset 5, but "
                                                      r"the log now ends at 2"):
        run()
    assert run(failOnDataLoss="false") == [b"new0", b"new1"]


@pytest.mark.parametrize("view", ["raw", "read_compacted", "compacted"])
def test_negated_filters_are_left_to_spark(spark: SparkSession, tmp_path: Path, view: str) -> None:
    """``key != 'k1'`` (Spark pushes Not(EqualTo)) failed the query with an AttributeError in pushFilters."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [(f"k{i % 3}", f"v{i}") for i in range(6)])
    for condition in ("key != 'k1'", "offset NOT IN (1, 2)", "NOT (partition = 0 AND offset < 4)"):
        rows = sorted(row.offset for row in read(spark, data, view=view).where(condition).collect())
        unpushed = read(spark, data, view=view).localCheckpoint().where(condition)
        assert rows == sorted(row.offset for row in unpushed.collect()), condition


@pytest.mark.parametrize("task_bytes", [0, -1])
def test_compact_with_spark_refuses_task_bytes_below_one(spark: SparkSession, tmp_path: Path, task_bytes: int) -> None:
    """0 fell back to the topic's budget unsaid, and a negative size cut phase one into a range per segment; the
    CLI refuses both, and so does the API, before it reads anything."""
    with pytest.raises(InvalidTaskBytesError, match=rf"task_bytes={task_bytes} .*allowed: a positive number of bytes"):
        compact_with_spark(spark, str(tmp_path / "tier"), TOPIC, task_bytes=task_bytes)
