"""A Spark streaming source that reads topics from any Kafka cluster with kafka-python: no JVM connector jar.

    spark.dataSource.register(KafkaSource)
    spark.readStream.format("ledgerview-kafka")
        .option("kafka.bootstrap.servers", "host:9092")   # or "bootstrap.servers"
        .option("subscribe", "orders,payments")           # one topic or several, comma-separated
        .option("startingOffsets", "earliest")            # "latest", or JSON {"orders": {"0": 42, "1": -2}, ...}
        .option("maxOffsetsPerTrigger", "100000")         # optional: messages per micro-batch, over all partitions
        .option("failOnDataLoss", "true")                 # default; see below
        .load()

Rows have Spark's Kafka-source columns: key, value, topic, partition, offset, timestamp, timestampType, headers;
the timestamp is milliseconds since the epoch (a long), as in ledgerview's message model.
In startingOffsets JSON, -2 means earliest and -1 latest, as in Spark's Kafka source, which also requires the JSON to
name every partition of every subscribed topic and no other topic.

Offsets live in the Spark checkpoint: a micro-batch's end offsets are JSON ``{topic: {partition: next offset}}``,
written by Spark before the batch runs, so a restarted query reads exactly the same ranges again and then goes on
from their end. Together with an idempotent sink (ledgerview's, by batch id) a topic is mirrored exactly once.
Ranges may contain gaps (compacted topics, transaction markers): a partition's read ends when the consumer's
position reaches the range's end, not after a count of messages. ``trigger(availableNow=True)`` reads up to the
end offsets at the start, in micro-batches of at most maxOffsetsPerTrigger messages.

Data loss: retention (or DeleteRecords) on the cluster may delete offsets a query has not read yet, when it plans
a micro-batch or while a task reads one. With failOnDataLoss (the default) the query fails with DataLossError
naming the partition and the lost range; without it the read skips to the partition's first offset and goes on,
as Spark's Kafka source does. A partition that now ends below the query's position (the topic was deleted and
created again) is data loss too: TopicRecreatedError, or without failOnDataLoss the partition is read again from its
first offset. A partition added to a topic after the query started is read from its beginning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetOutOfRangeError
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from storage.errors import LedgerviewError
from streaming.options import KAFKA_READ, InvalidOptionError, Options, resolve_offsets
from streaming.source import RefusedStream
from streaming.source_offsets import EARLIEST, LATEST, TopicRecreatedError, admitted, checked_start

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", LongType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])
ARROW_SCHEMA = to_arrow_schema(SCHEMA)
POLL_TIMEOUT_MS = 500
READ_TIMEOUT_POLLS = 120
"""Empty polls in a row after which a read gives up on reaching its range's end (a minute)."""
WHERE = "readStream.format('ledgerview-kafka')"
Offsets = dict[str, dict[str, int]]
"""{topic: {partition (a string, for JSON): offset}}: the next offset to read per partition."""


