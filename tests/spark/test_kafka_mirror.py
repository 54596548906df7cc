"""The Kafka ingest source (streaming/kafka_source.py) reading from the endpoint on loopback. A query stopped
mid-way and restarted from its checkpoint delivers every message exactly once, in micro-batches of at most
maxOffsetsPerTrigger: into Spark's file sink, and into the ledgerview sink, which mirrors a Kafka topic into
another store with the same partitions and offsets (DESIGN.md invariant 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from storage import Store
from streaming.kafka_source import KafkaSource
from tests.kafka_support import Running, kafka, wait_for

__all__ = ["kafka"]

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _source(spark: SparkSession, running: Running) -> Any:
    spark.dataSource.register(KafkaSource)
    return (spark.readStream.format("ledgerview-kafka").option("kafka.bootstrap.servers", running.bootstrap)
            .option("subscribe", "source").option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "120").load())


def _fill(running: Running) -> None:
    running.store.create_topic("source", partitions=2)
    for partition in range(2):
        running.store.append("source", [(b"k%d" % i, b"p%d-%d" % (partition, i)) for i in range(200)],
                             partition=partition)


def _run_stopped_then_restarted(running: Running, start: Any) -> Any:
    """Start with a processing-time trigger, stop after two micro-batches, append one message, then run again
    from the same checkpoint with availableNow; returns the second query."""
    first = start(available_now=False)
    wait_for(lambda: first.lastProgress and first.lastProgress["batchId"] >= 1, "two micro-batches of the first run")
    first.stop()
    running.store.append("source", [(b"late", b"p1-late")], partition=1)
    second = start(available_now=True)
    second.awaitTermination(300)
    return second


def _triggered(writer: Any, available_now: bool) -> Any:
    return (writer.trigger(availableNow=True) if available_now
            else writer.trigger(processingTime="200 milliseconds")).start()


def test_restarted_source_delivers_each_message_once_to_the_file_sink(spark: SparkSession, kafka: Running,
                                                                        tmp_path: Path) -> None:
    _fill(kafka)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(available_now: bool) -> Any:
        writer = (_source(spark, kafka).selectExpr("partition", "offset", "value").writeStream.format("parquet")
                  .option("path", str(output)).option("checkpointLocation", str(checkpoint)))
        return _triggered(writer, available_now)

    second = _run_stopped_then_restarted(kafka, start)
    delivered = sorted((row["partition"], row["offset"], row["value"]) for row in pq.read_table(output).to_pylist())
    expected = sorted([(p, i, b"p%d-%d" % (p, i)) for p in range(2) for i in range(200)] + [(1, 200, b"p1-late")])
    assert delivered == expected
    sizes = [progress["numInputRows"] for progress in second.recentProgress if progress["numInputRows"]]
    assert sizes and max(sizes) <= 120


def test_kafka_topic_mirrored_into_ledgerview_exactly_once(spark: SparkSession, kafka: Running,
                                                           tmp_path: Path) -> None:
    _fill(kafka)
    mirror, checkpoint = tmp_path / "mirror", tmp_path / "checkpoint"
    with Store.open(mirror) as store:
        store.create_topic("copy", partitions=2)

    def start(available_now: bool) -> Any:
        writer = (_source(spark, kafka).select("key", "value", "timestamp", "headers", "partition")
                  .writeStream.format("ledgerview").option("path", str(mirror)).option("topic", "copy")
                  .option("checkpointLocation", str(checkpoint)))
        return _triggered(writer, available_now)

    _run_stopped_then_restarted(kafka, start)
    with Store.open(mirror) as store:
        for partition in range(2):
            copied = store.read("copy", partition).select(["offset", "timestamp", "key", "value"])
            original = kafka.store.read("source", partition).select(["offset", "timestamp", "key", "value"])
            assert copied.to_pylist() == original.to_pylist()
