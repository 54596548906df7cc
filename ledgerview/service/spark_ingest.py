"""Sources as Spark Structured Streaming queries into the ``ledgerview`` sink (streaming/sink.py), when the config
enables ``[spark]``: a directory of text or JSON-lines files (Spark's file source), or another topic of the same
store (the ``ledgerview`` streaming source). Exactly once per micro-batch comes from Spark's checkpoint
(``<data>/__service/spark/<source>``) and the sink's commit markers, so a restart after SIGTERM or ``kill -9``
continues where the last committed batch ended. The generator stays a direct source: Spark's ``rate`` source does
not replay the same rows for a batch id.

The parsing matches ``ledgerview produce`` and the direct directory source: ``key<separator>value`` text lines
(blank lines skipped, the null marker for null keys and values) or JSON lines with ``key``, ``value``,
``timestamp`` and ``partition``, refused by the same rules (ledgerview/input_lines.py) in Spark SQL; a malformed
line, or one naming a partition the topic lacks, fails the query with an error naming the file and showing the
line, which the status endpoint reports.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from ledgerview.input_lines import CHUNK_BYTES, INTEGER_FIELDS, JSON_FIELDS, NO_VALUE
from ledgerview.refusals import line_too_long, max_line_bytes, store_refusal
from ledgerview.service.config import SourceSection, SparkSection
from ledgerview.service.ingest import SERVICE_FOLDER, IngestStats
from ledgerview.service.logs import log_event
from storage import Store
from storage.config import TopicConfig
from storage.errors import KeylessMessageError, MessageTooLargeError
from storage.partition_log import MESSAGE_OVERHEAD_BYTES
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
        self._partitions: dict[str, int] = {}
        """Each target topic's partition count, read at the start (a JSON line naming another is refused)."""
        self._configs: dict[str, TopicConfig] = {}
        """Each target topic's config, read at the start (max.message.bytes, a compact-only cleanup.policy)."""

    def start(self) -> None:
        with Store.open(self.data, read_only=True) as store:
            self._partitions = {section.topic: store.topic_metadata(section.topic).partitions
                                for section in self.sections}
            self._configs = {section.topic: store.topic_metadata(section.topic).config for section in self.sections}
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
        lines = (spark.readStream.option("pathGlobFilter", section.pattern).text(section.path)
                 .select(F.col("value").alias("line"), F.col("_metadata.file_path").alias("file"))
                 .where(F.length("line") > 0))
        too_long = _too_long(self._configs[section.topic].max_message_bytes)
        if section.format == "json":
            messages = _json_messages(lines, section.topic, self._partitions[section.topic], too_long)
        else:
            parts = F.split(F.col("line"), f"\\Q{section.separator}\\E", 2)
            no_separator = F.lit(f"no separator {section.separator!r} between key and value")
            value = F.when(too_long[0], _malformed(F.lit(too_long[1]))) \
                .when(F.size(parts) < 2, _malformed(no_separator)).otherwise(parts.getItem(1))
            messages = lines.select("line", "file", _nulls_marked(parts.getItem(0), section).alias("key"),
                                    _nulls_marked(value, section).alias("value"))
        return _topic_refusals(messages, self._configs[section.topic])


def _too_long(max_message_bytes: int) -> tuple[Column, str]:
    """Whether a line is longer than the direct directory source reads (``max_line_bytes``; Spark's text source
    has read it whole, without its line end, which counts one byte), and the direct path's words for it. Each
    format checks it first, before its parse: a line refused for its length is refused for nothing else."""
    bound = max_line_bytes(max_message_bytes, CHUNK_BYTES)
    return F.octet_length("line") + 1 > bound, line_too_long(bound, max_message_bytes)


def _topic_refusals(messages: DataFrame, config: TopicConfig) -> DataFrame:
    """The messages (with their ``line`` and ``file``) without those two columns, having failed the query on the
    first message the topic refuses, naming the file and showing the line with the direct directory source's
    words (ledgerview/refusals.py): one over max.message.bytes (its size as the sink's append reckons it: key,
    value and the fixed columns; no headers), a keyless one for a compact-only topic."""
    limit = config.max_message_bytes
    size = (F.lit(MESSAGE_OVERHEAD_BYTES) + F.coalesce(F.octet_length("key"), F.lit(0))
            + F.coalesce(F.octet_length("value"), F.lit(0)))
    before, after = store_refusal(MessageTooLargeError("", 0, -1, limit)).split("-1", 1)
    refusal = F.when(size > limit, F.concat(F.lit(before), size.cast("string"), F.lit(after)))
    if config.is_compact and not config.is_delete:
        refusal = refusal.when(F.col("key").isNull(), F.lit(store_refusal(KeylessMessageError("", 0))))
    value = F.when(refusal.isNotNull(), _malformed(refusal)).otherwise(F.col("value"))
    return messages.select(*[value.alias("value") if name == "value" else name
                             for name in messages.columns if name not in ("line", "file")])


