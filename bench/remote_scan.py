"""Issue 17: Spark SQL's scan of a topic on an object store (``spark.read.format("ledgerview")`` with
``option("path", "s3://…")``: executors read segment and ledger objects themselves) beside Parquet files of the
same rows on the same S3 server, read by pyarrow inside Spark tasks (Spark's own S3A connector is not installed
here, so its Parquet reader cannot reach the server).

The data is bench/remote_sink.py's, written untimed on ``local-cluster[2,1,1024]``: the ledgerview sink into a
topic of 4 partitions and, from the same input, Parquet files written by the executors through pyarrow in
``foreachBatch``. The topic is then compacted (``compact_with_spark``), and its table (``view=compacted``, one row
per key) is written once more as Parquet by the same pyarrow writer, so that each view has Parquet of its rows.

Queries, each on a fresh DataFrame, timed from building it to the end of ``collect()``:

- full scan: ``count(*)`` and ``sum(length(value))``;
- point: the rows of one key (``key = …``; ledgerview pushes it down: the ledger's key index for the table, a
  filter in the read for the raw log).

Parquet side: a DataFrame of the files' paths, one task per file, ``mapInArrow`` reading each file with
``pyarrow.dataset`` (the point query's key filter handed to pyarrow, as the ledgerview scan takes it), then the same
aggregation in Spark. Both sides hand Arrow batches from Python workers to the JVM. Each query runs once untimed
first, then the cases alternate, ``--repeat`` times each; the best run is reported.

An executor's Python worker keeps its RemoteStore, whose fetch cache (256 MiB) holds the objects it read, between
tasks; so ledgerview runs twice: as a repeated query finds it, and with the cache emptied first (untimed: every
worker forgets its store), which fetches every object from the server as the Parquet side always does.

Usage: python -m bench.remote_scan [--rows N] [--value-bytes B] [--files F] [--per-batch M] [--repeat R]
Prints a markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.remote_sink import arguments, cluster, ledgerview_sink, parquet_files, run_heading, write_parquet
from bench.s3_server import S3Server

POINT_KEY = b"k4242"
FILE_SCHEMA = "key binary, value binary"


def parquet_reader(uri: str, key: bytes | None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task reading the Parquet files whose paths it is given, with pyarrow, only rows of ``key`` if given."""

    def read(paths: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        filesystem, _ = pafs.FileSystem.from_uri(uri)
        for batch in paths:
            dataset = ds.dataset(batch.column("path").to_pylist(), format="parquet", filesystem=filesystem)
            found = None if key is None else ds.field("key") == pa.scalar(key, pa.binary())
            yield from dataset.to_batches(columns=["key", "value"], filter=found)

    return read


@dataclass(frozen=True)
class Source:
    """One view's rows, as a topic read through the ledgerview source or as Parquet files."""

    spark: SparkSession
    server: S3Server
    topic: str
    view: str
    files: list[str]

    def ledgerview(self, key: bytes | None) -> DataFrame:
        frame = self.spark.read.format("ledgerview").option("path", self.server.uri).option("topic", self.topic) \
            .option("view", self.view).load()
        return frame if key is None else frame.where(F.col("key") == F.lit(key))

    def parquet(self, key: bytes | None) -> DataFrame:
        paths = self.spark.sparkContext.parallelize([(path,) for path in self.files], len(self.files))
        return paths.toDF("path string").mapInArrow(parquet_reader(self.server.uri, key), FILE_SCHEMA)


def empty_fetch_caches(spark: SparkSession) -> None:
    """Have the executors' Python workers forget the remote stores they keep (streaming/store_cache.py), and so
    their fetch caches. Assumes each executor's one core runs its tasks one at a time in one reused worker, so that
    a job of 8 tasks reaches every worker."""

    def forget(_: Iterable[int]) -> Iterator[int]:
        from streaming import store_cache

        yield len(store_cache._REMOTE_STORES)
        store_cache._REMOTE_STORES.clear()

    spark.sparkContext.parallelize(range(8), 8).mapPartitions(forget).collect()


def full_scan(frame: DataFrame) -> int:
    row = frame.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    return int(row["n"])


def point(frame: DataFrame) -> int:
    return len(frame.select("key", "value").collect())


QUERIES: dict[str, tuple[Callable[[DataFrame], int], bytes | None]] = {
    "full scan (count, sum(length(value)))": (full_scan, None),
    f"point (key = '{POINT_KEY.decode()}')": (point, POINT_KEY)}


EMPTIED = "ledgerview, fetch cache emptied"
SYSTEMS: dict[str, Callable[[Source, bytes | None], DataFrame]] = {
    "ledgerview": Source.ledgerview, EMPTIED: Source.ledgerview, "parquet": Source.parquet}


def prepare(spark: SparkSession, server: S3Server, work: Path, per_batch: int) -> dict[str, Source]:
    """Untimed: the topic and the Parquet files of bench/remote_sink.py, the topic compacted, its table as
    Parquet too; the two views' sources."""
    from streaming.compaction import compact_with_spark

    topic = f"scan-{uuid.uuid4().hex[:8]}"
    ledgerview_sink(spark, server, work / "input", per_batch, work / "ck-ledgerview", topic)
    raw_files = parquet_files(spark, server, work / "input", per_batch, work / "ck-parquet")
    compact_with_spark(spark, server.uri, topic)
    table = Source(spark, server, topic, "compacted", []).ledgerview(None).select("key", "value")
    table_files = write_parquet(table, server.uri, 1_000_000)
    return {"raw": Source(spark, server, topic, "raw", [path for path, _ in raw_files]),
            "compacted": Source(spark, server, topic, "compacted", [path for path, _ in table_files])}


def main(argv: list[str] | None = None) -> int:
    args = arguments("bench.remote_scan", __doc__, argv)
    head = run_heading(args, "SQL scan from S3", "bench.remote_scan")
    timings: dict[tuple[str, str, str], list[tuple[float, int]]] = {}
    tasks: dict[tuple[str, str], int] = {}
    with cluster(args, "bench-remote-scan") as (spark, server, work):
        sources = prepare(spark, server, work, args.per_batch)
        for view, source in sources.items():
            tasks[view, "ledgerview"] = tasks[view, EMPTIED] = source.ledgerview(None).rdd.getNumPartitions()
            tasks[view, "parquet"] = len(source.files)
        for attempt in range(args.repeat + 1):  # the first round untimed
            for view, source in sources.items():
                for query, (answer, key) in QUERIES.items():
                    for system, frame in SYSTEMS.items():
                        if system == EMPTIED:
                            empty_fetch_caches(spark)
                        start = time.perf_counter()
                        rows = answer(frame(source, key))
                        seconds = time.perf_counter() - start
                        if attempt:
                            timings.setdefault((view, query, system), []).append((seconds, rows))
    print(section(head, timings, tasks))
    return 0


def section(head: list[str], timings: dict[tuple[str, str, str], list[tuple[float, int]]],
            tasks: dict[tuple[str, str], int]) -> str:
    """The table of the runs; every run of a view's query must have found the same rows on both sides."""
    lines = ["### SQL scan from S3", "", *head, "",
             "| view | query | system | tasks | rows | seconds (best) | x parquet | runs (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for (view, query, system), runs in timings.items():
        seconds, rows = min(runs)
        parquet = timings[view, query, "parquet"]
        assert {count for _, count in runs + parquet} == {rows}, f"{view}, {query}: the answers differ"
        every = ", ".join(f"{run:.2f}" for run, _ in runs)
        lines.append(f"| {view} | {query} | {system} | {tasks[view, system]} | {rows:,} | {seconds:.2f} | "
                     f"{seconds / min(parquet)[0]:.2f} | {every} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
