"""The row shape Spark sees for a topic, and the conversion of stored batches into it (columnar, no row loop).

Columns, as Spark's Kafka source has them: ``topic``, ``partition``, ``offset``, ``timestamp`` (Spark
TimestampType, from the stored int64 milliseconds), ``key``, ``value`` (binary), ``headers``. Spark checks a
yielded RecordBatch against ``to_arrow_schema`` of the declared schema exactly (types and nullability), so every
batch is built on ARROW_SCHEMA.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADERS_SPARK_TYPE = ArrayType(StructType([StructField("key", StringType(), False),
                                           StructField("value", BinaryType(), True)]), True)
SPARK_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", HEADERS_SPARK_TYPE, True),
])
ARROW_SCHEMA = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
TIMESTAMP_TYPE = ARROW_SCHEMA.field("timestamp").type
MICROS_PER_MS = 1000


def repeated_string(value: str, count: int) -> pa.Array:
    """``count`` copies of ``value`` as one string array, built from buffers (no Python list)."""
    data = value.encode()
    offsets = np.arange(0, (count + 1) * len(data), len(data), dtype=np.int32) if data else np.zeros(count + 1,
                                                                                                    np.int32)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data * count)])


def timestamp_micros(milliseconds: pa.Array) -> pa.Array:
    """Stored int64 milliseconds as Spark's timestamp (microseconds, UTC)."""
    return pc.multiply(milliseconds, pa.scalar(MICROS_PER_MS, pa.int64())).cast(TIMESTAMP_TYPE)


class SparkRows:
    """Converts MESSAGE_SCHEMA batches of one topic into ARROW_SCHEMA batches; the topic column is cached."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._topic_column = repeated_string(topic, 0)

    def convert(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if len(self._topic_column) < batch.num_rows:
            self._topic_column = repeated_string(self.topic, max(batch.num_rows, 1 << 16))
        headers = batch.column("headers")
        target = ARROW_SCHEMA.field("headers").type
        return pa.RecordBatch.from_arrays(
            [
                self._topic_column.slice(0, batch.num_rows),
                batch.column("partition"),
                batch.column("offset"),
                timestamp_micros(batch.column("timestamp")),
                batch.column("key"),
                batch.column("value"),
                headers if headers.type == target else headers.cast(target),
            ],
            schema=ARROW_SCHEMA,
        )