def _json_messages(lines: DataFrame, topic: str, partitions: int, too_long: tuple[Column, str]) -> DataFrame:
    """The messages of JSON lines (columns ``line``, ``file``) by the rules of ``ledgerview produce``
    (input_lines.py, ``_json_record``), in Spark SQL: a line they refuse fails the query, naming its file and
    why. A line is parsed as a variant, strictly (one object, each field once), and its field names read with
    json_object_keys; a line without a timestamp gets the time of the batch, one without a partition the sink's
    partitioner's choice."""
    one = F.try_variant_get(F.try_parse_json(F.concat(F.lit("["), "line", F.lit("]"))), "$", "array<variant>")
    record = F.when(F.size(one) == 1, one.getItem(0))
    names = F.json_object_keys("line")
    fields = {name: F.try_variant_get(record, f"$.{name}", "variant") for name in JSON_FIELDS}
    reason = F.when(too_long[0], F.lit(too_long[1])) \
        .when(~F.coalesce(F.schema_of_variant(record).startswith("OBJECT"), F.lit(False)),
              F.when(F.size(names) > F.size(F.array_distinct(names)), F.concat(
                  F.lit("the field '"), F.filter(names, lambda name: F.size(F.filter(
                      names, lambda other: other == name)) > 1).getItem(0), F.lit("' is given twice")))
              .otherwise(F.lit("not JSON, or not one JSON object")))
    unknown = F.array_sort(F.array_except(names, F.array(*map(F.lit, JSON_FIELDS))))
    reason = reason.when(F.size(unknown) > 0, F.concat(
        F.lit("unknown fields ["), F.array_join(F.transform(unknown, lambda name: F.concat(F.lit("'"), name,
                                                                                              F.lit("'"))), ", "),
        F.lit(f"]; allowed: {', '.join(JSON_FIELDS)}")))
    reason = reason.when(~F.array_contains(names, "value"), F.lit(NO_VALUE))
    for name, field in fields.items():
        reason = reason.when(~_allowed(name, field), F.concat(
            F.lit(f"'{name}' is "), F.to_json(field), F.lit(f"; expected {JSON_FIELDS[name]}")))
    partition = F.try_variant_get(record, "$.partition", "int")
    reason = reason.when(partition >= partitions, F.concat(
        F.lit(f"the topic {topic!r} has no partition "), partition.cast("string"),
        F.lit(f"; its partitions are 0 to {partitions - 1}")))
    timestamp = F.try_variant_get(record, "$.timestamp", "bigint")
    return lines.select(
        "line", "file", F.try_variant_get(record, "$.key", "string").alias("key"),
        F.when(reason.isNotNull(), _malformed(reason))
        .otherwise(F.try_variant_get(record, "$.value", "string")).alias("value"),
        F.coalesce(timestamp, F.unix_millis(F.current_timestamp())).alias("timestamp"),
        partition.alias("partition"))


def _allowed(name: str, field: Column) -> Column:
    """Whether a line's field (a variant, null when the line lacks it) is what JSON_FIELDS says ``name`` takes:
    a JSON null, a string, or for the integer fields an integer from 0 to INTEGER_FIELDS' bound."""
    kind = F.schema_of_variant(field)
    if name not in INTEGER_FIELDS:
        return field.isNull() | kind.isin("VOID", "STRING")
    number = F.try_variant_get(field, "$", "bigint")
    return field.isNull() | (kind == "VOID") | ((kind == "BIGINT") & number.between(0, INTEGER_FIELDS[name]))


def _malformed(reason: Column) -> Column:
    """A query error naming the line's file and showing the line (its first 80 characters), with why it was
    refused, as the direct directory source's MalformedInputError does."""
    shown = F.when(F.length("line") > 80, F.concat(F.substring("line", 1, 80), F.lit("..."))).otherwise(F.col("line"))
    return F.raise_error(F.concat(F.col("file"), F.lit(": "), reason, F.lit(": '"), shown,
                                  F.lit("'. The query stopped; fix the file and restart the service.")))


def _nulls_marked(column: Column, section: SourceSection) -> Column:
    if section.null_marker is None:
        return column
    return F.when(column == F.lit(section.null_marker), F.lit(None).cast("string")).otherwise(column)


def _epoch_ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
