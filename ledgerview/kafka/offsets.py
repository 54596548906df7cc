"""ListOffsets and OffsetForLeaderEpoch, answered from the view a topic name serves.

ListOffsets: -1 is the end offset, -2 the view's first offset (the raw log start, or 0 for a compacted view that
has a ledger: clients fetch from there and get the ledger's first batch), a timestamp is Kafka's offsetsForTimes
on that view (offset and timestamp -1 when no message is that recent).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import ListOffsetsResponse, OffsetForLeaderEpochResponse

from ledgerview.kafka.authorizer import Operation
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.topics import TopicView, resolve_topic, unreadable
from readers.partition_read import open_partition_read
from readers.positions import EARLIEST, LATEST, Position, Timestamp
from storage.errors import CorruptDataError, InvalidTopicNameError, UnknownTopicError

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

ListedTopic = ListOffsetsResponse.ListOffsetsTopicResponse
ListedPartition = ListedTopic.ListOffsetsPartitionResponse
EpochTopic = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochPartition = EpochTopic.EpochEndOffset


def resolve_partition(broker: Broker, name: str, partition: int, operation: Operation) -> TopicView | ErrorCode:
    """The view of ``name`` if it has ``partition`` and the principal may ``operation`` it;
    TOPIC_AUTHORIZATION_FAILED when it may not, UNKNOWN_TOPIC_OR_PARTITION for an unknown or invalid topic or
    partition, KAFKA_STORAGE_ERROR when the topic's metadata record is damaged (topics.unreadable)."""
    if not broker.allowed_topic(operation, name):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    try:
        view = resolve_topic(broker.store, name, broker.options.compacted_suffix)
    except (InvalidTopicNameError, UnknownTopicError):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    except CorruptDataError as error:
        return unreadable(name, partition, error)
    return view if 0 <= partition < view.partitions else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def handle_list_offsets(broker: Broker, request: Any, version: int) -> Any:
    topics = [ListedTopic(name=topic.name,
                          partitions=[_listed(broker, topic.name, wanted) for wanted in topic.partitions])
              for topic in request.topics]
    return ListOffsetsResponse(version=version, throttle_time_ms=0, topics=topics)


def _listed(broker: Broker, name: str, wanted: Any) -> Any:
    view = resolve_partition(broker, name, wanted.partition_index, Operation.DESCRIBE)
    if isinstance(view, ErrorCode):
        return ListedPartition(partition_index=wanted.partition_index, timestamp=-1, offset=-1,
                               error_code=view.value)
    try:
        offset, timestamp = _list_offset(broker, view, wanted.partition_index, wanted.timestamp)
    except CorruptDataError as error:  # the partition cannot be opened or read: its own error, not the request's
        return ListedPartition(partition_index=wanted.partition_index, timestamp=-1, offset=-1,
                               error_code=unreadable(name, wanted.partition_index, error).value)
    return ListedPartition(partition_index=wanted.partition_index, error_code=0, timestamp=timestamp, offset=offset,
                           leader_epoch=0)


def _list_offset(broker: Broker, view: TopicView, partition: int, timestamp: int) -> tuple[int, int]:
    named: dict[int, Position] = {LATEST_TIMESTAMP: LATEST, EARLIEST_TIMESTAMP: EARLIEST}
    position = named.get(timestamp, Timestamp(timestamp))
    read = open_partition_read(broker.store, view.topic, partition, position, read_compacted=view.compacted)
    try:
        if not isinstance(position, Timestamp):
            return read.start_offset, -1
        for batch in read.batches():
            return int(batch.column("offset")[0].as_py()), int(batch.column("timestamp")[0].as_py())
        return -1, -1
    finally:
        read.close()


def handle_offset_for_leader_epoch(broker: Broker, request: Any, version: int) -> Any:
    """The epoch is 0 forever, so its end offset is the end offset of the partition."""
    topics = [EpochTopic(topic=topic.topic, partitions=[_epoch_end(broker, topic.topic, wanted.partition)
                                                        for wanted in topic.partitions])
              for topic in request.topics]
    return OffsetForLeaderEpochResponse(version=version, throttle_time_ms=0, topics=topics)


def _epoch_end(broker: Broker, name: str, partition: int) -> Any:
    view = resolve_partition(broker, name, partition, Operation.DESCRIBE)
    if isinstance(view, ErrorCode):
        return EpochPartition(error_code=view.value, partition=partition,
                              leader_epoch=-1, end_offset=-1)
    try:
        end_offset = broker.store.end_offset(view.topic, partition)
    except CorruptDataError as error:
        return EpochPartition(error_code=unreadable(name, partition, error).value, partition=partition,
                              leader_epoch=-1, end_offset=-1)
    return EpochPartition(error_code=0, partition=partition, leader_epoch=0, end_offset=end_offset)
