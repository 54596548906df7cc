"""Sources as Spark Structured Streaming queries into the ``ledgerview`` sink (streaming/sink.py), when the config
enables ``[spark]``: a directory of text or JSON-lines files (Spark's file source), or another topic of the same
store (the ``ledgerview`` streaming source). Exactly once per micro-batch comes from Spark's checkpoint
(``<data>/__service/spark/<source>``) and the sink's commit markers, so a restart after SIGTERM or ``kill -9``
continues where the last committed batch ended. The generator stays a direct source: Spark's ``rate`` source does
not replay the same rows for a batch id.

The parsing matches ``ledgerview produce`` and the direct directory source: ``key<separator>value`` text lines
(blank lines skipped, the null marker for null keys and values) or JSON lines with ``key``, ``value`` and
``timestamp``; a malformed line fails the query, which the status endpoint reports.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from ledgerview.service.config import SourceSection, SparkSection
from ledgerview.service.ingest import SERVICE_FOLDER, IngestStats
from ledgerview.service.logs import log_event
from streaming import local_session

logger = logging.getLogger("ledgerview.spark")
SPARK_KINDS = ("directory", "topic")
"""Source types that run on Spark when it is enabled."""


class SparkSource:
    """One source's streaming query; its stats are read from the query's progress."""

    def __init__(self, section: SourceSection, query: StreamingQuery) -> None:
        self.name, self.topic, self.kind = section.name, section.topic, section.type
        self.query = query
        self._stats = IngestStats(state="running")
        self._last_batch = -1
        self._lock = threading.Lock()

    @property
    def stats(self) -> IngestStats:
        with self._lock:
            for progress in self.query.recentProgress:
                if progress["batchId"] > self._last_batch:
                    self._last_batch = progress["batchId"]
                    rows = int(progress["numInputRows"])
                    self._stats.messages += rows
                    self._stats.appends += 1 if rows else 0
                    self._stats.last_append_ms = _epoch_ms(progress["timestamp"]) if rows else (
                        self._stats.last_append_ms)
            if self._stats.state == "running" and not self.query.isActive:
                error = self.query.exception()
                self._stats.state = "failed" if error is not None else "stopped"
                if error is not None:
                    self._stats.errors += 1
                    self._stats.last_error = f"StreamingQueryException: {str(error).splitlines()[0]}"
                    log_event(logger, logging.ERROR, "source.failed", source=self.name, topic=self.topic,
                              error=self._stats.last_error)
            return self._stats


class SparkIngest:
    """The Spark session and one streaming query per source, started and stopped with the service."""

    def __init__(self, sections: list[SourceSection], data: Path, spark: SparkSection) -> None:
        self.sections = sections
        self.data = data
        self.master = spark.master
        self.sources: list[SparkSource] = []
        self.session: SparkSession | None = None

    def start(self) -> None:
        self.session = local_session("ledgerview-service", master=self.master, config={
            "spark.sql.warehouse.dir": str((self.data / SERVICE_FOLDER / "spark-warehouse").resolve()),
            "spark.ui.enabled": "false"})
        if any(section.type == "kafka" for section in self.sections):
            from streaming.kafka_source import KafkaSource

            self.session.dataSource.register(KafkaSource)
        for section in self.sections:
            query = (self._input(self.session, section).writeStream.format("ledgerview").queryName(section.name)
                     .option("path", str(self.data)).option("topic", section.topic)
                     .option("checkpointLocation", str(self.data / SERVICE_FOLDER / "spark" / section.name))
                     .trigger(processingTime=f"{max(section.interval_s, 0.1)} seconds").start())
            self.sources.append(SparkSource(section, query))
            log_event(logger, logging.INFO, "source.started", source=section.name, topic=section.topic,
                      engine="spark", query_id=str(query.id))

    def stop(self) -> None:
        """Stop every query (a batch cut short is committed again by the next run, exactly once), then Spark."""
        for source in self.sources:
            source.query.stop()
            source.stats  # noqa: B018  # read the last progress before the session goes
        if self.session is not None:
            self.session.stop()

    def _input(self, spark: SparkSession, section: SourceSection) -> DataFrame:
        if section.type == "kafka":  # a mirror: each message keeps its partition (and so its order)
            return (spark.readStream.format("ledgerview-kafka")
                    .option("kafka.bootstrap.servers", section.bootstrap_servers)
                    .option("subscribe", section.source_topic).option("startingOffsets", section.starting_offsets)
                    .load().select("key", "value", "timestamp", "headers", "partition"))
        if section.type == "topic":
            return (spark.readStream.format("ledgerview").option("path", str(self.data))
                    .option("topic", section.source_topic).option("startingOffsets", section.starting_offsets)
                    .load().select("key", "value", "timestamp", "headers"))
        files = spark.readStream.option("pathGlobFilter", section.pattern)
        if section.format == "json":
            lines = files.schema("key string, value string, timestamp long, partition int").option("mode", "FAILFAST")
            return lines.json(section.path).select(  # a null partition is the sink's partitioner's choice
                "key", "value", F.coalesce("timestamp", F.unix_millis(F.current_timestamp())).alias("timestamp"),
                "partition")
        text = files.text(section.path).where(F.length("value") > 0)
        parts = F.split(F.col("value"), f"\\Q{section.separator}\\E", 2)
        malformed = F.raise_error(F.concat(F.lit(f"a line of a file in {section.path} has no separator "
                                                 f"{section.separator!r} between key and value: "),
                                           F.col("value")))
        value = F.when(F.size(parts) < 2, malformed).otherwise(parts.getItem(1))
        return text.select(_nulls_marked(parts.getItem(0), section).alias("key"),
                           _nulls_marked(value, section).alias("value"))


def _nulls_marked(column: Column, section: SourceSection) -> Column:
    if section.null_marker is None:
        return column
    return F.when(column == F.lit(section.null_marker), F.lit(None).cast("string")).otherwise(column)


def _epoch_ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
