"""The Kafka ingest source's offsets on a restart from its checkpoint, against the endpoint on loopback: partitions
the checkpoint does not hold are read from their beginning, and offsets the cluster deleted before the query read
them are reported per failOnDataLoss (as the ledgerview source and Spark's Kafka source do), never skipped in
silence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from streaming.kafka_source import KafkaSource
from tests.kafka_support import Running, kafka

__all__ = ["kafka"]

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def run_available_now(spark: SparkSession, running: Running, checkpoint: Path, **options: str) -> list[Any]:
    """Run from ``checkpoint`` to the end with trigger(availableNow=True); the (topic, partition, offset) rows."""
    spark.dataSource.register(KafkaSource)
    reader = spark.readStream.format("ledgerview-kafka").option("kafka.bootstrap.servers", running.bootstrap)
    for name, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(name, value)
    delivered: list[Any] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        delivered.extend((row.topic, row.partition, row.offset) for row in batch.collect())

    query = (reader.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return sorted(delivered)


def test_partitions_the_checkpoint_lacks_are_read_from_their_beginning(spark: SparkSession, kafka: Running,
                                                                       tmp_path: Path) -> None:
    kafka.store.create_topic("first")
    kafka.store.append("first", [(b"k", b"v%d" % i) for i in range(5)])
    checkpoint = tmp_path / "checkpoint"
    assert run_available_now(spark, kafka, checkpoint, subscribe="first") == [("first", 0, i) for i in range(5)]
    kafka.store.create_topic("second", partitions=2)
    for partition in range(2):
        kafka.store.append("second", [(b"k", b"v%d" % i) for i in range(3)], partition=partition)
    kafka.store.append("first", [(b"k", b"late")])
    resumed = run_available_now(spark, kafka, checkpoint, subscribe="first,second")
    assert resumed == [("first", 0, 5)] + [("second", p, i) for p in range(2) for i in range(3)]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_offsets_deleted_before_the_query_read_them_are_reported_or_skipped(
        spark: SparkSession, kafka: Running, tmp_path: Path, fail_on_data_loss: bool) -> None:
    kafka.store.create_topic("source", config={"segment.bytes": "2048"})
    kafka.store.append("source", [(b"k", b"v%d" % i) for i in range(100)])
    checkpoint = tmp_path / "checkpoint"
    options = {"subscribe": "source", "failOnDataLoss": str(fail_on_data_loss).lower()}
    assert len(run_available_now(spark, kafka, checkpoint, **options)) == 100
    kafka.store.append("source", [(b"k", b"v%d" % i) for i in range(100, 200)])
    kafka.store.delete_records("source", 0, 150)  # the query stopped at 100: 100..149 are lost
    if fail_on_data_loss:
        with pytest.raises(StreamingQueryException, match=r"Data loss in source-0: .* from 100, .* below 150"):
            run_available_now(spark, kafka, checkpoint, **options)
    else:
        after = run_available_now(spark, kafka, checkpoint, **options)
        assert after == [("source", 0, offset) for offset in range(150, 200)]
