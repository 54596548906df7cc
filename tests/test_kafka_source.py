"""The Kafka ingest source (streaming/kafka_source.py) reading from the endpoint on loopback: a query stopped
mid-way and restarted from its checkpoint delivers every message exactly once (Spark's file sink is idempotent
by batch, so duplicates or gaps would show), in micro-batches of at most maxOffsetsPerTrigger."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from streaming.kafka_source import KafkaSource, KafkaSourceOptionError, SourceOptions
from tests.kafka_support import Running, kafka, wait_for

__all__ = ["kafka"]


def test_options_are_checked_with_clear_errors() -> None:
    with pytest.raises(KafkaSourceOptionError, match=r"kafka\.bootstrap\.servers"):
        SourceOptions.parse({"subscribe": "t"})
    with pytest.raises(KafkaSourceOptionError, match="startingOffsets"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "{bad"})
    with pytest.raises(KafkaSourceOptionError, match="maxOffsetsPerTrigger"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"})
    parsed = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b",
                                  "startingOffsets": '{"a": {"0": 5, "1": -2}}'})
    assert parsed.topics == ("a", "b") and parsed.starting_offsets == {"a": {"0": 5, "1": -2}}


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("ledgerview-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(KafkaSource)
    yield session


def _start(spark: Any, running: Running, output: Path, checkpoint: Path, *, available_now: bool) -> Any:
    stream = (spark.readStream.format("ledgerview-kafka").option("kafka.bootstrap.servers", running.bootstrap)
              .option("subscribe", "source").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "120").load()
              .selectExpr("partition", "offset", "key", "value")
              .writeStream.format("parquet").option("path", str(output))
              .option("checkpointLocation", str(checkpoint)))
    return stream.trigger(availableNow=True).start() if available_now else stream.trigger(
        processingTime="200 milliseconds").start()


@pytest.mark.spark
@pytest.mark.slow
def test_source_restarted_mid_way_delivers_each_message_exactly_once(spark: Any, kafka: Running,
                                                                     tmp_path: Path) -> None:
    kafka.store.create_topic("source", partitions=2)
    for partition in range(2):
        kafka.store.append("source", [(b"k%d" % i, b"p%d-%d" % (partition, i)) for i in range(200)],
                           partition=partition)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = _start(spark, kafka, output, checkpoint, available_now=False)
    wait_for(lambda: first.lastProgress and first.lastProgress["batchId"] >= 1, "two micro-batches of the first run")
    first.stop()
    kafka.store.append("source", [(b"late", b"p1-late")], partition=1)
    second = _start(spark, kafka, output, checkpoint, available_now=True)
    second.awaitTermination(300)
    rows = pq.read_table(output).to_pylist()
    delivered = sorted((row["partition"], row["offset"], row["value"]) for row in rows)
    expected = sorted([(p, i, b"p%d-%d" % (p, i)) for p in range(2) for i in range(200)] + [(1, 200, b"p1-late")])
    assert delivered == expected
    sizes = [progress["numInputRows"] for progress in second.recentProgress if progress["numInputRows"]]
    assert sizes and max(sizes) <= 120
