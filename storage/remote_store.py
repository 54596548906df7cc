"""A store read from its remote tier alone, on a machine with no data folder: a Spark executor, a reporting host.

It sees what the remote tier holds: each tiered partition's raw log up to the last uploaded segment, and the
compacted view its manifest names (whose horizon lies below that end, so the view is whole). It has the reading
methods of Store (``ReadableStore``), so Reader and TableView take ``"s3://bucket/prefix"`` where they take a
folder. It writes itself only to create a topic that lives on the tier alone (``create_topic``); the writers of
such topics (streaming/remote_sink.py, streaming/compaction.py) upload and publish through its ``objects``. Each
partition's manifest is read again when it is older than ``manifest_max_age_ms``, so a point lookup after warm-up
costs the reads of one key-index group and one ledger batch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import pyarrow as pa

from storage.compacted import CompactionCursor
from storage.config import TopicConfig
from storage.errors import LedgerviewError, OffsetOutOfRangeError, UnknownPartitionError, UnknownTopicError
from storage.files import TOPIC_METADATA, TOPICS_FOLDER, validate_partition_count, validate_topic_name
from storage.ledger import Ledger
from storage.object_store import DEFAULT_TIMEOUT_S, ObjectStore, RemoteObjectMissingError, open_object_store
from storage.remote_ledger import RemoteLedger
from storage.remote_log import RemoteLog, RemoteLogManifest, change_unowned
from storage.remote_segment import DEFAULT_CACHE_BYTES, FetchCache, RemoteSegment, RemoteSegments
from storage.schema import with_partition_column
from storage.segment import batches_of_segments
from storage.topics import TopicMetadata


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def remote_topic_key(topic: str) -> str:
    """Where a tiered topic's metadata is kept on its remote tier (written once, at its first upload)."""
    return f"{TOPICS_FOLDER}/{topic}/{TOPIC_METADATA}"


class RemoteTopicExistsError(LedgerviewError):
    def __init__(self, url: str, existing: TopicMetadata, partitions: int) -> None:
        self.existing = existing
        super().__init__(
            f"Topic {existing.name!r} already exists on the remote tier ({url}) with {existing.partitions} "
            f"partitions; it cannot be created with {partitions}. A topic's partition count is fixed at creation: "
            f"use {existing.partitions}, or another topic name."
        )


class RemoteCompactedLedgers:
    """A partition's compacted view on the remote tier, with the reading methods of CompactedLedgers."""

    def __init__(self, store: RemoteStore, topic: str, partition: int) -> None:
        self.store, self.topic, self.partition = store, topic, partition

    def read_cursor(self) -> CompactionCursor | None:
        view = self.store.manifest(self.topic, self.partition).compacted
        return view.cursor() if view else None

    def open_current(self, *, verify: bool = True) -> tuple[CompactionCursor, Ledger] | None:
        """The view the remote log names and its ledger; None before the first compaction. Raises
        RemoteViewMismatchError if the view's counts disagree with its batches (RemoteLedger)."""
        manifest = self.store.manifest(self.topic, self.partition)
        if manifest.compacted is None:
            return None
        return manifest.compacted.cursor(), self._ledger(manifest, verify=verify)

    def open_ledger(self, ledger_id: int, *, verify: bool = True) -> Ledger | None:
        """The ledger if a manifest the remote log keeps names it as its view: the current one, or one that a newer
        compaction replaced less than file.delete.delay.ms ago (the sweep keeps its objects that long), as a data
        folder keeps a retired ledger for readers that planned on it. None when none does."""
        current = self.store.manifest(self.topic, self.partition)
        if current.compacted is not None and current.compacted.ledger_id == ledger_id:
            return self._ledger(current, verify=verify)
        kept = RemoteLog(self.store.objects, self.topic, self.partition).kept_manifest_with_ledger(ledger_id)
        return None if kept is None else self._ledger(kept, verify=verify)

    def _ledger(self, manifest: RemoteLogManifest, *, verify: bool) -> RemoteLedger:
        assert manifest.compacted is not None
        log = RemoteLog(self.store.objects, self.topic, self.partition)
        return RemoteLedger(self.store.objects, manifest.compacted, self.store.cache, verify=verify,
                            manifest_url=self.store.objects.url(log.manifest_key(manifest.version)))