class KafkaReadError(LedgerviewError):
    def __init__(self, topic: str, partition: int, position: int, end: int) -> None:
        super().__init__(f"Reading {topic}-{partition} stopped at offset {position} before the end of its range "
                         f"{end}: the cluster returned nothing for a minute. Check the cluster and restart the query "
                         "(its checkpoint makes it read the same range again).")


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, checked once when the query starts."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str | Mapping[str, Mapping[str, int]]
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> SourceOptions:
        options = Options(given, KAFKA_READ, WHERE)
        servers = options.get("kafka.bootstrap.servers") or options.get("bootstrap.servers")
        if not servers:
            raise options.invalid("kafka.bootstrap.servers", servers)
        topics = tuple(t.strip() for t in (options.get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise options.invalid("subscribe", options.get("subscribe"))
        starting = options.offsets("startingOffsets", "latest", words=("earliest", "latest"))
        return cls(servers, topics,
                   starting if isinstance(starting, str) else
                   {topic: {str(p): o for p, o in parts.items()} for topic, parts in starting.items()},
                   options.positive("maxOffsetsPerTrigger"), options.flag("failOnDataLoss", True))


class KafkaSource(DataSource):
    """``format("ledgerview-kafka")``: Kafka topics as a Spark stream (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "ledgerview-kafka"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return KafkaStreamReader(SourceOptions.parse(self.options))
        except LedgerviewError as error:
            return RefusedStream(error)


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One partition's offsets [start, end) of one micro-batch: one Spark task."""

    bootstrap_servers: str
    topic: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: KafkaConsumer | None = None
        self._target: Offsets | None = None

    # ------------------------------------------------------------------------------------- offsets (driver)
    def initialOffset(self) -> Offsets:
        """Where the query starts: every partition's earliest or latest offset, or the JSON's. As Spark's Kafka
        source requires, the JSON names every partition of every subscribed topic and no other topic, and an
        explicit offset lies within the partition (one below its first offset is data loss when read)."""
        latest = self._end_offsets()
        earliest = self._beginning_offsets()
        starting = self.options.starting_offsets
        if isinstance(starting, str):
            return earliest if starting == "earliest" else latest
        unknown = sorted(set(starting) - set(latest))
        if unknown:
            raise InvalidOptionError(WHERE, "startingOffsets", dict(starting),
                                     f"JSON naming the subscribed topics only ({', '.join(sorted(latest))}; not "
                                     f"{', '.join(unknown)})")
        offsets: Offsets = {}
        for topic, ends in latest.items():
            last = {int(p): end for p, end in ends.items()}
            first = {int(p): offset for p, offset in earliest[topic].items()}
            chosen = {int(p): offset for p, offset in starting.get(topic, {}).items()}
            resolved = resolve_offsets(WHERE, "startingOffsets", chosen, topic, earliest=first, latest=last,
                                       allowed_codes=(EARLIEST, LATEST), past_end=partial(_past_end, topic, last))
            offsets[topic] = {str(p): offset for p, offset in sorted(resolved.items())}
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._end_offsets()

    def reportLatestOffset(self) -> Offsets:
        return self._end_offsets()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """The end of the next micro-batch: every partition's end (or the availableNow target), then at most
        ``max_rows`` messages over all partitions (``admitted``); a partition added since the start from its
        beginning."""
        ends = self._target if self._target is not None else self._end_offsets()
        earliest = self._beginning_offsets()
        current = {(t, p): self._continued(t, p, start.get(t, {}).get(p, earliest[t][p]), end, earliest[t][p])
                   for t, parts in ends.items() for p, end in parts.items()}
        stops = {(t, p): max(end, current[(t, p)]) for t, parts in ends.items() for p, end in parts.items()}
        if isinstance(limit, ReadMaxRows):
            stops = admitted(current, stops, limit.max_rows)
        return {t: {p: stops[(t, p)] for p in parts} for t, parts in ends.items()}

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaRange]:
        """One range per partition with messages to read; a start below the partition's first offset is data
        loss (see the module docstring), and a partition added since the start is read from its beginning."""
        ranges = []
        planned = [TopicPartition(topic, int(partition)) for topic, parts in end.items() for partition in parts]
        earliest = _by_topic(self._client().beginning_offsets(planned))
        fail = self.options.fail_on_data_loss
        for topic, parts in end.items():
            for partition, stop in parts.items():
                first = earliest[topic][partition]
                wanted = self._continued(topic, partition, start.get(topic, {}).get(partition, first), stop, first)
                begin = checked_start(topic, int(partition), wanted, first, fail_on_data_loss=fail)
                if begin < stop:
                    ranges.append(KafkaRange(self.options.bootstrap_servers, topic, int(partition), begin, stop, fail))
        return ranges

    def _continued(self, topic: str, partition: str, position: int, end: int, first: int) -> int:
        """Where a partition's range up to ``end`` begins: at ``position``, unless the partition now ends below it
        (the topic was deleted and created again, or the cluster lost messages): data loss, TopicRecreatedError
        with failOnDataLoss, else the partition's first offset ``first``, as Spark's Kafka source reports it."""
        if end >= position:
            return position
        if self.options.fail_on_data_loss:
            raise TopicRecreatedError(topic, int(partition), position, end)
        return first

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the offsets are in Spark's checkpoint, and Kafka keeps the data."""

    def stop(self) -> None:
        """The query stopped: close the planner's connection to the cluster."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _client(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=self.options.bootstrap_servers, group_id=None,
                                           enable_auto_commit=False)
        return self._consumer

    def _topic_partitions(self) -> list[TopicPartition]:
        client = self._client()
        found = []
        for topic in self.options.topics:
            partitions = client.partitions_for_topic(topic)
            if not partitions:
                raise InvalidOptionError(WHERE, "subscribe", topic,
                                         "topics that exist on the cluster")
            found += [TopicPartition(topic, p) for p in sorted(partitions)]
        return found

    def _end_offsets(self) -> Offsets:
        return _by_topic(self._client().end_offsets(self._topic_partitions()))

    def _beginning_offsets(self) -> Offsets:
        return _by_topic(self._client().beginning_offsets(self._topic_partitions()))

    # ------------------------------------------------------------------------------------ reading (executors)
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(partition)


def _by_topic(offsets: Mapping[TopicPartition, int]) -> Offsets:
    result: Offsets = {}
    for tp, offset in offsets.items():
        result.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
    return result


def read_range(kafka_range: KafkaRange) -> Iterator[pa.RecordBatch]:
    """The messages of [start, end) of one partition, one record batch per poll.

    The consumer has no reset policy: a position that retention deleted while the task read raises, and is data
    loss (``checked_start``), never kafka-python's silent jump to either end of the partition."""
    consumer = KafkaConsumer(bootstrap_servers=kafka_range.bootstrap_servers, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="none")
    try:
        target = TopicPartition(kafka_range.topic, kafka_range.partition)
        consumer.assign([target])
        consumer.seek(target, kafka_range.start)
        empty_polls = 0
        while consumer.position(target) < kafka_range.end:
            try:
                polled = consumer.poll(timeout_ms=POLL_TIMEOUT_MS).get(target, [])
            except OffsetOutOfRangeError:
                position, first = consumer.position(target), consumer.beginning_offsets([target])[target]
                if position >= first:  # out of range for another reason than retention: nothing to skip
                    raise
                consumer.seek(target, checked_start(kafka_range.topic, kafka_range.partition, position, first,
                                                    fail_on_data_loss=kafka_range.fail_on_data_loss))
                continue
            records = [record for record in polled if record.offset < kafka_range.end]
            if not records:
                empty_polls += 1
                if empty_polls >= READ_TIMEOUT_POLLS:
                    raise KafkaReadError(kafka_range.topic, kafka_range.partition, consumer.position(target),
                                         kafka_range.end)
                continue
            empty_polls = 0
            yield _record_batch(kafka_range.topic, kafka_range.partition, records)
            if records[-1].offset + 1 >= kafka_range.end:
                break
    finally:
        consumer.close()


def _record_batch(topic: str, partition: int, records: list[Any]) -> pa.RecordBatch:
    count = len(records)
    return pa.RecordBatch.from_arrays([
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp for r in records], pa.int64()),
        pa.array([r.timestamp_type for r in records], pa.int32()),
        pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records],
                 ARROW_SCHEMA.field("headers").type),
    ], schema=ARROW_SCHEMA)


def _past_end(topic: str, last: dict[int, int], partition: int, offset: int) -> InvalidOptionError:
    """The error of a startingOffsets offset past its partition's end."""
    return InvalidOptionError(WHERE, "startingOffsets", offset,
                              f"an offset of {topic}-{partition} up to its end, {last[partition]}, or -2 / -1")
