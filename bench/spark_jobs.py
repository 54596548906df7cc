"""Spark jobs for the benchmarks: the ledgerview sink beside Spark's Parquet file sink on the same stream, and
Spark SQL over ledgerview's compacted view beside the same queries over a Parquet copy of it.

Each job runs in a local[2] session of its own process (streaming.local_session: conf/ settings, the data source
registered), started in the harness's untimed warm-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.compaction import Job, Outcome, folder_bytes, ledgerview_store
from bench.systems import TOPIC
from ledgerview.changelog import ChangelogSpec
from readers import read_table
from storage import Store
from streaming.sink_commit import read_committed_batch

SINK_FILES = 10
"""Input files, one per micro-batch (maxFilesPerTrigger=1)."""
DRIVER_MEMORY = "4g"
POINT_KEY_INDEX = 12_345
POINT_KEY_FILE = "point-key"
_spark: Any = None


def _session() -> Any:
    global _spark
    if _spark is None:
        from streaming import local_session

        _spark = local_session("ledgerview-bench", config={"spark.driver.memory": DRIVER_MEMORY})
    return _spark


# ---------------------------------------------------------------------------------------------------- the sink
def sink_input(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """The stream's input: the dataset (key, value, timestamp) as SINK_FILES Parquet files."""
    target.mkdir(parents=True)
    size = -(-table.num_rows // SINK_FILES)
    for index in range(SINK_FILES):
        pq.write_table(table.slice(index * size, size), target / f"part-{index:03d}.parquet")


def _stream(target: Path) -> Any:
    return (_session().readStream.schema("key binary, value binary, timestamp long")
            .option("maxFilesPerTrigger", 1).parquet(str(target)))


def ledgerview_sink(target: Path, output: Path) -> Outcome:
    """availableNow through writeStream.format("ledgerview") into a fresh 1-partition topic."""
    store_folder = output / "store"
    with Store.open(store_folder) as store:
        store.create_topic(TOPIC, partitions=1)
    query = (_stream(target).writeStream.format("ledgerview").option("path", str(store_folder))
             .option("topic", TOPIC).option("checkpointLocation", str(output / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    with Store.open(store_folder) as store:
        kept = store.end_offset(TOPIC, 0)
        batches = read_committed_batch(store, TOPIC, str(query.id)) + 1
    return Outcome(None, kept=kept, output_bytes=folder_bytes(store_folder), notes=f"{batches} micro-batches")


def parquet_sink(target: Path, output: Path) -> Outcome:
    """availableNow through Spark's built-in file sink, format parquet (snappy)."""
    query = (_stream(target).writeStream.format("parquet").option("path", str(output / "parquet"))
             .option("checkpointLocation", str(output / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    return Outcome(None)


# ----------------------------------------------------------------------------------------------- Spark SQL
def compacted_parquet_copy(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """A store compacted as the compaction workloads leave it, and beside it a Parquet copy of its compacted
    view (same columns, offset order) for the peer."""
    ledgerview_store(compact=True)(table, spec, target / "store")
    compacted = read_table(target / "store", TOPIC, read_compacted=True)
    pq.write_table(compacted, str(target / "compacted.parquet"))
    (target / POINT_KEY_FILE).write_bytes(compacted.column("key")[POINT_KEY_INDEX % compacted.num_rows].as_py())


FULL_SCAN = "SELECT count(*) AS n, sum(length(value)) AS bytes FROM v"
POINT_QUERY = "SELECT offset, value FROM v WHERE key = '{key}'"


def sql_job(source: str, query: str) -> Job:
    """``query`` over view ``v``: the compacted view through the ledgerview source, or the Parquet copy."""

    def job(target: Path, output: Path) -> Outcome:
        spark = _session()
        if source == "ledgerview":
            frame = spark.read.format("ledgerview").option("topic", TOPIC).load(str(target / "store"))
        else:
            frame = spark.read.parquet(str(target / "compacted.parquet"))
        frame.where("offset >= 0").createOrReplaceTempView("v")  # a fresh plan each run (streaming/views.py)
        sql = query.format(key=(target / POINT_KEY_FILE).read_text())
        rows = spark.sql(sql).collect()
        messages = rows[0].n if query == FULL_SCAN else len(rows)
        return Outcome(messages, kept=messages, output_bytes=0, notes=sql)

    return job
