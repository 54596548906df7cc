"""A store's remote tier (Kafka's KIP-405, extended to topics whose compacted view ledgerview keeps): sealed
segments are uploaded after they roll, read from there once their local copies are gone, and expire from there.

Per partition of a topic with ``remote.storage.enable=true``, under the partition's ``.remote.lock`` (one
uploader per data folder; the remote log's epoch fences other folders, see storage/remote_log.py):

- ``sync_partition`` (Kafka's RLMCopyTask): upload every sealed local segment above the remote log's end, oldest
  first, publishing a manifest after every PUBLISH_EVERY of them so that progress survives a crash (the active
  segment is never uploaded); then the current compacted ledger with its key index, once the raw log above its
  horizon is there (storage/remote_ledger.py): Kafka tiers no compacted topic, ledgerview tiers the compacted
  view too.
- ``enforce_tiered_retention`` (Kafka's RLMExpirationTask plus local retention), taking the writer lock only for
  its local changes:
  1. retention.ms and retention.bytes over the whole log, remote segments first (storage/retention.py's plan over
     both tiers, with the two-phase compaction hold): the remote log drops the expired segments and moves its log
     start offset (published first), then the local log moves its own and deletes its expired segments;
  2. local.retention.ms and local.retention.bytes over the local segments already uploaded: their local copies
     go, the log start offset stays, and reads of them go to the remote tier;
  3. segment objects no manifest names (dropped by step 1, or uploads that died before their publish) and old
     manifests are deleted once older than file.delete.delay.ms, so readers that planned on them can finish.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from storage import faults
from storage.compacted import CompactedLedgers
from storage.errors import RemoteTierMismatchError
from storage.fileio import write_atomically
from storage.files import REMOTE_LOCK, REMOTE_TIER_RECORD
from storage.ledger import Ledger
from storage.locks import FileLock
from storage.object_store import (
    DEFAULT_TIMEOUT_S,
    ObjectStore,
    RemoteObjectMissingError,
    RemoteStorageError,
    open_object_store,
)
from storage.partition_log import PartitionLog
from storage.records import decode_record, encode_record
from storage.remote_ledger import RemoteCompactedView
from storage.remote_log import RemoteLog, RemoteLogManifest, RemoteLogWriter, RemoteSyncRefusal
from storage.remote_segment import FetchCache, RemoteSegmentInfo, RemoteSegments
from storage.remote_store import remote_topic_key
from storage.retention import (
    LOCAL_REASONS,
    DeletedSegment,
    RetentionReason,
    enforce_partition_retention,
    plan_retention,
    remove_expired_deleted_files,
)
from storage.segment import SegmentReads
from storage.topics import CorruptTopicMetadataError, TopicMetadata

REMOTE_TIER_KIND = "remote-tier"
logger = logging.getLogger(__name__)

PUBLISH_EVERY = 64
"""Segments uploaded per manifest published: each manifest lists the whole remote log, so publishing after every
small segment made uploads fall behind appends; a crash loses at most this many uploads (they are redone)."""
RETRY_AFTER_FAILURE_S = 5.0
"""After reading a remote log failed, reads that need it fail at once for this long instead of each waiting for
the remote tier's time-outs again (a status page must answer while the tier is down)."""


@dataclass(frozen=True)
class RemoteSyncResult:
    topic: str
    partition: int
    uploaded: list[RemoteSegmentInfo]
    remote_end_offset: int
    """The offset after the last uploaded message: the remote tier holds everything below it."""
    compacted: RemoteCompactedView | None
    """The compacted view on the remote tier now."""


@dataclass(frozen=True)
class RemotePartitionStatus:
    """A tiered partition's offsets on both tiers, from its remote log read now."""

    log_start_offset: int
    local_start_offset: int
    """The first offset with a local copy."""
    remote_end_offset: int | None
    """The offset after the last uploaded message; None before the first upload."""
    end_offset: int
    remote_bytes: int
    upload_lag_bytes: int
    epoch: int | None
    """The epoch of the remote log's writer."""


