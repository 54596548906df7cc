"""The jobs the cluster tests run on the shared ``local-cluster`` session (tests/processes/spark_cluster.py): each
takes the session and JSON arguments and returns what the executors computed, as JSON."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streaming.compaction import compact_with_spark
from tests.processes.cluster_sink_jobs import SINK_JOBS
from tests.processes.cluster_stream_jobs import STREAM_JOBS

Job = Callable[..., Any]


def read_views(spark: SparkSession, uri: str, topic: str) -> dict[str, Any]:
    """Per view (raw, read_compacted, compacted): rows, the sum of value lengths and distinct keys, counted by the
    executors, and the tasks the scan was cut into; and the process ids of the executors that read."""
    result: dict[str, Any] = {}
    for view in ("raw", "read_compacted", "compacted"):
        frame = spark.read.format("ledgerview").option("path", uri).option("topic", topic).option("view", view) \
            .option("maxPartitionBytes", "4096").load()
        row = frame.agg(F.count("*").alias("rows"), F.sum(F.length("value")).alias("value_bytes"),
                        F.countDistinct("key").alias("keys")).collect()[0]
        result[view] = {"rows": row["rows"], "value_bytes": row["value_bytes"], "keys": row["keys"],
                        "tasks": frame.rdd.getNumPartitions()}
    result["reader_pids"] = sorted(set(frame.rdd.mapPartitions(lambda _: [os.getpid()]).collect()))
    return result


def compact(spark: SparkSession, uri: str, topic: str, task_bytes: int) -> list[dict[str, Any]]:
    """Two-phase compaction of the topic as Spark work (streaming/compaction.py); each partition's result."""
    return [asdict(result) for result in compact_with_spark(spark, uri, topic, task_bytes=task_bytes)]


JOBS: dict[str, Job] = {"read_views": read_views, "compact": compact}
JOBS |= SINK_JOBS | STREAM_JOBS
