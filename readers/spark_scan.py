"""The Spark SQL batch source over a topic's raw or compacted view (PySpark's Python Data Source reader).

Planning (one Python planner process): pushed filters are folded into ScanFilters, then each log partition the
filters allow becomes one Spark partition; a raw partition larger than ``max_partition_bytes`` is split into runs
of whole segments. The raw view's offset ranges are fixed at planning, so every task reads one consistent cut.

Reading (executor processes): a raw range is read with ``Store.read_batches``; a compacted partition is opened
the way the Reader opens it (readers/partition_read.py: the ledger the cursor names, then the raw tail above its
horizon, up to the end offset planned). With keys pushed down, the compacted ledger part is answered through its
key index instead of a scan. Batches stay Arrow from the segment to Spark.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from readers.partition_read import PartitionRead, open_partition_read
from readers.positions import EARLIEST
from readers.spark_filters import ScanFilters
from readers.spark_rows import SparkRows
from storage import Store
from storage.errors import LedgerviewError
from storage.schema import with_partition_column

VIEWS = ("compacted", "raw")
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024

_STORES: dict[str, tuple[int, Store]] = {}


class InvalidScanOptionError(LedgerviewError):
    def __init__(self, option: str, value: object, allowed: str) -> None:
        super().__init__(f"Option {option}={value!r} is not valid; allowed: {allowed}.")


def cached_store(path: str) -> Store:
    """One Store per data folder per Python worker: workers are reused across tasks, and a Store follows other
    processes' appends and compactions by itself (PartitionLog.refresh). A folder removed and created again at
    the same path (a new inode) gets a new Store."""
    try:
        identity = os.stat(path).st_ino
    except FileNotFoundError:
        identity = -1
    cached = _STORES.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    if cached is not None:
        cached[1].close()
    store = Store.open(path)
    _STORES[path] = (os.stat(path).st_ino, store)
    return store


@dataclass(frozen=True)
class ScanOptions:
    """What ``spark.read.format("ledgerview")`` is asked for."""

    path: str
    topic: str
    view: str
    max_partition_bytes: int

    @classmethod
    def parse(cls, options: Any) -> ScanOptions:
        path, topic = options.get("path"), options.get("topic")
        if not path:
            raise InvalidScanOptionError("path", path, "the data folder of a store, e.g. .load('data')")
        if not topic:
            raise InvalidScanOptionError("topic", topic, "a topic name, e.g. .option('topic', 'prices')")
        view = options.get("view", "compacted")
        if view not in VIEWS:
            raise InvalidScanOptionError("view", view, " or ".join(VIEWS))
        size = options.get("maxPartitionBytes", str(DEFAULT_MAX_PARTITION_BYTES))
        if not size.isdigit() or int(size) < 1:
            raise InvalidScanOptionError("maxPartitionBytes", size, "a positive number of bytes")
        return cls(path, topic, view, int(size))


@dataclass(frozen=True)
class ScanPartition(InputPartition):
    """One Spark task: log partition ``partition``, offsets [start_offset, end_offset)."""

    partition: int
    start_offset: int
    end_offset: int


class TopicScan(DataSourceReader):
    """Batch reads of one topic's view; see the module docstring."""

    def __init__(self, options: ScanOptions) -> None:
        self.options = options
        self.filters = ScanFilters()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.filters, rejected = ScanFilters().accept(filters)
        yield from rejected

    def partitions(self) -> Sequence[InputPartition]:
        store = cached_store(self.options.path)
        count = store.topic_metadata(self.options.topic).partitions
        chosen = [p for p in range(count) if self.filters.partitions is None or p in self.filters.partitions]
        planned: list[InputPartition] = []
        for partition in chosen:
            log = store.partition_log(self.options.topic, partition)
            log.refresh()
            if self.options.view == "compacted":
                planned.append(ScanPartition(partition, 0, log.end_offset))
                continue
            start, end = self.filters.offsets.contains_range(log.log_start_offset, log.end_offset)
            planned += [ScanPartition(partition, low, high)
                        for low, high in segment_runs(log.segments, start, end, self.options.max_partition_bytes)]
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ScanPartition):  # Spark's stand-in when partitions() is empty
            return iter(())
        return self._read(partition)

    def _read(self, planned: ScanPartition) -> Iterator[pa.RecordBatch]:
        store = cached_store(self.options.path)
        rows = SparkRows(self.options.topic)
        for batch in self._stored_batches(store, planned):
            selected = self.filters.apply(rows.convert(batch))
            if selected.num_rows:
                yield selected

    def _stored_batches(self, store: Store, planned: ScanPartition) -> Iterator[pa.RecordBatch]:
        topic, partition = self.options.topic, planned.partition
        if self.options.view == "raw":
            if planned.start_offset < planned.end_offset:
                yield from store.read_batches(topic, partition, planned.start_offset, planned.end_offset)
            return
        read = open_partition_read(store, topic, partition, EARLIEST, read_compacted=True)
        try:
            offsets = self.filters.offsets
            low = 0 if offsets.low is None else offsets.low  # 0 is a bound too: never test bounds by truth
            high = planned.end_offset if offsets.high is None else offsets.high
            read.ledger_start, read.raw_start = max(read.ledger_start, low), max(read.raw_start, low)
            read.end_offset = min(read.end_offset, planned.end_offset, high)
            if self.filters.keys is not None and read.ledger is not None:
                yield from _ledger_lookups(read, self.filters.keys)
                read.ledger.close()
                read.ledger = read.cursor = None
            yield from read.batches()
        finally:
            read.close()


def _ledger_lookups(read: PartitionRead, keys: frozenset[bytes]) -> Iterator[pa.RecordBatch]:
    """The ledger messages of ``keys`` through the ledger's key index, in offset order."""
    assert read.ledger is not None
    found = [hit for key in keys if (hit := read.ledger.lookup(key)) is not None]
    found.sort(key=lambda batch: batch.column("offset")[0].as_py())
    for batch in found:
        yield with_partition_column(batch, read.partition)


def segment_runs(segments: Sequence[Any], start: int, end: int, max_bytes: int) -> list[tuple[int, int]]:
    """Split offsets [start, end) into runs of whole segments of about ``max_bytes`` each (at least one run
    when the range is not empty)."""
    if start >= end:
        return []
    runs: list[tuple[int, int]] = []
    run_start, run_bytes = start, 0
    for index, segment in enumerate(segments):
        following = segments[index + 1].base_offset if index + 1 < len(segments) else end
        if following <= start or segment.base_offset >= end:
            continue
        run_bytes += segment.size_bytes
        if run_bytes >= max_bytes and following < end:
            runs.append((run_start, following))
            run_start, run_bytes = following, 0
    runs.append((run_start, end))
    return runs
