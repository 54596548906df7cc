"""Two-phase compaction of a remote tier's topic as Spark work (``compact_with_spark``): the same compacted view
the single-process compactor (compactor/) writes, computed by executors that read and write the object store
themselves; the driver plans and publishes, and no message passes through it.

- Plan (driver): per log partition, the remote log's manifest now (its version is pinned: every task reads the
  segments and the previous ledger it names, which stay readable for ``file.delete.delay.ms`` after a newer
  manifest) and the input cut into tasks of about ``task_bytes``: the previous ledger's batches, then the raw
  segments above its horizon up to the end offset. An incremental run reads the previous ledger and what is new.
- Phase one: each task reads its range and emits (partition, key, 2 * offset + live) columns; Spark
  hash-partitions them by (partition, key) and keeps each key's latest offset (a ``max`` of that number per key,
  in its hash aggregation, which spills to a sort when a task's keys outgrow its memory). Keys whose latest
  message is a tombstone drop out (one more aggregation, which also counts the live keys, sums up where their
  tombstones lie for the view's ``dropped_tombstones``); keyless messages are kept when
  ``compaction.retain.null.key`` says so. The result is persisted: both writes below read it.
- Phase two: the kept offsets, range-partitioned by (partition, offset) and sorted: each task reads the messages
  of its offset range from the tier, keeps exactly its offsets, and writes one ledger object per log partition in
  the segment batch format, in batches bounded as the local compactor bounds them. The live keys,
  range-partitioned by (partition, key) and sorted, are written the same way as flat key index pieces with
  disjoint key ranges (storage/remote_key_index.py).
- Publish (driver): per partition, the pieces' object keys and batch headers become the manifest's compacted
  view, published with the create-once write of the remote log (storage/remote_log.py ``change_unowned``); a
  run that finds another ledger published since it planned is refused, not merged, and so is a run that took
  more than half of ``remote.unpublished.delete.delay.ms`` (a sweep deletes objects no manifest names once they
  are that old). Then objects no manifest needs any more are swept.

It works on remote logs that no data folder owns (epoch 0: those a Spark sink with an object-store path writes);
a data folder's tiered partitions are compacted by that folder's compactor.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compactor import CompactionResult
from storage.codec import BatchHeader, encode_batch
from storage.config import TopicConfig
from storage.dropped_tombstones import Ranges, after_run, merged
from storage.errors import LedgerviewError, WriterConflictError
from storage.files import KEY_INDEX_SUFFIX, LEDGER_SUFFIX
from storage.ledger import BATCH_BYTES, bounded_slices
from storage.remote_key_index import sorted_run_entries, write_flat_key_index
from storage.remote_ledger import KeyIndexPiece, RemoteCompactedView, RemoteLedger
from storage.remote_log import (
    PUBLISH_WITHIN_SHARE,
    RemoteLog,
    RemoteLogManifest,
    RemoteLogOwnedError,
    change_unowned,
    may_still_publish,
)
from storage.remote_segment import RemoteSegments
from storage.remote_store import RemoteStore, wall_clock_ms
from storage.segment import batches_of_segments
from streaming.scan import MIN_PIECE_BYTES, segment_runs
from streaming.store_cache import cached_remote_store

INPUT_SCHEMA = "partition int, version long, start long, end long"
MESSAGES_SCHEMA = "partition int, key binary, number long"
LEDGER_PIECE_SCHEMA = "partition int, object string, first_offset long, rows long, bytes long, batches string"
KEY_PIECE_SCHEMA = "partition int, object string, first_key binary, bytes long"
SUMMARY_BUCKETS = 1024
"""Stretches of a partition's offsets whose tombstones left out are summed up as one range each (then merged to
storage/dropped_tombstones.py's MAX_RANGES on the driver)."""


class CompactionConflictError(WriterConflictError):
    def __init__(self, topic: str, partition: int, planned: int | None, found: int | None) -> None:
        super().__init__(
            f"Another compaction of {topic}-{partition} published ledger {found} while this one, planned on "
            f"ledger {planned}, ran: its work is dropped (its objects are swept later). Run it again to compact "
            f"what is new since."
        )


