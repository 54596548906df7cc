"""The main job on the embedded default: a local data folder and built-in sample data, ending by itself.

1. Write the built-in price changelog (ticks for a few hundred symbols, some delisted by tombstones) as Parquet
   files, one per micro-batch.
2. Stream them through the ledgerview sink (Spark Structured Streaming, availableNow, exactly once per batch)
   into a topic whose compaction threshold is set, while the compaction scheduler runs beside the query.
3. Compact what the query left above the horizon, then print, through Spark SQL over the views, the raw counts
   beside the compacted view, and the compaction status and sizes per partition.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from compactor import CompactionResult, Compactor
from compactor.scheduler import CompactionScheduler
from ledgerview.changelog import price_ticks
from storage import Store
from storage.compacted import CompactionCursor
from storage.errors import LedgerviewError
from streaming import local_session, register_views

TOPIC = "prices"
DEMO_MARKER = ".ledgerview-demo"
"""Written into the demo's folder, so a later run empties only a folder an earlier demo made."""


class DemoFolderError(LedgerviewError):
    def __init__(self, folder: Path) -> None:
        super().__init__(f"{folder} is not empty and was not made by the demo (no {DEMO_MARKER} file in it); "
                         "the demo empties its folder first, so give it a new or empty folder with --data.")


def _empty_demo_folder(data: Path) -> None:
    """Remove what an earlier demo left, never a folder the demo did not make."""
    if data.exists() and any(data.iterdir()):
        if not (data / DEMO_MARKER).is_file():
            raise DemoFolderError(data)
        shutil.rmtree(data)
    data.mkdir(parents=True, exist_ok=True)
    (data / DEMO_MARKER).touch()


def run_demo(data: Path, *, symbols: int = 300, ticks: int = 200_000, partitions: int = 3,
             batches: int = 8) -> int:
    """Run the demo in ``data`` (emptied first); returns a process exit status."""
    _empty_demo_folder(data)
    store_folder, source = data / "store", data / "input"
    changelog = price_ticks(symbols, ticks)
    _write_batches(changelog, source, batches)
    print(f"ledgerview demo: data folder {data.resolve()}")
    print(f"{ticks:,} price ticks for {symbols} symbols ({changelog['value'].null_count} delisted by a "
          f"tombstone) in {batches} input files")
    with Store.open(store_folder) as store:
        store.create_topic(TOPIC, partitions=partitions, config={"segment.bytes": str(256 * 1024),
                                                                 "compaction.threshold.bytes": str(1024 * 1024)})
        started = time.perf_counter()
        spark = local_session("ledgerview-demo")
        print(f"Spark session started in {time.perf_counter() - started:.1f} s")
        scheduler = CompactionScheduler(store, interval_s=1.0)
        scheduler.start()
        try:
            started = time.perf_counter()
            query = (spark.readStream.schema("key binary, value binary, timestamp long")
                     .option("maxFilesPerTrigger", 1).parquet(str(source))
                     .writeStream.format("ledgerview").option("path", str(store_folder)).option("topic", TOPIC)
                     .option("checkpointLocation", str(data / "checkpoint")).trigger(availableNow=True).start())
            query.awaitTermination()
            stream_seconds = time.perf_counter() - started
        finally:
            scheduler.stop()
        during = _cursors(store)
        print(f"streamed {len(query.recentProgress)} micro-batches through the sink in {stream_seconds:.1f} s; "
              f"the scheduler compacted {sum(c is not None for c in during)} of {partitions} partitions meanwhile")
        results = Compactor(store).compact(TOPIC)
        register_views(spark, store_folder)
        ok = _print_views(spark, changelog)
        _print_partitions(store, results)
        statuses = Compactor(store).status(TOPIC)
        print("compaction status: " + ", ".join(f"{s.partition}={s.state.name}" for s in statuses))
        spark.stop()
    return 0 if ok else 1


def _write_batches(changelog: pa.Table, folder: Path, batches: int) -> None:
    folder.mkdir(parents=True)
    size = -(-changelog.num_rows // batches)
    for index in range(batches):
        path = folder / f"ticks-{index:03d}.parquet"
        pq.write_table(changelog.slice(index * size, size), path)
        moment = time.time() - batches + index  # the file source takes files in modification-time order
        os.utime(path, (moment, moment))


def _cursors(store: Store) -> list[CompactionCursor | None]:
    partitions = store.topic_metadata(TOPIC).partitions
    return [store.compacted_ledgers(TOPIC, p).read_cursor() for p in range(partitions)]


def _print_views(spark: SparkSession, changelog: pa.Table) -> bool:
    """Raw counts beside the compacted view, through Spark SQL; True when both match the changelog (every tick
    in the raw log, each live symbol's last price in the compacted view)."""
    sql = spark.sql
    raw = sql(f"SELECT count(*) AS n, count(value) AS live, count(DISTINCT key) AS keys FROM {TOPIC}_raw").collect()[0]
    compacted = sql(f"SELECT count(*) AS n FROM {TOPIC}").collect()[0]
    print(f"\nraw log ({TOPIC}_raw): {raw.n:,} messages, {raw.n - raw.live:,} tombstones, {raw.keys} keys")
    print(f"compacted view ({TOPIC}): {compacted.n:,} messages, one per live symbol")
    print(f"\nspark.sql(\"SELECT key, value, offset FROM {TOPIC} ORDER BY key LIMIT 5\"):")
    for row in sql(f"SELECT CAST(key AS STRING) AS key, CAST(value AS STRING) AS value, offset FROM {TOPIC} "
                   "ORDER BY key LIMIT 5").collect():
        print(f"  {row.key}  {row.value:>8}  offset {row.offset}")
    first = sql(f"SELECT CAST(key AS STRING) AS key FROM {TOPIC} ORDER BY key LIMIT 1").collect()[0].key
    point = sql(f"SELECT CAST(value AS STRING) AS value FROM {TOPIC} WHERE key = '{first}'").collect()[0]
    print(f"spark.sql(\"SELECT value FROM {TOPIC} WHERE key = '{first}'\") -> {point.value}")
    model: dict[bytes, bytes | None] = dict(zip(changelog["key"].to_pylist(), changelog["value"].to_pylist(),
                                                strict=True))
    live = {key: value for key, value in model.items() if value is not None}
    view = {row.key: row.value for row in sql(f"SELECT key, value FROM {TOPIC}").collect()}
    ok = raw.n == changelog.num_rows and compacted.n == len(live) and view == live
    print(f"raw log holds every tick and the compacted view is each live symbol's last price: "
          f"{'yes' if ok else 'NO'}")
    return bool(ok)


def _print_partitions(store: Store, results: list[CompactionResult]) -> None:
    description = store.describe_topic(TOPIC)
    print(f"\n{'partition':>9} {'end':>8} {'segments':>8} {'raw bytes':>12} {'horizon':>8} {'kept':>6} "
          f"{'ledger bytes':>13}")
    for info, result in zip(description.partitions, results, strict=True):
        print(f"{info.partition:>9} {info.end_offset:>8} {info.segments:>8} {info.size_bytes:>12,} "
              f"{result.horizon:>8} {result.messages_kept:>6} {result.ledger_bytes:>13,}")
