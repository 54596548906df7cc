"""The Spark sink: ``df.writeStream.format("ledgerview")`` (exactly once per micro-batch) and ``df.write``.

Where each part runs (reference/pyspark-datasource.md, section 3): ``write`` in executor Python workers, once per
task and micro-batch; ``commit``/``abort`` in a fresh Python worker the JVM spawns, with a fresh writer. Nothing is
kept on the writer between them: tasks stage Arrow files named by the batch id, and their commit messages name
them. The commit protocol is streaming/sink_commit.py's ``commit_batch``. With an object-store path
(``s3://bucket/prefix``, a topic on a remote tier alone) tasks upload segments and the commit appends them to the
remote logs by reference instead (streaming/remote_sink.py).

Input columns: ``key`` and ``value`` (binary or string; a null value is a tombstone), optional ``timestamp``
(timestamp or long milliseconds), ``headers`` (array of struct<key string, value binary or string>) and ``partition``
(int). Without ``partition``, a keyed row goes where Kafka's murmur2 partitioner puts it; a keyless row goes to
one partition per task and batch, chosen from both, so that a replayed batch lands where it did.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from storage.errors import LedgerviewError
from storage.files import sink_folder, staged_file_name
from storage.remote_store import is_remote_location
from streaming.options import WRITE, Options
from streaming.remote_sink import UploadedSegments, abort_uploads, commit_uploads, write_task_segments
from streaming.sink_commit import SinkFolders, commit_batch, file_checksum, partition_runs, remove_staged_batch
from streaming.store_cache import cached_readable_store, cached_store

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
ALLOWED_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "key": (BinaryType, StringType),
    "value": (BinaryType, StringType),
    "timestamp": (TimestampType, LongType),
    "headers": (ArrayType,),
    "partition": (IntegerType,),
}


class InvalidSinkError(LedgerviewError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            f"Cannot write to ledgerview: {reason}. Columns allowed: key and value (binary or string), timestamp "
            "(timestamp or long ms), headers (array<struct<key:string,value:binary or string>>), partition (int); "
            "options path (the store's data folder, or an object-store URI such as s3://bucket/prefix for a topic "
            "on a remote tier alone) and topic; output mode append."
        )


@dataclass(frozen=True)
class SinkOptions:
    path: str
    topic: str

    @property
    def remote(self) -> bool:
        """Whether the path is an object store: tasks upload segments, the commit appends them by reference."""
        return is_remote_location(self.path)

    @classmethod
    def parse(cls, options: Any, schema: StructType, overwrite: bool) -> SinkOptions:
        checked = Options(options, WRITE, "writeStream.format('ledgerview') / write.format('ledgerview')")
        path, topic = checked.required("path"), checked.required("topic")
        if overwrite:
            raise InvalidSinkError("a topic is an append-only log; overwrite and complete modes are not supported")
        for column in schema.fields:
            allowed = ALLOWED_TYPES.get(column.name)
            if allowed is None:
                raise InvalidSinkError(f"unknown column {column.name!r}")
            if not isinstance(column.dataType, allowed) or (column.name == "headers"
                                                            and not _headers_type(column.dataType)):
                raise InvalidSinkError(f"column {column.name!r} has type {column.dataType.simpleString()}")
        if "value" not in schema.fieldNames():
            raise InvalidSinkError("a value column is required (null values are tombstones)")
        # a path that is no store, or an unknown topic, fails the query at its start; read-only, so that a
        # mistyped path is not made a data folder
        cached_readable_store(path).topic_metadata(topic)
        return cls(path, topic)


def _headers_type(data_type: DataType) -> bool:
    """Whether a headers column of this type is one the store takes: an array of structs of exactly a string key
    and a binary (or string) value, nullability aside."""
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {field.name: field.dataType for field in data_type.elementType.fields}
    return (fields.keys() == {"key", "value"} and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], (BinaryType, StringType)))


@dataclass
class StagedFiles(WriterCommitMessage):
    """What one task staged for one batch (its files may be none), each file with its CRC-32C."""

    sink_id: str
    batch_id: int
    files: dict[str, int]


def stage_task_rows(options: SinkOptions, sink_id: str, batch_id: int,
                    batches: Iterator[pa.RecordBatch]) -> StagedFiles:
    """Validate and route one task's rows and stage them as one Arrow file named by the batch id, each record
    batch the rows of one target partition, so that the commit takes them without copying.

    The file is not fsynced: the commit reads it in the same boot as this task wrote it (a reboot ends the Spark
    application, and the replay stages anew). Its CRC-32C goes in the message, so that a commit resumed after a
    power loss can tell whether it survived (streaming/sink_commit.py, ``commit_batch`` step 2)."""
    context = TaskContext.get()
    task, attempt = (context.partitionId(), context.attemptNumber()) if context else (0, 0)
    store = cached_store(options.path)
    count = store.topic_metadata(options.topic).partitions
    staging = SinkFolders.of(store, options.topic, sink_id).staging
    staging.mkdir(parents=True, exist_ok=True)
    path = staging / staged_file_name(batch_id, task, attempt, uuid.uuid4().hex[:12])
    rows, writer = 0, None
    with pa.OSFile(str(path), "wb") as sink:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            routed = store.routed(options.topic, batch, keyless_partition=(batch_id + task) % count)
            if writer is None:
                writer = pa.ipc.new_file(sink, routed.schema)
            for run in partition_runs(routed):
                writer.write_table(run)
            rows += routed.num_rows
        if writer is not None:
            writer.close()
    if rows == 0:
        path.unlink()
        return StagedFiles(sink_id, batch_id, {})
    return StagedFiles(sink_id, batch_id, {path.name: file_checksum(path)})


def commit_messages(options: SinkOptions, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
    staged = [message for message in messages if isinstance(message, StagedFiles)]
    if staged:
        commit_batch(cached_store(options.path), options.topic, staged[0].sink_id, batch_id,
                     {name: checksum for message in staged for name, checksum in message.files.items()})


class StreamSink(DataSourceStreamArrowWriter):
    """``writeStream.format("ledgerview")``: exactly once per micro-batch id (invariant 7)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles | UploadedSegments:
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        if batch_id is None or query_id is None:
            raise InvalidSinkError("the streaming writer ran outside a streaming query's task (no batch id)")
        if self.options.remote:
            return write_task_segments(self.options.path, self.options.topic, query_id, int(batch_id), iterator)
        return stage_task_rows(self.options, query_id, int(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.remote:
            commit_uploads(self.options.path, self.options.topic, messages, batchId)
        else:
            commit_messages(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Remove the batch's staged files of this query only (its sink id is in its tasks' messages; other
        queries writing the topic have their own batch ids). A failed task's message is None: what it staged is
        removed by the commit of that batch id's retry or a later one (``_remove_finished_files``). On an object
        store: the batch's uploads that no remote log names."""
        if self.options.remote:
            abort_uploads(self.options.path, self.options.topic, messages)
            return
        store = cached_store(self.options.path)
        for sink_id in {message.sink_id for message in messages if isinstance(message, StagedFiles)}:
            remove_staged_batch(store, self.options.topic, sink_id, batchId)


class BatchSink(DataSourceArrowWriter):
    """``df.write.format("ledgerview")``: the same staging and commit, as one batch of a one-off sink whose
    folder is removed after the commit. A job that dies inside its commit may leave part of its rows appended
    (no one replays a batch job); rerunning it appends them again. On an object store the job records no sink id
    in the remote logs (it would stay in every manifest for nothing: a job's batch is never replayed)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.job_id = f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles | UploadedSegments:
        if self.options.remote:
            return write_task_segments(self.options.path, self.options.topic, None, 0, iterator)
        return stage_task_rows(self.options, self.job_id, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.remote:
            commit_uploads(self.options.path, self.options.topic, messages, 0)
            return
        commit_messages(self.options, messages, 0)
        self.abort(messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Remove the job's sink folder (staged files and record); named by the messages, or by this writer
        when the commit runs on the writer the tasks had. On an object store: the uploads no remote log names."""
        if self.options.remote:
            abort_uploads(self.options.path, self.options.topic, messages)
            return
        jobs = {message.sink_id for message in messages if isinstance(message, StagedFiles)} | {self.job_id}
        root = cached_store(self.options.path).root
        for job in jobs:
            shutil.rmtree(sink_folder(root, self.options.topic, job), ignore_errors=True)