class CompactionRunTooOldError(LedgerviewError):
    def __init__(self, topic: str, age_ms: int, delay_ms: int) -> None:
        super().__init__(
            f"A Spark compaction of {topic} ran {age_ms} ms before it could publish, more than "
            f"{PUBLISH_WITHIN_SHARE:.0%} of the topic's remote.unpublished.delete.delay.ms={delay_ms}, after which a "
            "sweep may delete the objects it wrote before a manifest names them. Nothing was published, and its "
            "objects are deleted (any left are swept later). Compact fewer partitions a run (partitions=...), then "
            "run it again."
        )


class InvalidTaskBytesError(LedgerviewError):
    def __init__(self, task_bytes: int) -> None:
        self.task_bytes = task_bytes
        super().__init__(f"task_bytes={task_bytes} cannot size the tasks of a Spark compaction; allowed: a positive "
                         "number of bytes, or None for the topic's compaction.memory.bytes.")


@dataclass(frozen=True)
class DistributedCompactionResult(CompactionResult):
    """What the Spark job did to one partition (``passes``: 1, or 0 for a skipped run; Spark's aggregation spills
    instead of splitting)."""

    ledger_pieces: int = 0
    """Objects the ledger was written in, one per phase-two task that had offsets of the partition."""
    key_index_pieces: int = 0


class LedgerBatch(NamedTuple):
    """A ledger batch as ``segment_runs`` cuts a log: where it starts and its bytes."""

    base_offset: int
    size_bytes: int


@dataclass(frozen=True)
class _Plan:
    """One log partition's run: the manifest it reads, the ranges of its phase one, the ledger it writes."""

    partition: int
    manifest: RemoteLogManifest
    raw_start: int
    input_bytes: int
    messages_read: int

    @property
    def ledger_id(self) -> int:
        return self.manifest.compacted.ledger_id + 1 if self.manifest.compacted else 1

    def ranges(self, piece_bytes: int) -> list[tuple[int, int]]:
        """Phase one's offset ranges of about ``piece_bytes``: the previous ledger's, then the raw log's."""
        manifest, previous = self.manifest, self.manifest.compacted
        ranges = segment_runs(manifest.segments, self.raw_start, manifest.end_offset, piece_bytes)
        if previous is not None and previous.batches:
            batches = [LedgerBatch(*batch[:2]) for batch in previous.batches]
            ranges = segment_runs(batches, batches[0].base_offset, previous.horizon + 1, piece_bytes) + ranges
        return ranges


def compact_with_spark(spark: SparkSession, uri: str, topic: str, *, task_bytes: int | None = None,
                       partitions: list[int] | None = None) -> list[DistributedCompactionResult]:
    """Compact ``topic`` of the remote tier at ``uri`` (every partition, or ``partitions``) as one Spark job.
    ``task_bytes``: the input one task takes on, at least 1 (default: the topic's ``compaction.memory.bytes``); a
    partition larger than it is spread over several tasks in both phases."""
    if task_bytes is not None and task_bytes < 1:
        raise InvalidTaskBytesError(task_bytes)
    store = RemoteStore.open(uri, manifest_max_age_ms=0)
    config = store.topic_metadata(topic).config
    budget = task_bytes or config.compaction_memory_bytes
    chosen = range(store.topic_metadata(topic).partitions) if partitions is None else sorted(set(partitions))
    plans, results = [], []
    for partition in chosen:
        plan = _plan(store, topic, partition)
        if plan is None:
            view = store.manifest(topic, partition).compacted
            results.append(DistributedCompactionResult(partition, view.ledger_id if view else None,
                                                       view.horizon if view else -1, 0,
                                                       view.messages_kept if view else 0,
                                                       view.ledger_bytes if view else 0, 0, skipped=True,
                                                       layers=1 if view else 0))
        else:
            plans.append(plan)
    if not plans:
        return results
    parallelism = spark.sparkContext.defaultParallelism
    started_ms = wall_clock_ms()  # before any object is written
    latest, messages = _phase_one(spark, uri, topic, plans, budget, parallelism,
                                  retain_null_key=config.compaction_retain_null_key)
    try:
        live, kept = _kept(latest, messages, retain_null_key=config.compaction_retain_null_key)
        stats, dropped = _summary(latest, max(plan.manifest.end_offset for plan in plans))
        # The ledger also keeps the keyless messages it retains: count them (from phase one's persisted output).
        kept_rows = stats["rows"] + (messages.where(F.col("key").isNull()).count()
                                     if config.compaction_retain_null_key else 0)
        input_bytes = sum(plan.input_bytes for plan in plans)
        message_bytes = input_bytes / max(1, sum(plan.messages_read for plan in plans))
        ledger_tasks = task_count(int(kept_rows * message_bytes), budget, parallelism, kept_rows)
        key_tasks = task_count((stats["key_bytes"] or 0) + 12 * stats["rows"], budget, parallelism, stats["rows"])
        compression = config.compression_type if config.compression_type in ("lz4", "zstd") else None
        versions = {plan.partition: (plan.manifest.version, plan.ledger_id) for plan in plans}
        ledger_rows = kept.repartitionByRange(ledger_tasks, "partition", "offset") \
            .sortWithinPartitions("partition", "offset") \
            .mapInArrow(_ledger_piece_writer(uri, topic, versions, compression), LEDGER_PIECE_SCHEMA).collect()
        key_rows = live.repartitionByRange(key_tasks, "partition", "key").sortWithinPartitions("partition", "key") \
            .mapInArrow(_key_piece_writer(uri, topic, versions), KEY_PIECE_SCHEMA).collect()
    finally:
        latest.unpersist()
        messages.unpersist()
    if not may_still_publish(started_ms, now_ms := wall_clock_ms(), config.remote_unpublished_delete_delay_ms):
        for row in ledger_rows + key_rows:
            with contextlib.suppress(LedgerviewError):  # what stays is swept as unnamed
                store.objects.delete(row["object"])
        raise CompactionRunTooOldError(topic, now_ms - started_ms, config.remote_unpublished_delete_delay_ms)
    for plan in plans:
        results.append(_publish(store, topic, plan, [row for row in ledger_rows if row["partition"] == plan.partition],
                                [row for row in key_rows if row["partition"] == plan.partition],
                                dropped.get(plan.partition, ()), config))
    return sorted(results, key=lambda result: result.partition)