class RemoteTier:
    """The remote tier of one store: its objects, the cache of fetched segments, and each partition's view."""

    def __init__(self, objects: ObjectStore, cache: FetchCache, clock: Callable[[], int]) -> None:
        self.objects, self.cache, self.clock = objects, cache, clock
        self._segments = RemoteSegments(objects, cache)
        self._logs: dict[tuple[str, int], RemoteLog] = {}
        self._failures: dict[tuple[str, int], tuple[float, RemoteStorageError]] = {}

    def remote_log(self, topic: str, partition: int) -> RemoteLog:
        log = self._logs.get((topic, partition))
        if log is None:
            log = self._logs[(topic, partition)] = RemoteLog(self.objects, topic, partition)
        return log

    def publish_topic(self, metadata: TopicMetadata) -> None:
        """Put the topic's metadata on the remote tier, for readers of the remote tier alone (its partition count
        never changes; its config matters only to the data folder): created once, and again, from the data folder's,
        when it is damaged there (deleted first, warning) or gone. A call after the first costs the refused create
        and one read."""
        key = remote_topic_key(metadata.name)
        while not self.objects.create(key, metadata.encode()):
            try:
                TopicMetadata.decode(self.objects.url(key), self.objects.read(key).to_pybytes())
                return
            except RemoteObjectMissingError:
                continue  # deleted since the create was refused
            except CorruptTopicMetadataError as error:
                logger.warning("%s Writing it again from the data folder's metadata of %s.", error, metadata.name)
                self.objects.delete(key)

    def status(self, log: PartitionLog) -> RemotePartitionStatus:
        manifest = self.remote_log(log.topic, log.partition).latest()
        log.refresh()
        return RemotePartitionStatus(log.log_start_offset, log.segments[0].base_offset,
                                     manifest.end_offset if manifest else None, log.end_offset,
                                     manifest.size_bytes if manifest else 0, self.upload_lag_bytes(log),
                                     manifest.epoch if manifest else None)

    def upload_lag_bytes(self, log: PartitionLog) -> int:
        """Bytes of sealed local segments the remote tier does not hold yet, as of the last manifest this process
        saw (read once if it saw none): what is at risk if the local disk is lost, and the sign of a remote that
        is down or slow."""
        remote = self.remote_log(log.topic, log.partition)
        manifest = remote.last_seen or remote.latest()
        uploaded_end = manifest.end_offset if manifest else log.log_start_offset
        return sum(segment.size_bytes for segment in log.segments[:-1] if segment.next_offset > uploaded_end)

    def writer(self, log: PartitionLog) -> RemoteLogWriter:
        return RemoteLogWriter(self.remote_log(log.topic, log.partition), log.folder, self.clock)

    def segments(self, topic: str, partition: int) -> list[SegmentReads]:
        """The segments of the partition's remote log now, oldest first (each fetched only when read). Within
        RETRY_AFTER_FAILURE_S of a failed read of the remote log, its error again, at once."""
        failed = self._failures.get((topic, partition))
        if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER_FAILURE_S:
            raise failed[1]
        try:
            manifest = self.remote_log(topic, partition).latest()
        except RemoteStorageError as error:
            self._failures[(topic, partition)] = (time.monotonic(), error)
            raise
        self._failures.pop((topic, partition), None)
        return list(self._segments.of(manifest.segments)) if manifest else []


def open_remembered_tier(root: Path, remote: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         remember: bool = True) -> ObjectStore | None:
    """The data folder's remote tier, opened: ``remote`` if given (remembered in the folder the first time it
    opens, unless ``remember`` is False, as for a read-only open), else the one the folder remembers, else None.
    A folder tiered to one URI refuses another (RemoteTierMismatchError): its remote segments are there. A file://
    tier's folder is made when a data folder is first tiered there, and must be there after."""
    path = root / REMOTE_TIER_RECORD
    try:
        _, body = decode_record(path, path.read_bytes(), REMOTE_TIER_KIND, max_version=1)
    except FileNotFoundError:
        if remote is None:
            return None
        objects = open_object_store(remote, timeout_s=timeout_s)  # a URI that does not open is never remembered
        if remember:
            objects.create_folder()
            write_atomically(path, encode_record(REMOTE_TIER_KIND, 1, {"uri": objects.uri}))
        return objects
    known = str(body.get("uri"))
    if remote is not None and remote.rstrip("/") != known:
        raise RemoteTierMismatchError(str(root), known, remote)
    objects = open_object_store(known, timeout_s=timeout_s)
    objects.check_folder()
    return objects


def _remote_lock(log: PartitionLog) -> FileLock:
    return FileLock(log.folder / REMOTE_LOCK, wait=True)


def sync_partition(log: PartitionLog, writer: RemoteLogWriter) -> RemoteSyncResult:
    """Upload the partition's sealed segments that the remote log lacks, publishing one manifest per
    PUBLISH_EVERY segments; returns what was uploaded."""
    uploaded: list[RemoteSegmentInfo] = []
    with _remote_lock(log):
        log.refresh()
        manifest = writer.current(log_start_offset=log.log_start_offset)
        _uploaded_end(log, manifest)  # raises RemoteLogDivergedError for a local log that no longer continues it
        waiting = [segment for segment in log.segments[:-1]
                   if segment.next_offset > manifest.end_offset and segment.size_bytes > 0]
        for first in range(0, len(waiting), PUBLISH_EVERY):
            infos = [writer.log.upload(segment) for segment in waiting[first : first + PUBLISH_EVERY]]
            faults.crash_point("remote.upload.before_publish")
            manifest = writer.change(functools.partial(_with_segments, infos=infos, topic=log.topic,
                                                       partition=log.partition),
                                     log_start_offset=log.log_start_offset)
            uploaded += infos
        compacted = _sync_compacted(log, writer, manifest)
    return RemoteSyncResult(log.topic, log.partition, uploaded, manifest.end_offset, compacted)


