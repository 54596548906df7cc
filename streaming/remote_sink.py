"""The Spark sink to a topic on an object store (``option("path", "s3://bucket/prefix")``): tasks write segments
straight to the tier, the driver commits them by reference; no row passes through the driver.

A task validates and routes its rows as the sink to a data folder does (Store.routed, then Store.append's checks,
timestamps and codec) into a scratch store in a temporary folder on its own disk, whose topic has the remote
topic's partitions and config: each log partition it got rows for becomes one or more segments in the local
segment format, offsets from 0, rolled at the topic's segment.bytes. It uploads each to fresh keys
(``<topic>-<p>/segments/…``, storage/remote_log.py's ``RemoteLog.upload``) and returns a commit message naming
them (``UploadedSegments``: keys, rows, bytes, first and max timestamp; a few hundred bytes per segment).

The commit (``commit_uploads``, in a Python worker on the driver) appends, per log partition, the tasks' segments in
task order to the partition's remote log with ``change_unowned``: each placed at the log's end by its manifest
entry (``offset_shift``), and the sink's last committed batch (``sinks[query id]``) published in the same manifest.
A partition whose remote log already records this batch or a later one is skipped, so a batch replayed after a
crash (anywhere: before, between or after the partitions' publishes, before Spark's own commit log) is appended
exactly once per partition. The objects of a replay that are not published, or of an aborted batch, are deleted
(best effort; ``RemoteLog.remove_unreferenced`` sweeps what a crash left after the grace period).

That sweep (a Spark compaction's publish: no retention runs on a topic on the tier alone) deletes objects no
manifest names once they are ``remote.unpublished.delete.delay.ms`` old (a day by default), and cannot tell a
crashed upload from one whose batch is still running. So a commit publishes only when the batch's first upload is
younger than half that period (storage/remote_log.py ``may_still_publish``; the other half is for the publishes
themselves and for clock skew); an older batch is refused before any partition is published, and its uploads
deleted: the write fails instead of publishing segments a sweep may have deleted.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from storage import Store
from storage.config import TopicConfig
from storage.errors import LedgerviewError
from storage.remote_log import PUBLISH_WITHIN_SHARE, RemoteLog, RemoteLogManifest, change_unowned, may_still_publish
from storage.remote_segment import RemoteSegmentInfo
from storage.remote_store import RemoteStore, wall_clock_ms
from streaming.sink_commit import crash_jvm_at
from streaming.store_cache import cached_remote_store

SCRATCH_DROPPED_CONFIG = ("remote.storage.enable",)
"""Topic config the scratch store must not take: it has no remote tier of its own."""


class SinkBatchTooOldError(LedgerviewError):
    def __init__(self, topic: str, batch_id: int, age_ms: int, delay_ms: int, *, streaming: bool) -> None:
        again = "restart the query: it writes the batch again" if streaming else "run the write again"
        super().__init__(
            f"Batch {batch_id} of the sink to {topic}: its first segment was uploaded {age_ms} ms before its commit, "
            f"more than {PUBLISH_WITHIN_SHARE:.0%} of the topic's remote.unpublished.delete.delay.ms={delay_ms}, "
            "after which a sweep may delete uploads no manifest names yet. Nothing of it was published, and its "
            "uploads are deleted (any left are swept later). Make the batches shorter (a source's "
            "maxOffsetsPerTrigger or maxFilesPerTrigger), or write to a topic created with a longer period, then "
            f"{again}."
        )


@dataclass
class UploadedSegments(WriterCommitMessage):
    """What one task uploaded for one batch: per log partition, its segments in offset order, each numbered from
    the task's own offset 0 (``base_offset``/``next_offset`` local to the task, ``offset_shift`` 0)."""

    sink_id: str | None
    """The streaming query's id, recorded in the remote log with the batch; None for ``df.write``."""
    batch_id: int
    segments: dict[int, list[RemoteSegmentInfo]]
    uploaded_ms: int
    """The task's clock when it started its first upload (the commit's measure of how old its objects are)."""


def write_task_segments(uri: str, topic: str, sink_id: str | None, batch_id: int,
                        batches: Iterator[pa.RecordBatch]) -> UploadedSegments:
    """Validate, route and write one task's rows as segments, upload them, and name them in the commit message."""
    context = TaskContext.get()
    task = context.partitionId() if context else 0
    remote = cached_remote_store(uri)
    metadata = remote.topic_metadata(topic)
    keyless_partition = (batch_id + task) % metadata.partitions
    with tempfile.TemporaryDirectory(prefix="ledgerview-sink-") as folder, Store.open(folder) as scratch:
        scratch.create_topic(topic, metadata.partitions, scratch_config(metadata.config))
        touched: set[int] = set()
        for batch in batches:
            if batch.num_rows:
                routed = scratch.routed(topic, batch, keyless_partition=keyless_partition)
                scratch.append(topic, routed)
                touched.update(pc.unique(routed.column("partition")).to_pylist())
        uploaded_ms = wall_clock_ms()
        uploaded = {partition: upload_partition(scratch, remote, topic, partition) for partition in sorted(touched)}
    return UploadedSegments(sink_id, batch_id, uploaded, uploaded_ms)


