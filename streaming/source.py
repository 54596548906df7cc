"""The Spark streaming source: ``spark.readStream.format("ledgerview")`` over a topic's raw log.

Offsets are per partition, as Spark's Kafka source keeps them: ``{"0": 120, "1": 98}``, each the next offset to
read. The planner runs in one long-lived Python process per query (so the availableNow target survives between
calls); ``read`` runs in executors and hands Arrow batches through.

Options: ``path``, ``topic``, ``startingOffsets`` ("earliest", "latest", or JSON with an offset per partition,
-2 for earliest and -1 for latest, as Kafka's), ``maxRecordsPerTrigger`` (split over partitions in proportion to
what each has waiting), ``failOnDataLoss`` (default true).

Data loss: retention (or delete_records) may delete raw offsets a query has not read yet. With failOnDataLoss the
query fails with DataLossError naming the partition and the lost range; without it the source skips to the log
start and goes on, as Kafka's source does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from readers.spark_rows import SparkRows
from readers.spark_scan import cached_store
from storage import Store
from storage.errors import LedgerviewError, OffsetOutOfRangeError
from streaming.source_offsets import EARLIEST, LATEST, admitted, checked_start


class InvalidSourceOptionError(LedgerviewError):
    def __init__(self, option: str, value: object, allowed: str) -> None:
        super().__init__(f"Option {option}={value!r} is not valid for readStream.format('ledgerview'); "
                         f"allowed: {allowed}.")


@dataclass(frozen=True)
class SourceOptions:
    path: str
    topic: str
    starting: str
    max_records: int | None
    fail_on_data_loss: bool

    @classmethod
    def parse(cls, options: Any) -> SourceOptions:
        path, topic = options.get("path"), options.get("topic")
        if not path or not topic:
            raise InvalidSourceOptionError("path/topic", (path, topic), "both, the store's data folder and a topic")
        starting = options.get("startingOffsets", "latest")
        if starting not in ("earliest", "latest"):
            try:
                parsed = json.loads(starting)
                if not isinstance(parsed, dict) or not all(isinstance(v, int) for v in parsed.values()):
                    raise ValueError
            except ValueError:
                raise InvalidSourceOptionError("startingOffsets", starting,
                                               'earliest, latest or JSON such as {"0": 42, "1": -2}') from None
        limit = options.get("maxRecordsPerTrigger")
        if limit is not None and (not limit.isdigit() or int(limit) < 1):
            raise InvalidSourceOptionError("maxRecordsPerTrigger", limit, "a positive integer")
        fail = options.get("failOnDataLoss", "true").lower()
        if fail not in ("true", "false"):
            raise InvalidSourceOptionError("failOnDataLoss", fail, "true or false")
        return cls(path, topic, starting, int(limit) if limit else None, fail == "true")


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    partition: int
    start_offset: int
    end_offset: int


def _encode(offsets: dict[int, int]) -> dict[str, int]:
    return {str(partition): offset for partition, offset in sorted(offsets.items())}


def _decode(offsets: dict[str, int]) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in offsets.items()}


class TopicStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a topic's raw log; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target: dict[int, int] | None = None
        self.rows = SparkRows(options.topic)

    @property
    def store(self) -> Store:
        return cached_store(self.options.path)

    def _end_offsets(self) -> dict[int, int]:
        topic = self.options.topic
        return {p: self.store.end_offset(topic, p) for p in range(self.store.topic_metadata(topic).partitions)}

    def initialOffset(self) -> dict[str, int]:
        topic, store = self.options.topic, self.store
        ends = self._end_offsets()
        starts = {p: store.start_offset(topic, p) for p in ends}
        if self.options.starting in ("earliest", "latest"):
            return _encode(starts if self.options.starting == "earliest" else ends)
        chosen = {int(p): offset for p, offset in json.loads(self.options.starting).items()}
        unknown = sorted(set(chosen) - set(ends))
        if unknown:
            raise InvalidSourceOptionError("startingOffsets", self.options.starting,
                                           f"partitions 0 to {len(ends) - 1} of {topic}, not {unknown}")
        resolved = {}
        for p in ends:
            offset = chosen.get(p, LATEST)
            resolved[p] = starts[p] if offset == EARLIEST else ends[p] if offset == LATEST else offset
            if not starts[p] <= resolved[p] <= ends[p]:
                raise OffsetOutOfRangeError(topic, p, resolved[p], starts[p], ends[p])
        return _encode(resolved)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._end_offsets()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = _decode(start)
        ends = self.target if self.target is not None else self._end_offsets()
        ends = {p: max(end, begin.get(p, 0)) for p, end in ends.items()}
        if isinstance(limit, ReadMaxRows):
            ends = admitted(begin, ends, limit.max_rows)
        return _encode(ends)

    def reportLatestOffset(self) -> dict[str, int]:
        return _encode(self._end_offsets())

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        begin, stop = _decode(start), _decode(end)
        ranges = []
        for partition, end_offset in sorted(stop.items()):
            start_offset = self._checked_start(partition, begin.get(partition, 0))
            if start_offset < end_offset:
                ranges.append(OffsetRange(partition, start_offset, end_offset))
        return ranges

    def _checked_start(self, partition: int, wanted: int) -> int:
        """``wanted``, or the log start when retention deleted it and failOnDataLoss is off."""
        return checked_start(self.options.topic, partition, wanted,
                             self.store.start_offset(self.options.topic, partition),
                             fail_on_data_loss=self.options.fail_on_data_loss)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())
        return self._read(partition)

    def _read(self, planned: OffsetRange) -> Iterator[pa.RecordBatch]:
        start = self._checked_start(planned.partition, planned.start_offset)
        for batch in self.store.read_batches(self.options.topic, planned.partition, start, planned.end_offset):
            yield self.rows.convert(batch)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the store keeps no per-query state for readers."""