def task_count(total_bytes: int, budget: int, parallelism: int, items: int | None = None) -> int:
    """Tasks for ``total_bytes`` of work, as Spark sizes file splits: none over ``budget``, and one per core
    (``parallelism``) when each still gets MIN_PIECE_BYTES; never more than the ``items`` the work is made of
    (messages, keys), since a task gets at least one whole (a budget below one message's bytes cut a stage into
    a task per byte, nearly all of them empty)."""
    count = max(1, math.ceil(total_bytes / budget), min(parallelism, total_bytes // MIN_PIECE_BYTES))
    return count if items is None else max(1, min(count, items))


def _plan(store: RemoteStore, topic: str, partition: int) -> _Plan | None:
    """The partition's run, or None when nothing is above its horizon. A log a data folder claimed is refused
    here, before any task uploads into it (its publish would be refused anyway)."""
    manifest = store.manifest(topic, partition)
    if manifest.epoch:
        raise RemoteLogOwnedError(topic, partition, manifest.epoch)
    previous = manifest.compacted
    horizon = previous.horizon if previous else -1
    raw_start = max(horizon + 1, manifest.log_start_offset)
    if manifest.end_offset <= raw_start:
        return None
    input_bytes = sum(segment.size_bytes for segment in manifest.segments if segment.next_offset > raw_start)
    input_bytes += previous.ledger_bytes if previous else 0
    messages = (previous.messages_kept if previous else 0) + manifest.end_offset - raw_start
    return _Plan(partition, manifest, raw_start, input_bytes, messages)


def _phase_one(spark: SparkSession, uri: str, topic: str, plans: list[_Plan], budget: int, parallelism: int, *,
               retain_null_key: bool) -> tuple[DataFrame, DataFrame]:
    """Every key with its latest message's number, ``last`` (persisted), and the tasks' output (persisted when
    keyless messages are kept: both the count of them and the ledger's tasks read it, and the input is read
    once)."""
    input_bytes = sum(plan.input_bytes for plan in plans)
    aggregation_tasks = task_count(input_bytes, budget, parallelism, sum(plan.messages_read for plan in plans))
    piece_bytes = math.ceil(input_bytes / aggregation_tasks)
    rows = [(plan.partition, plan.manifest.version, start, end) for plan in plans
            for start, end in plan.ranges(piece_bytes)]
    tasks = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), INPUT_SCHEMA)
    messages = tasks.mapInArrow(_message_reader(uri, topic), MESSAGES_SCHEMA)
    if retain_null_key:
        messages = messages.persist(StorageLevel.MEMORY_AND_DISK)
    # One long per message, 2 * offset + (1 if live): its max is the key's latest message and says whether it is
    # live, and a max of a long aggregates in Spark's hash aggregation (a max of a struct would sort every row).
    latest = messages.where(F.col("key").isNotNull()).repartition(aggregation_tasks, "partition", "key") \
        .groupBy("partition", "key").agg(F.max("number").alias("last")).persist(StorageLevel.MEMORY_AND_DISK)
    return latest, messages