def _sync_compacted(log: PartitionLog, writer: RemoteLogWriter, manifest: RemoteLogManifest) -> (
    RemoteCompactedView | None
):
    """Upload the partition's current compacted ledger if the remote log names an older one, once the raw log
    above its horizon is uploaded (so a reader of the remote tier alone reads the view whole); returns the view
    the remote log names now."""
    ledgers = CompactedLedgers(log.folder)
    with ledgers.lock(wait=True):  # no compaction retires the ledger while it is copied
        opened = ledgers.open_current(verify=False)
        if opened is None:
            return manifest.compacted
        cursor, ledger = opened
        try:
            known = manifest.compacted
            if not ledgers.tier_can_copy(cursor):
                return known  # the next compaction rewrites it (the scheduler's next check does, when it runs)
            assert isinstance(ledger, Ledger)
            if (known and (known.ledger_id, known.horizon) == (cursor.ledger_id, cursor.horizon)) or (
                    cursor.horizon >= manifest.end_offset):
                return known
            view = writer.log.upload_compacted(cursor, ledger, ledgers.ledger_paths(cursor.ledger_id))
            faults.crash_point("remote.compacted.before_publish")
            return writer.change(lambda current: replace(current, compacted=view),
                                 log_start_offset=log.log_start_offset).compacted
        finally:
            ledger.close()


class RemoteLogDivergedError(RemoteSyncRefusal):
    def __init__(self, topic: str, partition: int, segment: SegmentReads | RemoteSegmentInfo, remote_end: int) -> None:
        super().__init__(
            f"The local log of {topic}-{partition} no longer continues its remote log: its sealed segment of offsets "
            f"{segment.base_offset} to {segment.next_offset - 1} starts below the remote log's end {remote_end} "
            f"and is none of the segments uploaded there, so the two may hold different messages at the offsets "
            f"between (the data folder was "
            f"restored from an older copy or lost a tail it had uploaded, or the tier held this topic's log, "
            f"written by another writer, when this folder created the topic). Nothing of this partition was "
            f"published: the remote log still holds offsets up to {remote_end - 1}, and its older segments stay. "
            f"Appends here go on locally."
        )


def _uploaded_end(log: PartitionLog, manifest: RemoteLogManifest) -> int:
    """The offset below which the local log holds what the remote log holds: its end, unless a local segment below
    that end is none of the remote log's segments (an uploaded segment is the local file byte for byte: same
    offsets, size and timestamps; segments below the remote log's first one are past its retention). Such a sealed
    segment means the local log diverged: RemoteLogDivergedError. An active one cannot be told yet (a folder put
    back from an older copy and appended to below the remote end): its base offset is returned, so that local
    retention keeps it."""
    uploaded = {(segment.base_offset, segment.next_offset, segment.size_bytes, segment.first_timestamp,
                 segment.max_timestamp) for segment in manifest.segments}
    remote_start = manifest.segments[0].base_offset if manifest.segments else manifest.end_offset
    for segment in log.segments:
        if segment.base_offset >= manifest.end_offset:
            break
        if segment.size_bytes == 0 or segment.next_offset <= remote_start or (
                segment.base_offset, segment.next_offset, segment.size_bytes, segment.first_timestamp,
                segment.max_timestamp) in uploaded:
            continue
        if segment is not log.segments[-1]:
            raise RemoteLogDivergedError(log.topic, log.partition, segment, manifest.end_offset)
        return segment.base_offset
    return manifest.end_offset


def _with_segments(manifest: RemoteLogManifest, infos: list[RemoteSegmentInfo], *, topic: str,
                   partition: int) -> RemoteLogManifest:
    """``manifest`` with ``infos`` (consecutive, in order) appended. Segments that start above the remote log's
    end mean the local log lost the segments between (retention deleted them before they were uploaded): the
    remote log, all older than the new segments, then restarts at them. Segments that start below it mean the
    local log diverged from the remote one: RemoteLogDivergedError, since restarting there would drop every older
    remote segment."""
    if manifest.segments and infos[0].base_offset < manifest.end_offset:
        raise RemoteLogDivergedError(topic, partition, infos[0], manifest.end_offset)
    if infos[0].base_offset == manifest.end_offset and manifest.segments:
        return replace(manifest, segments=(*manifest.segments, *infos))
    return replace(manifest, segments=tuple(infos),
                   log_start_offset=max(manifest.log_start_offset, infos[0].base_offset))


