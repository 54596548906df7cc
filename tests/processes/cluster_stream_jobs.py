"""The streaming source's jobs for the cluster tests (merged into tests/processes/cluster_jobs.py's JOBS): a
``readStream`` of a topic, counted by the executors micro-batch by micro-batch."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F


def in_order(rows: Iterable[Row]) -> Iterator[bool]:
    """Whether one task's rows come in increasing offsets within each log partition."""
    last: dict[int, int] = {}
    ordered = True
    for row in rows:
        ordered &= row["offset"] > last.get(row["partition"], -1)
        last[row["partition"]] = row["offset"]
    yield ordered


def counted(frame: DataFrame) -> dict[str, Any]:
    """One micro-batch as the executors counted it: rows, the sum of value lengths, its keys (as text), each log
    partition's offsets (sorted), whether every task served them in increasing order, and the Spark partitions
    (tasks) it was planned as, in all and per log partition (there only tasks that returned rows count)."""
    row = frame.agg(F.count("*").alias("rows"), F.sum(F.length("value")).alias("value_bytes"),
                    F.collect_set(F.col("key").cast("string")).alias("keys")).collect()[0]
    offsets = frame.groupBy("partition").agg(F.sort_array(F.collect_list("offset")).alias("offsets")).collect()
    ordered = all(frame.select("partition", "offset").rdd.mapPartitions(in_order).collect())
    spread = frame.select("partition", F.spark_partition_id().alias("task")).groupBy("partition") \
        .agg(F.countDistinct("task").alias("tasks")).collect()
    return {"rows": row["rows"], "value_bytes": row["value_bytes"] or 0, "keys": sorted(row["keys"]),
            "offsets": {str(r["partition"]): r["offsets"] for r in offsets},
            "ordered": ordered, "tasks": frame.rdd.getNumPartitions(),
            "tasks_per_partition": {str(r["partition"]): r["tasks"] for r in spread}}


def stream_view(spark: SparkSession, uri: str, topic: str, view: str, max_partition_bytes: int) -> list[dict[str, Any]]:
    """Each micro-batch of a ``readStream`` of ``view`` from earliest with ``trigger(availableNow=True)``, as
    ``counted`` describes it (checkpoint in a temporary folder here)."""
    batches: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ledgerview-stream-") as checkpoint:
        query = (spark.readStream.format("ledgerview").option("path", uri).option("topic", topic)
                 .option("view", view).option("startingOffsets", "earliest")
                 .option("maxPartitionBytes", str(max_partition_bytes)).load()
                 .writeStream.foreachBatch(lambda frame, _: batches.append(counted(frame)))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
    return batches


def stream_views(spark: SparkSession, uri: str, topic: str, max_partition_bytes: int = 4096) -> dict[str, Any]:
    """``stream_view`` of the raw log and of the compacted view."""
    return {view: stream_view(spark, uri, topic, view, max_partition_bytes) for view in ("raw", "compacted")}


STREAM_JOBS: dict[str, Callable[..., Any]] = {"stream_views": stream_views}