def _kept(latest: DataFrame, messages: DataFrame, *, retain_null_key: bool) -> tuple[DataFrame, DataFrame]:
    """The live keys with their latest offsets, and every offset the ledger keeps."""
    live = latest.where((F.col("last") % 2) == 1).select("partition", "key", F.shiftright("last", 1).alias("offset"))
    kept = live.select("partition", "offset")
    if retain_null_key:
        kept = kept.unionByName(messages.where(F.col("key").isNull())
                                .select("partition", F.shiftright("number", 1).alias("offset")))
    return live, kept


def _summary(latest: DataFrame, end_offset: int) -> tuple[dict[str, int], dict[int, Ranges]]:
    """The live keys' count and key bytes, and per partition where the tombstones this run leaves out lie
    (storage/dropped_tombstones.py), from one aggregation of phase one's result: each partition's offsets are cut
    into at most SUMMARY_BUCKETS stretches, and a stretch's tombstones, first to last, become one range, merged on
    the driver. No row goes through Python."""
    width = end_offset // SUMMARY_BUCKETS + 1
    offset, live = F.shiftright("last", 1), (F.col("last") % 2) == 1
    rows = latest.groupBy("partition", F.floor(offset / width)).agg(
        F.count(F.when(live, 1)).alias("rows"), F.sum(F.when(live, F.length("key"))).alias("key_bytes"),
        F.min(F.when(~live, offset)).alias("first"), F.max(F.when(~live, offset)).alias("last")).collect()
    stretches: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        if row["first"] is not None:
            stretches.setdefault(row["partition"], []).append((row["first"], row["last"]))
    stats = {"rows": sum(row["rows"] for row in rows), "key_bytes": sum(row["key_bytes"] or 0 for row in rows)}
    return stats, {partition: merged(tuple(found)) for partition, found in stretches.items()}


def _view_batches(store: RemoteStore, log: RemoteLog, manifest: RemoteLogManifest, start: int, end: int) -> (
    Iterator[pa.RecordBatch]
):
    """The compacted view of ``manifest`` (of ``log``) from ``start`` to ``end``: its ledger, then the raw log above
    it."""
    view = manifest.compacted
    horizon = view.horizon if view else -1
    if view is not None and start <= horizon:
        ledger = RemoteLedger(store.objects, view, store.cache, verify=store.verify_reads,
                              manifest_url=store.objects.url(log.manifest_key(manifest.version)))
        yield from ledger.read_batches(start, min(end, horizon + 1))
    raw_start = max(start, horizon + 1, manifest.log_start_offset)
    if end > raw_start:
        segments = RemoteSegments(store.objects, store.cache).of(manifest.segments)
        yield from batches_of_segments(segments, raw_start, end, verify=store.verify_reads)


def _pinned(uri: str, topic: str, partition: int, version: int) -> tuple[RemoteStore, RemoteLogManifest]:
    store = cached_remote_store(uri)
    manifest = RemoteLog(store.objects, topic, partition).read_version(version)
    if manifest is None:
        raise LedgerviewError(f"Version {version} of the remote log of {topic}-{partition}, which this compaction "
                              "planned on, was swept before a task read it: file.delete.delay.ms is shorter than "
                              "the run. Raise it, or run the compaction again.")
    return store, manifest


