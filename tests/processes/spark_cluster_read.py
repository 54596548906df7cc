"""Reads a topic of a remote tier through Spark with executors in processes of their own (master
``local-cluster[2,1,1024]``), for the test that checks what executors read from the tier alone.

Usage: python spark_cluster_read.py URI TOPIC

Prints one JSON line: per view (raw, read_compacted, compacted), the row count, the sum of the value lengths and
the number of distinct keys, all computed by the executors, and the executors' process ids that read.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import functions as F

from streaming import local_session


def main() -> int:
    uri, topic = sys.argv[1], sys.argv[2]
    spark = local_session("ledgerview-cluster-read", master="local-cluster[2,1,1024]")
    result = {}
    for view in ("raw", "read_compacted", "compacted"):
        frame = spark.read.format("ledgerview").option("path", uri).option("topic", topic).option("view", view) \
            .option("maxPartitionBytes", "4096").load()
        row = frame.agg(F.count("*").alias("rows"), F.sum(F.length("value")).alias("value_bytes"),
                        F.countDistinct("key").alias("keys")).collect()[0]
        result[view] = {"rows": row["rows"], "value_bytes": row["value_bytes"], "keys": row["keys"],
                        "tasks": frame.rdd.getNumPartitions()}
    result["executors"] = len(spark.sparkContext.parallelize(range(8), 8).map(
        lambda _: __import__("os").getpid()).distinct().collect())
    spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
