"""Filters Spark pushes into a scan of a topic: key equality and IN, partition equality and IN, offset and
timestamp ranges. What is accepted here is applied exactly by the scan (Spark does not re-check it); anything
else is handed back for Spark to evaluate after the scan."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    Not,
)

from streaming.rows import TIMESTAMP_TYPE

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
RANGE_FILTERS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Range:
    """Integers ``low <= x < high``; None is unbounded."""

    low: int | None = None
    high: int | None = None

    def narrowed(self, low: int | None, high: int | None) -> Range:
        return Range(
            low if self.low is None else self.low if low is None else max(self.low, low),
            high if self.high is None else self.high if high is None else min(self.high, high),
        )

    def contains_range(self, start: int, end: int) -> tuple[int, int]:
        """The part of [start, end) inside this range (empty when start >= end)."""
        low = start if self.low is None else max(start, self.low)
        high = end if self.high is None else min(end, self.high)
        return low, max(low, high)

    def mask(self, column: pa.Array, scalar_type: pa.DataType) -> pa.Array | None:
        conditions = []
        if self.low is not None:
            conditions.append(pc.greater_equal(column, pa.scalar(self.low, scalar_type)))
        if self.high is not None:
            conditions.append(pc.less(column, pa.scalar(self.high, scalar_type)))
        if not conditions:
            return None
        return conditions[0] if len(conditions) == 1 else pc.and_(conditions[0], conditions[1])


@dataclass(frozen=True)
class ScanFilters:
    """The pushed filters of one scan, AND-ed."""

    keys: frozenset[bytes] | None = None
    """Only these keys (None: any key)."""
    partitions: frozenset[int] | None = None
    offsets: Range = field(default_factory=Range)
    timestamps_us: Range = field(default_factory=Range)
    """Spark timestamps, microseconds since the epoch."""

    def accept(self, filters: Iterable[Filter]) -> tuple[ScanFilters, list[Filter]]:
        """Fold the filters this scan can apply into a new ScanFilters; return it and the rejected ones."""
        current, rejected = self, []
        for pushed in filters:
            narrowed = current._with(pushed)
            if narrowed is None:
                rejected.append(pushed)
            else:
                current = narrowed
        return current, rejected

    def _with(self, pushed: Any) -> ScanFilters | None:
        if isinstance(pushed, Not):  # the one filter without an attribute: key != ..., offset NOT IN (...)
            return None
        column = pushed.attribute
        if column == ("key",) and isinstance(pushed, (EqualTo, In)):
            values = [pushed.value] if isinstance(pushed, EqualTo) else list(pushed.value)
            if not all(isinstance(value, (bytes, bytearray)) for value in values):
                return None
            keys = frozenset(bytes(value) for value in values)
            return replace(self, keys=keys if self.keys is None else self.keys & keys)
        if column == ("partition",) and isinstance(pushed, (EqualTo, In)):
            values = [pushed.value] if isinstance(pushed, EqualTo) else list(pushed.value)
            if not all(isinstance(value, int) for value in values):
                return None
            chosen = frozenset(values)
            return replace(self, partitions=chosen if self.partitions is None else self.partitions & chosen)
        if column == ("offset",) and isinstance(pushed, RANGE_FILTERS) and isinstance(pushed.value, int):
            return replace(self, offsets=self.offsets.narrowed(*_bounds(pushed, pushed.value)))
        if column == ("timestamp",) and isinstance(pushed, RANGE_FILTERS) and isinstance(pushed.value,
                                                                                        datetime.datetime):
            micros = _micros(pushed.value)
            return replace(self, timestamps_us=self.timestamps_us.narrowed(*_bounds(pushed, micros)))
        return None

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of an ARROW_SCHEMA batch that pass every filter (the batch itself when all do)."""
        masks = [mask for mask in (
            pc.is_in(batch.column("key"), value_set=pa.array(sorted(self.keys), pa.binary()))
            if self.keys is not None else None,
            self.offsets.mask(batch.column("offset"), pa.int64()),
            self.timestamps_us.mask(batch.column("timestamp"), TIMESTAMP_TYPE),
        ) if mask is not None]
        if not masks:
            return batch
        combined = masks[0]
        for mask in masks[1:]:
            combined = pc.and_(combined, mask)
        return batch.filter(combined)


def _bounds(pushed: Any, value: int) -> tuple[int | None, int | None]:
    """[low, high) of ``column op value`` over the columns' 64-bit integers: no bound is past the largest of them,
    so every bound fits the Arrow scalar it is compared as (``value <= Long.MaxValue`` bounds nothing)."""
    above = value + 1 if value < INT64_MAX else None  # None: no 64-bit integer is above value
    if isinstance(pushed, EqualTo):
        return value, above
    if isinstance(pushed, GreaterThan):
        return (above, None) if above is not None else (INT64_MAX, INT64_MAX)
    if isinstance(pushed, GreaterThanOrEqual):
        return value, None
    if isinstance(pushed, LessThan):
        return None, value
    return None, above


def _micros(moment: datetime.datetime) -> int:
    """Microseconds since the epoch; a naive datetime is local time, as PySpark hands timestamps out."""
    aware = moment if moment.tzinfo is not None else moment.astimezone()
    return (aware - EPOCH) // datetime.timedelta(microseconds=1)
