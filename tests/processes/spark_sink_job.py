"""A streaming query in its own process and JVM, for the sink's crash tests: Parquet files (one per micro-batch,
availableNow) into a ledgerview topic through the sink, from a checkpoint that survives the process.

Usage: python spark_sink_job.py DATA INPUT CHECKPOINT TOPIC
Prints ``done <last committed batch id>`` when the query ends by itself. A crash point armed through
LEDGERVIEW_CRASH_AT kills the JVM (and the Python worker) inside the sink's commit.
"""

from __future__ import annotations

import sys

from storage import Store
from streaming import local_session
from streaming.sink_commit import read_committed_batch

data, source, checkpoint, topic = sys.argv[1:5]
spark = local_session("sink-crash-test")
query = (spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1).parquet(source)
         .writeStream.format("ledgerview").option("path", data).option("topic", topic)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
query.awaitTermination()
with Store.open(data) as store:
    print(f"done {read_committed_batch(store, topic, str(query.id))}", flush=True)
spark.stop()
