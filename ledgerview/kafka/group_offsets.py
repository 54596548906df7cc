"""OffsetCommit and OffsetFetch: a group's committed offsets are durable subscription cursor records.

A commit of offset o on partition p of a topic name writes the cursor record of subscription ``<group id>`` on
that partition (storage/cursors.py: write, fsync, rename, fsync the folder) with acked_offset o, so it survives
a restart of the endpoint and a ledgerview Consumer of that subscription continues from the same place. The raw
and compacted names of a topic share the record; it notes which view was committed. Kafka lets a commit move a
position back, and so does this; a negative offset is not stored. The commit's metadata string is kept with the
offset and handed back by OffsetFetch; one longer than Kafka's offset.metadata.max.bytes (4096) is refused with
OFFSET_METADATA_TOO_LARGE, as Kafka does. A commit or fetch of offsets needs only the partition's folder, not its
log, so a partition whose log does not open (a damaged segment) keeps its group's positions, as Kafka keeps them
in __consumer_offsets; a damaged cursor record is that partition's KAFKA_STORAGE_ERROR (topics.unreadable), and so
is one that cannot be written or read (a full disk, a folder gone), logged as a produce that cannot be written is.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import OffsetCommitResponse, OffsetFetchResponse

from ledgerview.kafka.authorizer import Operation, ResourceType
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.groups import valid_group_id
from ledgerview.kafka.offsets import resolve_partition
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.topics import TopicView, all_topic_views, unreadable
from storage.cursors import SubscriptionCursor, read_subscription_cursor, write_subscription_cursor
from storage.errors import CorruptDataError, LedgerviewError
from storage.files import partition_folder

CommittedTopic = OffsetCommitResponse.OffsetCommitResponseTopic
CommittedPartition = CommittedTopic.OffsetCommitResponsePartition
FetchedTopic = OffsetFetchResponse.OffsetFetchResponseTopic
FetchedPartition = FetchedTopic.OffsetFetchResponsePartition
log = logging.getLogger(__name__)
NO_OFFSET = -1
OFFSET_METADATA_MAX_BYTES = 4096
"""Kafka's offset.metadata.max.bytes default: the longest metadata a commit may carry."""


def handle_offset_commit(broker: Broker, request: Any, version: int) -> Any:
    group_id = request.group_id
    if not valid_group_id(group_id):
        group_error = ErrorCode.INVALID_GROUP_ID
    elif not broker.allowed(Operation.READ, ResourceType.GROUP, group_id):
        group_error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        group_error = broker.coordinator.check_commit(group_id, request.generation_id_or_member_epoch,
                                                      request.member_id)
    topics = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            error = group_error
            if error is ErrorCode.NONE:
                error = _commit(broker, group_id, topic.name, wanted.partition_index, wanted.committed_offset,
                                wanted.committed_metadata or "")
            partitions.append(CommittedPartition(partition_index=wanted.partition_index, error_code=error.value))
        topics.append(CommittedTopic(name=topic.name, partitions=partitions))
    return OffsetCommitResponse(version=version, throttle_time_ms=0, topics=topics)


def _commit(broker: Broker, group_id: str, name: str, partition: int, offset: int, metadata: str) -> ErrorCode:
    view = resolve_partition(broker, name, partition, Operation.READ)
    if isinstance(view, ErrorCode):
        return view
    if len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
        return ErrorCode.OFFSET_METADATA_TOO_LARGE
    if offset >= 0:
        cursor = SubscriptionCursor(group_id, partition, offset, view.compacted, None, broker.store.clock(), metadata)
        try:
            write_subscription_cursor(_folder(broker, view, partition), cursor)
        except (LedgerviewError, OSError):  # a full disk, the folder gone (the topic deleted meanwhile), ...
            log.exception("committing the offset of group %s on %s-%d failed", group_id, view.topic, partition)
            return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.NONE


def handle_offset_fetch(broker: Broker, request: Any, version: int) -> Any:
    group_id = request.group_id
    if not valid_group_id(group_id):
        return OffsetFetchResponse(version=version, throttle_time_ms=0, topics=[],
                                   error_code=ErrorCode.INVALID_GROUP_ID.value)
    if not broker.allowed(Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return OffsetFetchResponse(version=version, throttle_time_ms=0, topics=[],
                                   error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED.value)
    if request.topics is None:
        wanted = [(view.name, list(range(view.partitions))) for view in all_topic_views(broker.store, "")[0]
                  if broker.allowed_topic(Operation.DESCRIBE, view.name)]
    else:
        wanted = [(topic.name, list(topic.partition_indexes)) for topic in request.topics]
    topics = []
    for name, partitions in wanted:
        answered = [_committed(broker, group_id, name, partition) for partition in partitions]
        if request.topics is None:
            answered = [entry for entry in answered if entry.committed_offset != NO_OFFSET]
        if answered:
            topics.append(FetchedTopic(name=name, partitions=answered))
    return OffsetFetchResponse(version=version, throttle_time_ms=0, topics=topics, error_code=0)


def _committed(broker: Broker, group_id: str, name: str, partition: int) -> Any:
    view = resolve_partition(broker, name, partition, Operation.DESCRIBE)
    if isinstance(view, ErrorCode):
        return FetchedPartition(partition_index=partition, committed_offset=NO_OFFSET, committed_leader_epoch=-1,
                                metadata="", error_code=view.value)
    try:
        cursor = read_subscription_cursor(_folder(broker, view, partition), group_id, partition)
    except CorruptDataError as error:
        return FetchedPartition(partition_index=partition, committed_offset=NO_OFFSET, committed_leader_epoch=-1,
                                metadata="", error_code=unreadable(name, partition, error).value)
    except OSError:
        log.exception("reading the offset of group %s on %s-%d failed", group_id, view.topic, partition)
        return FetchedPartition(partition_index=partition, committed_offset=NO_OFFSET, committed_leader_epoch=-1,
                                metadata="", error_code=ErrorCode.KAFKA_STORAGE_ERROR.value)
    offset = NO_OFFSET if cursor is None else cursor.acked_offset
    return FetchedPartition(partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                            metadata="" if cursor is None else cursor.metadata, error_code=0)


def _folder(broker: Broker, view: TopicView, partition: int) -> Path:
    """The partition's folder, which holds its cursor records; its log is not opened."""
    return partition_folder(broker.store.root, view.topic, partition)