def _message_reader(uri: str, topic: str) -> Any:
    """Phase one's task: (partition, key, 2 * offset + live) of the latest message of each key in its range (Arrow's
    hash aggregation, so Spark shuffles one row per key and task instead of one per message), and of every keyless
    message."""

    def read(tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for task in pa.Table.from_batches(list(tasks)).to_pylist():
            store, manifest = _pinned(uri, topic, task["partition"], task["version"])
            keys, numbers = [], []
            log = RemoteLog(store.objects, topic, task["partition"])
            for batch in _view_batches(store, log, manifest, task["start"], task["end"]):
                keys.append(batch.column(2))
                number = np.left_shift(batch.column(0).to_numpy(), 1)
                number |= batch.column(3).is_valid().to_numpy(zero_copy_only=False)
                numbers.append(pa.array(number))
            if not keys:
                continue
            messages = pa.table([pa.chunked_array(keys), pa.chunked_array(numbers)], names=["key", "number"])
            keyed = messages.column("key").is_valid()
            latest = messages.filter(keyed).group_by("key", use_threads=False).aggregate([("number", "max")])
            for part in (latest.rename_columns(["key", "number"]), messages.filter(pc.invert(keyed))):
                if part.num_rows:
                    yield from part.add_column(0, "partition", pa.array(
                        np.full(part.num_rows, task["partition"], np.int32))).to_batches()

    return read


def _partition_runs(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.Table]]:
    """A sorted task input, one log partition at a time; nothing for a task that got no rows (every key of the
    run tombstoned, or only keyless messages kept: no live key)."""
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received)
    if not table.num_rows:
        return
    partitions = table.column("partition").to_numpy()
    bounds = np.flatnonzero(np.diff(partitions)) + 1
    for start, end in zip([0, *bounds.tolist()], [*bounds.tolist(), len(partitions)], strict=True):
        yield int(partitions[start]), table.slice(start, end - start)


def _object_stem(topic: str, partition: int, ledger_id: int) -> str:
    return f"{topic}-{partition}/compacted/{ledger_id:020d}-{uuid.uuid4().hex}"


def _ledger_piece_writer(uri: str, topic: str, versions: dict[int, tuple[int, int]], compression: str | None) -> Any:
    """Phase two's task: its kept offsets' messages, as one ledger object per log partition."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for partition, run in _partition_runs(batches):
            version, ledger_id = versions[partition]
            store, manifest = _pinned(uri, topic, partition, version)
            kept = run.column("offset").to_numpy()
            key = _object_stem(topic, partition, ledger_id) + LEDGER_SUFFIX
            with tempfile.TemporaryDirectory(prefix="ledgerview-piece-") as folder:
                path = Path(folder) / "piece.ledger"
                batches = _view_batches(store, RemoteLog(store.objects, topic, partition), manifest, int(kept[0]),
                                        int(kept[-1]) + 1)
                headers = _write_piece(path, batches, kept, compression)
                store.objects.upload(path, key)
                size = path.stat().st_size
            yield pa.RecordBatch.from_pylist([{
                "partition": partition, "object": key, "first_offset": int(kept[0]), "rows": len(kept),
                "bytes": size, "batches": json.dumps(headers)}], schema=pa.schema([
                    ("partition", pa.int32()), ("object", pa.string()), ("first_offset", pa.int64()),
                    ("rows", pa.int64()), ("bytes", pa.int64()), ("batches", pa.string())]))

    return write


def _write_piece(path: Path, batches: Iterator[pa.RecordBatch], kept: np.ndarray, compression: str | None) -> (
    list[list[int]]
):
    """Write the messages of ``batches`` whose offsets are in ``kept`` (sorted) to ``path`` as ledger batches;
    their header fields, positions in the file."""
    headers: list[list[int]] = []
    pending: list[pa.RecordBatch] = []
    held_bytes = position = 0
    with open(path, "wb") as file:

        def flush() -> None:
            """Write what is pending in batches as the local ledger writer cuts them (storage/ledger.py)."""
            nonlocal pending, held_bytes, position
            for part in bounded_slices(pa.concat_batches(pending), BATCH_BYTES):
                encoded = encode_batch(part, compression=compression)
                for piece in encoded.pieces:
                    file.write(piece)
                headers.append(list(astuple(replace(encoded.header, position=position))))
                position += encoded.header.batch_length
            pending, held_bytes = [], 0

        for batch in batches:
            offsets = batch.column(0).to_numpy()
            low, high = np.searchsorted(kept, [offsets[0], offsets[-1] + 1])
            wanted = kept[low:high]
            if not len(wanted):
                continue
            rows = np.searchsorted(offsets, wanted)
            taken = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
            pending.append(taken)
            held_bytes += taken.get_total_buffer_size()
            if held_bytes >= BATCH_BYTES:
                flush()
        if pending:
            flush()
        file.flush()
        os.fsync(file.fileno())
    found = sum(BatchHeader(*header).record_count for header in headers)
    if found != len(kept):
        raise LedgerviewError(f"Phase two found {found} of the {len(kept)} messages phase one kept in the remote log "
                              "version both read: its objects changed under the run.")
    return headers


def _key_piece_writer(uri: str, topic: str, versions: dict[int, tuple[int, int]]) -> Any:
    """Phase two's other task: its live keys (sorted) as one flat key index object per log partition."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for partition, run in _partition_runs(batches):
            store = cached_remote_store(uri)
            keys = run.column("key").combine_chunks()
            key = _object_stem(topic, partition, versions[partition][1]) + KEY_INDEX_SUFFIX
            with tempfile.TemporaryDirectory(prefix="ledgerview-piece-") as folder:
                path = Path(folder) / "piece.keys"
                size = write_flat_key_index(sorted_run_entries(keys, run.column("offset").to_numpy()), path)
                store.objects.upload(path, key)
            yield pa.RecordBatch.from_pylist(
                [{"partition": partition, "object": key, "first_key": keys[0].as_py(), "bytes": size}],
                schema=pa.schema([("partition", pa.int32()), ("object", pa.string()), ("first_key", pa.binary()),
                                  ("bytes", pa.int64())]))

    return write