class RemoteStore:
    """The read side of a remote tier (``s3://bucket/prefix``, ``file:///mount/prefix``, any pyarrow URI)."""

    def __init__(self, objects: ObjectStore, *, verify_reads: bool, cache_bytes: int,
                 manifest_max_age_ms: int) -> None:
        self.objects = objects
        self.verify_reads = verify_reads
        self.cache = FetchCache(cache_bytes)
        self.manifest_max_age_ms = manifest_max_age_ms
        self._manifests: dict[tuple[str, int], tuple[float, RemoteLogManifest]] = {}
        self._segments = RemoteSegments(objects, self.cache)
        self._topics: dict[str, TopicMetadata] = {}
        self.clock = wall_clock_ms

    @classmethod
    def open(cls, uri: str, *, verify_reads: bool = True, cache_bytes: int = DEFAULT_CACHE_BYTES,
             manifest_max_age_ms: int = 1000, timeout_s: float = DEFAULT_TIMEOUT_S) -> RemoteStore:
        """``timeout_s``: how long a request waits for a connection or for its answer's next bytes."""
        return cls(open_object_store(uri, timeout_s=timeout_s), verify_reads=verify_reads, cache_bytes=cache_bytes,
                   manifest_max_age_ms=manifest_max_age_ms)

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._manifests.clear()

    # -------------------------------------------------------------------------------------------------- topics
    def list_topics(self) -> list[str]:
        return sorted(info.key.split("/")[1] for info in self.objects.list(TOPICS_FOLDER)
                      if info.key.endswith(f"/{TOPIC_METADATA}"))

    def create_topic(self, topic: str, partitions: int = 1, config: Mapping[str, Any] | None = None) -> (
        TopicMetadata
    ):
        """Create a topic that lives on the remote tier alone, written by writers of the tier alone (the Spark sink
        with an object-store path): its metadata, created once, and an empty remote log (epoch 0) per partition.
        A topic already there with as many partitions is returned as it is (its config too); with another count,
        RemoteTopicExistsError."""
        validate_topic_name(topic)
        validate_partition_count(partitions)
        metadata = TopicMetadata(topic, partitions, TopicConfig.from_overrides(config or {}).to_overrides(),
                                 self.clock())
        key = remote_topic_key(topic)
        if not self.objects.create(key, metadata.encode()):
            self._topics.pop(topic, None)
            metadata = self.topic_metadata(topic)
            if metadata.partitions != partitions:
                raise RemoteTopicExistsError(self.objects.url(key), metadata, partitions)
        for partition in range(partitions):
            log = RemoteLog(self.objects, topic, partition)
            if log.latest() is None:
                change_unowned(log, lambda manifest: dataclasses.replace(manifest), self.clock)
        return metadata

    def topic_metadata(self, topic: str) -> TopicMetadata:
        metadata = self._topics.get(topic)
        if metadata is None:
            key = remote_topic_key(topic)
            try:
                data = self.objects.read(key).to_pybytes()
            except RemoteObjectMissingError:
                raise UnknownTopicError(topic, self.list_topics()) from None
            metadata = self._topics[topic] = TopicMetadata.decode(self.objects.url(key), data)
        return metadata

    def manifest(self, topic: str, partition: int) -> RemoteLogManifest:
        """The partition's remote log, read again once older than ``manifest_max_age_ms``."""
        count = self.topic_metadata(topic).partitions
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
            raise UnknownPartitionError(topic, partition, count)
        now = time.monotonic()
        cached = self._manifests.get((topic, partition))
        if cached is None or (now - cached[0]) * 1000 >= self.manifest_max_age_ms:
            manifest = RemoteLog(self.objects, topic, partition).latest()
            if manifest is None:
                raise LedgerviewError(f"The remote tier {self.objects.uri} holds nothing of {topic}-{partition} yet: "
                                      "its data folder has not uploaded a segment (store.sync_remote).")
            cached = self._manifests[(topic, partition)] = (now, manifest)
        return cached[1]

    def compacted_ledgers(self, topic: str, partition: int) -> RemoteCompactedLedgers:
        return RemoteCompactedLedgers(self, topic, partition)

    # ---------------------------------------------------------------------------------------------------- read
    def start_offset(self, topic: str, partition: int) -> int:
        return self.manifest(topic, partition).log_start_offset

    def end_offset(self, topic: str, partition: int) -> int:
        return self.manifest(topic, partition).end_offset

    def size_bytes(self, topic: str, partition: int) -> int:
        return self.manifest(topic, partition).size_bytes

    def segments(self, topic: str, partition: int) -> list[RemoteSegment]:
        return self._segments_of(self.manifest(topic, partition))

    def _segments_of(self, manifest: RemoteLogManifest) -> list[RemoteSegment]:
        return self._segments.of(manifest.segments)

    def read_batches(self, topic: str, partition: int, start_offset: int | None = None,
                     end_offset: int | None = None, *, join_bytes: int = 0) -> Iterator[pa.RecordBatch]:
        """Record batches of MESSAGE_SCHEMA for start_offset <= offset < end_offset, as Store.read_batches."""
        manifest = self.manifest(topic, partition)
        start = manifest.log_start_offset if start_offset is None else start_offset
        end = manifest.end_offset if end_offset is None else min(end_offset, manifest.end_offset)
        if not manifest.log_start_offset <= start <= manifest.end_offset:
            raise OffsetOutOfRangeError(topic, partition, start, manifest.log_start_offset, manifest.end_offset)
        for batch in batches_of_segments(self._segments_of(manifest), start, end, verify=self.verify_reads,
                                         join_bytes=join_bytes):
            yield with_partition_column(batch, partition)

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """Kafka's offsetsForTimes over the uploaded log."""
        manifest = self.manifest(topic, partition)
        for segment in self._segments_of(manifest):
            if segment.max_timestamp >= timestamp_ms:
                found = segment.offset_for_timestamp(timestamp_ms, from_offset=manifest.log_start_offset)
                if found is not None:
                    return found
        return None


def is_remote_location(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a remote tier (a URI with a scheme) rather than a data folder."""
    return isinstance(location, str) and "://" in location
