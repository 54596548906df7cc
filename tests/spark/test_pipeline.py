"""End to end through Spark: the price changelog streams through the sink in micro-batches while the compaction
scheduler compacts the topic past its threshold; then Spark SQL and the Reader agree with a dict model of the
changelog (DESIGN.md invariants 4 and 7)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from compactor import Compactor
from compactor.scheduler import CompactionScheduler
from ledgerview.changelog import price_ticks
from readers import read_table
from storage import Store
from storage.compacted import CompactedLedgers
from streaming import register_views
from tests.spark.inputs import write_input_files

pytestmark = pytest.mark.spark

TOPIC = "prices"
BATCHES = 6


def latest_live(changelog: pa.Table) -> dict[bytes, bytes]:
    """The model: each key's last value in input order, tombstoned keys removed."""
    model: dict[bytes, bytes | None] = {}
    for key, value in zip(changelog.column("key").to_pylist(), changelog.column("value").to_pylist(), strict=True):
        model[key] = value
    return {key: value for key, value in model.items() if value is not None}


def test_stream_sink_compaction_and_sql_agree_with_the_model(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    changelog = price_ticks(200, 6_000)
    source = write_input_files(tmp_path / "input", changelog, BATCHES)
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=3, config={"compaction.threshold.bytes": "20000",
                                                       "segment.bytes": "65536"})
        scheduler = CompactionScheduler(store, interval_s=0.2)
        scheduler.start()
        try:
            query = (spark.readStream.schema("key binary, value binary, timestamp long")
                     .option("maxFilesPerTrigger", 1).parquet(str(source))
                     .writeStream.format("ledgerview").option("path", str(data)).option("topic", TOPIC)
                     .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
            query.awaitTermination()
            query_ended_ms = time.time() * 1000
        finally:
            scheduler.stop()
        cursors = [CompactedLedgers(store.partition_log(TOPIC, p).folder).read_cursor() for p in range(3)]
        assert any(cursor is not None and cursor.published_ms <= query_ended_ms for cursor in cursors), \
            "the scheduler compacted nothing while the query ran"
        assert len([p for p in query.recentProgress if p["numInputRows"]]) == BATCHES
        Compactor(store).compact(TOPIC)

    model = latest_live(changelog)
    register_views(spark, data)
    rows = spark.sql(f"SELECT partition, offset, key, value FROM {TOPIC}").collect()
    assert {row.key: row.value for row in rows} == model and len(rows) == len(model)
    reader = read_table(data, TOPIC, read_compacted=True)
    assert sorted((r.partition, r.offset, r.key, r.value) for r in rows) == sorted(
        zip(*(reader.column(c).to_pylist() for c in ("partition", "offset", "key", "value")), strict=True))
    raw = spark.sql(f"SELECT count(*) AS n, count(value) AS live FROM {TOPIC}_raw").collect()[0]
    assert (raw.n, raw.n - raw.live) == (changelog.num_rows, changelog.column("value").null_count)