def scratch_config(config: TopicConfig) -> dict[str, str]:
    return {key: value for key, value in config.to_overrides().items() if key not in SCRATCH_DROPPED_CONFIG}


def upload_partition(scratch: Store, remote: RemoteStore, topic: str, partition: int) -> list[RemoteSegmentInfo]:
    """Seal the scratch partition's segments and upload each to fresh keys of the remote log's partition."""
    scratch.roll(topic, partition)
    log = RemoteLog(remote.objects, topic, partition)
    return [log.upload(segment) for segment in scratch.partition_log(topic, partition).segments
            if segment.size_bytes]


def commit_uploads(uri: str, topic: str, messages: Sequence[WriterCommitMessage | None], batch_id: int, *,
                   clock: Callable[[], int] = wall_clock_ms) -> None:
    """Append the batch's uploaded segments to each partition's remote log, in task order, exactly once per
    partition for a streaming sink (see the module's docstring); then delete the uploads no manifest took."""
    uploads = [message for message in messages if isinstance(message, UploadedSegments) and message.segments]
    remote = cached_remote_store(uri)
    sink_id = uploads[0].sink_id if uploads else None
    delay_ms = remote.topic_metadata(topic).config.remote_unpublished_delete_delay_ms
    first_upload_ms = min((upload.uploaded_ms for upload in uploads), default=0)
    if uploads and not may_still_publish(first_upload_ms, now_ms := clock(), delay_ms):
        remove_unpublished(remote, topic, uploads)
        raise SinkBatchTooOldError(topic, batch_id, now_ms - first_upload_ms, delay_ms,
                                   streaming=sink_id is not None)
    for partition in sorted({partition for upload in uploads for partition in upload.segments}):
        infos = [info for upload in uploads for info in upload.segments.get(partition, [])]
        change_unowned(RemoteLog(remote.objects, topic, partition),
                       functools.partial(appended, infos=infos, sink_id=sink_id, batch_id=batch_id), wall_clock_ms)
        crash_jvm_at("sink.remote.commit.after_partition")
    crash_jvm_at("sink.remote.commit.after_published")
    remove_unpublished(remote, topic, uploads)


def appended(manifest: RemoteLogManifest, infos: list[RemoteSegmentInfo], sink_id: str | None,
             batch_id: int) -> RemoteLogManifest:
    """``manifest`` with ``infos`` placed at its end and the sink's batch recorded; ``manifest`` itself (no change)
    when it records this batch or a later one of the sink already."""
    if sink_id is not None and manifest.sinks.get(sink_id, -1) >= batch_id:
        return manifest
    placed, base = [], manifest.end_offset
    for info in infos:
        placed.append(replace(info, base_offset=base, next_offset=base + info.next_offset - info.base_offset,
                              offset_shift=base - info.base_offset))
        base = placed[-1].next_offset
    sinks = manifest.sinks if sink_id is None else {**manifest.sinks, sink_id: batch_id}
    return replace(manifest, segments=manifest.segments + tuple(placed), sinks=sinks)


def remove_unpublished(remote: RemoteStore, topic: str, uploads: list[UploadedSegments]) -> None:
    """Delete the uploaded objects the partition's remote log does not name (a replay's copies of a batch already
    committed, an aborted batch); errors are left to the sweep (``RemoteLog.remove_unreferenced``)."""
    for partition in sorted({partition for upload in uploads for partition in upload.segments}):
        log = RemoteLog(remote.objects, topic, partition)
        with contextlib.suppress(LedgerviewError):
            latest = log.latest()
            named = latest.object_keys if latest else set()
            for upload in uploads:
                for info in upload.segments.get(partition, []):
                    for key in info.object_keys:
                        if key not in named:
                            remote.objects.delete(key)


def abort_uploads(uri: str, topic: str, messages: Sequence[WriterCommitMessage | None]) -> None:
    """Spark gave up the batch: delete what its tasks uploaded and no remote log names. A failed task sent no
    message; its objects are swept after the grace period."""
    remove_unpublished(cached_remote_store(uri), topic,
                       [message for message in messages if isinstance(message, UploadedSegments)])