def enforce_tiered_retention(log: PartitionLog, writer: RemoteLogWriter, *, hold: int | None,
                             now_ms: int) -> list[DeletedSegment]:
    """Retention of a partition whose topic has remote.storage.enable (the module doc's steps 1 to 3). Requests to
    the remote tier are made without the partition's writer lock, so appends never wait for the remote tier.

    A partition the tier refuses (this folder is fenced, or its log diverged) keeps the retention that needs no
    tier, warning: retention.ms and retention.bytes over its local log, as for a topic that is not tiered, so its
    disk does not fill while it appends locally; local.retention.* (uploaded copies only) and the sweep wait."""
    deleted: list[DeletedSegment] = []
    with _remote_lock(log):
        log.refresh()
        try:
            manifest = writer.current(log_start_offset=log.log_start_offset)
            _uploaded_end(log, manifest)  # the check, before the remote log changes
        except RemoteSyncRefusal as refusal:
            logger.warning("%s Retention runs over the local log alone, as for a topic that is not tiered.", refusal)
            return enforce_partition_retention(log, read_hold=lambda: hold, now_ms=now_ms)
        if manifest.compacted is not None:  # readers of the remote tier alone read the raw log above its horizon
            hold = min(manifest.compacted.horizon + 1, hold if hold is not None else manifest.compacted.horizon + 1)
        elif CompactedLedgers(log.folder).cursor_path.exists():
            # a local view not yet on the tier (its raw log not all uploaded, or a view the tier cannot copy yet):
            # readers of the tier alone read the raw log whole, so none of it goes until the view is uploaded
            hold = manifest.log_start_offset
        tiered = log.tiered_segments()
        plan = plan_retention(tiered, end_offset=log.end_offset, log_start_offset=log.log_start_offset, hold=hold,
                              config=log.config, now_ms=now_ms)
        if plan:
            deleted += [_deleted(log, segment, reason) for segment, reason in plan]
            if len(plan) == len(tiered):
                log.roll()
                tiered = log.tiered_segments()
            new_start = max(log.log_start_offset, tiered[len(plan)].base_offset)
            manifest = writer.change(lambda current: _starting_at(current, new_start),
                                     log_start_offset=log.log_start_offset)
            faults.crash_point("remote.retention.after_publish")
            with log.writer_lock:
                log.refresh()
                local_expired = [segment for segment in log.segments if segment.next_offset <= new_start]
                if local_expired:
                    log.delete_segments_before(log.segments[len(local_expired)].base_offset, now_ms=now_ms)
                log.move_log_start_offset(new_start)
                log.reload_remote()
        local_config = replace(log.config, retention_ms=log.config.effective_local_retention_ms,
                               retention_bytes=log.config.effective_local_retention_bytes)
        with log.writer_lock:
            log.refresh()
            local_plan = plan_retention(log.segments, end_offset=log.end_offset, log_start_offset=log.log_start_offset,
                                        hold=_uploaded_end(log, manifest), config=local_config, now_ms=now_ms,
                                        reasons=set(LOCAL_REASONS))
            if local_plan:
                log.delete_segments_before(log.segments[len(local_plan)].base_offset, now_ms=now_ms,
                                           move_log_start=False)
                deleted += [_deleted(log, segment, LOCAL_REASONS[reason]) for segment, reason in local_plan]
        # The folder owns this log: its uploads and publishes run under the .remote.lock held here, so no object
        # unnamed now is on its way to a publish, and the unnamed go as soon as the retired do.
        writer.log.remove_unreferenced(now_ms=now_ms, grace_ms=log.config.file_delete_delay_ms,
                                       unpublished_grace_ms=log.config.file_delete_delay_ms)
        remove_expired_deleted_files(log.folder, now_ms=now_ms, delay_ms=log.config.file_delete_delay_ms)
    return deleted


def _deleted(log: PartitionLog, segment: SegmentReads, reason: RetentionReason) -> DeletedSegment:
    return DeletedSegment(log.topic, log.partition, segment.base_offset, segment.next_offset, segment.size_bytes,
                          reason)


def _starting_at(manifest: RemoteLogManifest, start: int) -> RemoteLogManifest:
    kept = tuple(segment for segment in manifest.segments if segment.next_offset > start)
    return replace(manifest, segments=kept, log_start_offset=max(manifest.log_start_offset, start))
