"""The one Spark data source named "ledgerview": batch reads (streaming/scan.py), the sink
(streaming/sink.py) and the streaming source (streaming/source.py). Spark registers a Python data source by name,
one class per name, so this class composes the parts; each part lives with the layer it belongs to.

    spark.read.format("ledgerview").option("topic", "prices").option("view", "raw").load("data")
    df.writeStream.format("ledgerview").option("path", "data").option("topic", "prices")
      .option("checkpointLocation", "ck").start()
    spark.readStream.format("ledgerview").option("path", "data").option("topic", "prices").load()
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from storage.errors import LedgerviewError
from streaming.rows import SPARK_SCHEMA
from streaming.scan import ScanOptions, TopicScan
from streaming.sink import BatchSink, SinkOptions, StreamSink
from streaming.source import RefusedStream, SourceOptions, TopicStream

NAME = "ledgerview"


class LedgerviewDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TopicScan(ScanOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> BatchSink:
        return BatchSink(SinkOptions.parse(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StreamSink(SinkOptions.parse(self.options, schema, overwrite))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return TopicStream(SourceOptions.parse(self.options))
        except LedgerviewError as error:
            return RefusedStream(error)
