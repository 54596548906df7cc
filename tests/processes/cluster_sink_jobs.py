"""The sink's jobs for the cluster tests (merged into tests/processes/cluster_jobs.py's JOBS), and a streaming
query in a process of its own for the sink's crash tests.

The cluster jobs write through ``ledgerview_probe``: the "ledgerview" data source whose writers also leave, per
process that ran a part of the sink (a task's write, the driver's commit), a JSON line in the probe folder: the
pickled size of the commit messages, the objects the process read, created, uploaded and deleted, and the folders
it opened a Store on. So a test sees what crossed to the driver and what each side touched.

Usage (crash tests): python cluster_sink_jobs.py URI INPUT CHECKPOINT TOPIC
A file stream (one Parquet file per micro-batch, availableNow) into the topic at URI on ``local[2]``; prints
``done`` when the query ends by itself. A crash point armed through LEDGERVIEW_CRASH_AT kills the JVM.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from storage import Store
from storage.object_store import ObjectStore
from streaming.datasource import LedgerviewDataSource
from streaming.sink import BatchSink, SinkOptions, StreamSink

PROBE_OPTION = "probe"
WATCHED: dict[str, Callable[..., Any]] = {
    "read": ObjectStore.read, "create": ObjectStore.create, "upload": ObjectStore.upload, "delete": ObjectStore.delete}


@contextlib.contextmanager
def probed(folder: str, part: str, **extra: Any) -> Iterator[dict[str, Any]]:
    """Record what this process touches while the block runs; written to ``folder`` as one JSON file."""
    record: dict[str, Any] = {"part": part, "pid": os.getpid(), "cwd": os.getcwd(), "stores": [], **extra,
                              **{action: [] for action in WATCHED}}
    opened = Store.open.__func__  # type: ignore[attr-defined]

    def watch(action: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def watched(objects: ObjectStore, *args: Any) -> Any:
            record[action].append(args[1] if action == "upload" else args[0])
            return method(objects, *args)
        return watched

    def open_store(cls: type[Store], /, path: Any, **options: Any) -> Store:
        record["stores"].append(str(path))
        return opened(cls, path, **options)  # type: ignore[no-any-return]

    try:
        for action, method in WATCHED.items():
            setattr(ObjectStore, action, watch(action, method))
        Store.open = classmethod(open_store)  # type: ignore[assignment,method-assign]
        yield record
    finally:
        for action, method in WATCHED.items():
            setattr(ObjectStore, action, method)
        Store.open = classmethod(opened)  # type: ignore[assignment,method-assign]
        (Path(folder) / f"{part}-{os.getpid()}-{uuid.uuid4().hex}.json").write_text(json.dumps(record))


def message_bytes(messages: list[WriterCommitMessage | None]) -> int:
    return sum(len(pickle.dumps(message)) for message in messages)


class ProbedWrites:
    """A sink's task writes, probed (mixed in before StreamSink or BatchSink)."""

    def __init__(self, options: SinkOptions, folder: str) -> None:
        super().__init__(options)  # type: ignore[call-arg]
        self.folder = folder

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Any:
        with probed(self.folder, "write"):
            return super().write(iterator)  # type: ignore[misc]


class ProbedStreamSink(ProbedWrites, StreamSink):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with probed(self.folder, "commit", batch=batchId, message_bytes=message_bytes(messages)):
            super().commit(messages, batchId)


class ProbedBatchSink(ProbedWrites, BatchSink):
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        with probed(self.folder, "commit", batch=0, message_bytes=message_bytes(messages)):
            super().commit(messages)


class ProbedDataSource(LedgerviewDataSource):
    @classmethod
    def name(cls) -> str:
        return "ledgerview_probe"

    def _parsed(self, schema: StructType, overwrite: bool) -> tuple[SinkOptions, str]:
        options = {name: value for name, value in self.options.items() if name.lower() != PROBE_OPTION}
        return SinkOptions.parse(options, schema, overwrite), self.options[PROBE_OPTION]

    def writer(self, schema: StructType, overwrite: bool) -> ProbedBatchSink:
        return ProbedBatchSink(*self._parsed(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return ProbedStreamSink(*self._parsed(schema, overwrite))


def file_stream(spark: SparkSession, source: str) -> Any:
    """The test inputs (tests/spark/inputs.py), one Parquet file per micro-batch."""
    return spark.readStream.schema("key string, value string, timestamp long").option("maxFilesPerTrigger", 1) \
        .parquet(source)


def sink_stream(spark: SparkSession, uri: str, topic: str, source: str, checkpoint: str, probe: str) -> str:
    """A file stream into ``topic`` on the object store, to its end; returns the query id."""
    spark.dataSource.register(ProbedDataSource)
    query = (file_stream(spark, source).writeStream.format("ledgerview_probe").option("path", uri)
             .option("topic", topic).option(PROBE_OPTION, probe).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return str(query.id)


def sink_batch(spark: SparkSession, uri: str, topic: str, rows: int, tasks: int, probe: str) -> None:
    """``df.write`` of ``rows`` numbered rows (key k<i % 50>, value n<i> padded with dots to 100 bytes, timestamp
    1.7e12 + i) in ``tasks`` tasks, each a contiguous run of them in order."""
    spark.dataSource.register(ProbedDataSource)
    frame = spark.range(0, rows, 1, tasks).select(
        F.format_string("k%03d", F.col("id") % 50).alias("key"),
        F.rpad(F.concat(F.lit("n"), F.col("id")), 100, ".").alias("value"),
        (F.col("id") + 1_700_000_000_000).alias("timestamp"))
    frame.write.format("ledgerview_probe").option("path", uri).option("topic", topic) \
        .option(PROBE_OPTION, probe).mode("append").save()


SINK_JOBS: dict[str, Callable[..., Any]] = {"sink_stream": sink_stream, "sink_batch": sink_batch}


def main() -> int:
    from streaming import local_session

    uri, source, checkpoint, topic = sys.argv[1:5]
    spark = local_session("remote-sink-crash-test")
    query = (file_stream(spark, source).writeStream.format("ledgerview").option("path", uri).option("topic", topic)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    print("done", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
