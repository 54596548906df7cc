"""Spark jobs for the benchmarks: the ledgerview sink beside Spark's Parquet file sink on the same stream, and
Spark SQL over ledgerview's compacted view beside the same queries over a Parquet copy of it.

Each job runs in a local[2] session of its own process (streaming.local_session: conf/ settings, the data source
registered), started in the harness's untimed warm-up.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.compaction import Job, Outcome, folder_bytes, ledgerview_store
from bench.systems import APPEND_ROWS, TOPIC
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
def parquet_copies(table: pa.Table, spec: ChangelogSpec, target: Path, *, append_messages: int = APPEND_ROWS
                   ) -> None:
    """A store compacted as the compaction workloads leave it, then 10% more of the dataset appended above the
    horizon (so the table view merges a raw tail), ``append_messages`` at a time as the rest, and beside it
    Parquet copies of the same rows: the table (each key's latest live message, offset order) and the raw log, for
    the peer."""
    tail = table.num_rows // 10
    ledgerview_store(compact=True, append_messages=append_messages)(table.slice(0, table.num_rows - tail), spec,
                                                                     target / "store")
    with Store.open(target / "store") as store:
        for start in range(table.num_rows - tail, table.num_rows, append_messages):
            store.append(TOPIC, table.slice(start, min(append_messages, table.num_rows - start)), partition=0)
    raw = read_table(target / "store", TOPIC)
    pq.write_table(raw, str(target / "raw.parquet"))
    latest: dict[bytes, int] = {}
    for row, key in enumerate(raw.column("key").to_pylist()):
        latest[key] = row
    compacted = raw.take(sorted(latest.values()))
    compacted = compacted.filter(compacted.column("value").is_valid())
    pq.write_table(compacted, str(target / "compacted.parquet"))
    (target / POINT_KEY_FILE).write_bytes(compacted.column("key")[POINT_KEY_INDEX % compacted.num_rows].as_py())
    (target / HALF_OFFSET_FILE).write_text(str(raw.num_rows // 2))


FULL_SCAN = "SELECT count(*) AS n, sum(length(value)) AS bytes FROM v"
FILTERED_SCAN = "SELECT count(*) AS n, sum(length(value)) AS bytes FROM v WHERE offset >= {half}"
POINT_QUERY = "SELECT offset, value FROM v WHERE key = '{key}'"
HALF_OFFSET_FILE = "half-offset"


def sql_job(source: str, query: str, view: str = "compacted") -> Job:
    """``query`` over view ``v``: a view of the store through the ledgerview source, or its Parquet copy."""

    def job(target: Path, output: Path) -> Outcome:
        spark = _session()
        if source == "ledgerview":
            frame = spark.read.format("ledgerview").option("topic", TOPIC).option("view", view) \
                .load(str(target / "store"))
        else:
            frame = spark.read.parquet(str(target / f"{view}.parquet"))
        frame.where("offset >= 0").createOrReplaceTempView("v")  # a fresh plan each run (streaming/views.py)
        sql = query.format(key=(target / POINT_KEY_FILE).read_text(), half=(target / HALF_OFFSET_FILE).read_text())
        rows = spark.sql(sql).collect()
        messages = rows[0].n if query != POINT_QUERY else len(rows)
        return Outcome(messages, kept=messages, output_bytes=0, notes=sql)

    return job


# ------------------------------------------------------------------------------------------------- df.write
def write_input(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """The dataset (key, value, timestamp) as one Parquet file, row groups of 128k rows (so Spark splits it)."""
    target.mkdir(parents=True)
    pq.write_table(table, target / "input.parquet", row_group_size=128 * 1024)


def write_once(source: Path, output: Path, sink: str) -> None:
    """``df.write`` of the input into a fresh 1-partition topic, or into Parquet."""
    frame = _session().read.parquet(str(source / "input.parquet"))
    if sink == "ledgerview":
        with Store.open(output / "store") as store:
            store.create_topic(TOPIC, partitions=1)
        frame.write.format("ledgerview").option("path", str(output / "store")).option("topic", TOPIC) \
            .mode("append").save()
    else:
        frame.write.parquet(str(output / "parquet"))


def write_job(sink: str, *, first: bool) -> Job:
    """A warm ``df.write`` in the harness's session, or (``first``) the first one of a fresh session: a process of
    its own starts a session untimed, then times its first write, as a user's job meets it."""

    def job(target: Path, output: Path) -> Outcome:
        seconds = None
        if first:
            output.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([sys.executable, "-m", "bench.spark_jobs", sink, str(target), str(output)],
                                  check=True, capture_output=True, text=True)
            seconds = float(done.stdout.split()[-1])
        else:
            write_once(target, output, sink)
        if sink != "ledgerview":
            return Outcome(None, seconds=seconds)
        with Store.open(output / "store") as store:
            return Outcome(None, seconds=seconds, kept=store.end_offset(TOPIC, 0))

    return job


def _first_write(sink: str, target: Path, output: Path) -> None:
    _session()
    start = time.perf_counter()
    write_once(target, output, sink)
    print(f"{time.perf_counter() - start:.6f}")


if __name__ == "__main__":
    _first_write(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