def _empty_key_index(store: RemoteStore, topic: str, plan: _Plan) -> dict[str, Any]:
    """An empty key index object for the partition's ledger (a view with batches must have one), as phase two's
    key piece rows describe a piece."""
    key = _object_stem(topic, plan.partition, plan.ledger_id) + KEY_INDEX_SUFFIX
    with tempfile.TemporaryDirectory(prefix="ledgerview-piece-") as folder:
        path = Path(folder) / "piece.keys"
        size = write_flat_key_index([], path)
        store.objects.upload(path, key)
    return {"partition": plan.partition, "object": key, "first_key": b"", "bytes": size}


def _publish(store: RemoteStore, topic: str, plan: _Plan, ledger_rows: list[Any], key_rows: list[Any],
             dropped: Ranges, config: TopicConfig) -> DistributedCompactionResult:
    """Name the pieces in the partition's manifest as its compacted view (``dropped``: where the tombstones this
    run left out lie); sweep what is no longer needed."""
    previous = plan.manifest.compacted
    ledger_rows = sorted(ledger_rows, key=lambda row: row["first_offset"])
    key_rows = sorted(key_rows, key=lambda row: row["first_key"])
    if ledger_rows and not key_rows:  # only keyless messages kept: readers need a key index, an empty one
        key_rows = [_empty_key_index(store, topic, plan)]
    batches = tuple((*header, piece) for piece, row in enumerate(ledger_rows)
                    for header in json.loads(row["batches"]))
    kept = sum(row["rows"] for row in ledger_rows)
    view = RemoteCompactedView(
        plan.ledger_id, plan.manifest.end_offset - 1, plan.messages_read, kept,
        tuple(row["object"] for row in ledger_rows), sum(row["bytes"] for row in ledger_rows),
        tuple(KeyIndexPiece(row["object"], row["bytes"], row["first_key"]) for row in key_rows),
        wall_clock_ms(), batches, after_run(previous.dropped_tombstones if previous else (),
                                            previous.horizon if previous else -1, plan.raw_start, dropped))
    planned = previous.ledger_id if previous else None

    def with_view(latest: RemoteLogManifest) -> RemoteLogManifest:
        found = latest.compacted.ledger_id if latest.compacted else None
        if found != planned:
            raise CompactionConflictError(topic, plan.partition, planned, found)
        return replace(latest, compacted=view)

    log = RemoteLog(store.objects, topic, plan.partition)
    change_unowned(log, with_view, wall_clock_ms)
    log.remove_unreferenced(now_ms=wall_clock_ms(), grace_ms=config.file_delete_delay_ms,
                            unpublished_grace_ms=config.remote_unpublished_delete_delay_ms)
    return DistributedCompactionResult(plan.partition, view.ledger_id, view.horizon, view.messages_read, kept,
                                       view.ledger_bytes, 1, skipped=False, ledger_pieces=len(ledger_rows),
                                       key_index_pieces=len(key_rows))
