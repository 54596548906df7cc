"""The streaming source: over the raw log, availableNow with maxOffsetsPerTrigger, starting offsets, resuming from
a checkpoint, and data loss reported per failOnDataLoss when retention deleted offsets the query needs; over the
compacted view, the snapshot then every change, resumed across a compaction; options refused as Kafka's source
refuses them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from compactor import Compactor
from storage import Store
from tests.spark.inputs import numbered_rows

pytestmark = pytest.mark.spark

TOPIC = "events"


def stream(spark: SparkSession, data: Path, **options: str) -> DataFrame:
    reader = spark.readStream.format("ledgerview").option("path", str(data)).option("topic", TOPIC)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_available_now(frame: DataFrame, checkpoint: Path) -> list[tuple[int, list[tuple[int, int, bytes]]]]:
    """Run to the end with trigger(availableNow=True); each micro-batch's (partition, offset, value) rows."""
    batches: list[tuple[int, list[tuple[int, int, bytes]]]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, [(r.partition, r.offset, r.value) for r in batch.collect()]))

    query = frame.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)) \
        .trigger(availableNow=True).start()
    query.awaitTermination()
    return batches


def test_available_now_reads_everything_in_batches_of_at_most_the_limit_then_resumes(
        spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=3)
        store.append(TOPIC, numbered_rows(1_000))
    checkpoint = tmp_path / "checkpoint"
    batches = run_available_now(stream(spark, data, startingOffsets="earliest", maxOffsetsPerTrigger="300"),
                                checkpoint)
    sizes = [len(rows) for _, rows in batches if rows]
    assert sizes == [300, 300, 300, 100]
    values = sorted(value.decode() for _, rows in batches for _, _, value in rows)
    assert values == sorted(f"n{i}" for i in range(1_000))

    with Store.open(data) as store:
        store.append(TOPIC, numbered_rows(50, start=1_000))
    resumed = run_available_now(stream(spark, data, startingOffsets="earliest", maxOffsetsPerTrigger="300"),
                                checkpoint)
    assert sorted(value.decode() for _, rows in resumed for _, _, value in rows) == sorted(
        f"n{i}" for i in range(1_000, 1_050))


def test_starting_offsets_latest_and_json(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=2)
        store.append(TOPIC, numbered_rows(100), partition=0)
        store.append(TOPIC, numbered_rows(100, start=100), partition=1)
    from_json = run_available_now(stream(spark, data, startingOffsets='{"events": {"0": 90, "1": -1}}'),
                                  tmp_path / "c1")
    assert sorted(row for _, rows in from_json for row in rows) == [(0, o, f"n{o}".encode()) for o in range(90, 100)]
    latest = run_available_now(stream(spark, data, startingOffsets="latest"), tmp_path / "c2")
    assert [row for _, rows in latest for row in rows] == []


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_retention_below_the_querys_position_is_reported_or_skipped(spark: SparkSession, tmp_path: Path,
                                                                    fail_on_data_loss: bool) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=1, config={"segment.bytes": "2048"})
        store.append(TOPIC, numbered_rows(100))
    checkpoint = tmp_path / "checkpoint"
    options = {"startingOffsets": "earliest", "failOnDataLoss": str(fail_on_data_loss).lower()}
    first = run_available_now(stream(spark, data, **options), checkpoint)
    assert sum(len(rows) for _, rows in first) == 100
    with Store.open(data) as store:
        store.append(TOPIC, numbered_rows(100, start=100))
        store.delete_records(TOPIC, 0, 150)  # the query stopped at 100: 100..149 are lost
    if fail_on_data_loss:
        with pytest.raises(StreamingQueryException, match=r"Data loss in events-0: .* from 100, .* below 150"):
            run_available_now(stream(spark, data, **options), checkpoint)
    else:
        after = run_available_now(stream(spark, data, **options), checkpoint)
        assert sorted(offset for _, rows in after for _, offset, _ in rows) == list(range(150, 200))


def test_the_compacted_view_streams_the_snapshot_then_every_change_across_compactions(
        spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")])
        Compactor(store).compact(TOPIC)
        store.append(TOPIC, [("b", None)])
    checkpoint = tmp_path / "checkpoint"
    first = run_available_now(stream(spark, data, startingOffsets="earliest", view="compacted"), checkpoint)
    assert [(offset, value) for _, rows in first for _, offset, value in rows] == [
        (1, b"1"), (2, b"2"), (3, b"1"), (4, None)]
    with Store.open(data) as store:
        store.append(TOPIC, [("c", None), ("a", "3")])
        Compactor(store).compact(TOPIC)  # the new ledger holds only a: the stream still gets c's tombstone
    resumed = run_available_now(stream(spark, data, startingOffsets="earliest", view="compacted"), checkpoint)
    assert [(offset, value) for _, rows in resumed for _, offset, value in rows] == [(5, None), (6, b"3")]


@pytest.mark.parametrize(("options", "message"), [
    ({"maxOffsetPerTrigger": "5"}, r"Unknown option maxoffsetpertrigger for spark\.readStream.*Valid options: path"),
    ({"startingOffsets": '{"events": {"0": 5}}'}, r"an offset for every partition of events \(0, 1; missing \[1\]"),
])
def test_bad_stream_options_fail_the_query_saying_what_is_allowed(spark: SparkSession, tmp_path: Path,
                                                                  options: dict[str, str], message: str) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=2)
        store.append(TOPIC, numbered_rows(20))
    with pytest.raises((StreamingQueryException, PySparkException), match=message) as raised:
        run_available_now(stream(spark, data, **options), tmp_path / "checkpoint")
    assert "During handling of the above exception" not in str(raised.value)  # our error alone, no follow-on


def test_a_raw_micro_batch_of_one_large_partition_spreads_over_segment_ranges(spark: SparkSession,
                                                                              tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=1, config={"segment.bytes": "4096"})
        store.append(TOPIC, numbered_rows(3_000))
    seen: list[tuple[int, list[int]]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        seen.append((batch.rdd.getNumPartitions(), sorted(row.offset for row in batch.collect())))

    query = stream(spark, data, startingOffsets="earliest", maxPartitionBytes="16384").writeStream \
        .foreachBatch(collect).option("checkpointLocation", str(tmp_path / "checkpoint")) \
        .trigger(availableNow=True).start()
    query.awaitTermination()
    tasks, offsets = seen[0]
    assert offsets == list(range(3_000)) and tasks > 2  # one partition, read by several tasks, each row once
