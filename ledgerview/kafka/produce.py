"""Produce: Kafka record batches decoded into Arrow columns and appended with Store.append, so produced messages
are the same messages the Reader, Spark SQL and the compactor see.

Per partition of a request:

1. Check the principal may WRITE the topic (TOPIC_AUTHORIZATION_FAILED); resolve the topic (a compacted name is
   read-only: INVALID_TOPIC_EXCEPTION) and the partition.
2. Decode every batch of the records field (magic 2, CRC-32C, contiguous inner offsets, any of the clients'
   codecs). A batch larger on the wire than the topic's max.message.bytes is MESSAGE_TOO_LARGE, as in Kafka (a
   compressed batch may hold more once decompressed; each message's size is checked when appended).
   Decompression stops as soon as the partition's batches together pass socket.request.max.bytes
   (RECORD_LIST_TOO_LARGE), so a compression bomb is never inflated past that bound. A batch an
   idempotent producer already sent (same producer id, epoch and base sequence as one of its last five) is not
   stored again; its first offset is answered.
3. Append the rest in one Store.append (validated whole before anything is written: all or nothing), with the
   producer's codec when it is one the store keeps (lz4, zstd) and the topic's compression.type is "producer".

acks=0 gets no response at all, as Kafka clients expect.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
from kafka.protocol.producer import ProduceResponse

from ledgerview.kafka.authorizer import Operation
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.compression import UnsupportedCompressionError
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.records import (
    BATCH_HEADER,
    CODEC_MASK,
    NO_PRODUCER_ID,
    BatchTooLargeError,
    CorruptBatchError,
    InvalidRecordsError,
    ProducedBatch,
    RecordListTooLargeError,
    UnsupportedBatchError,
    decode_batches,
)
from ledgerview.kafka.topics import resolve_topic
from storage.errors import (
    InvalidMessagesError,
    InvalidTopicNameError,
    LedgerviewError,
    MessageTooLargeError,
    UnknownTopicError,
)

log = logging.getLogger(__name__)

STORE_CODECS = {3: "lz4", 4: "zstd"}
ATTRIBUTES_POSITION = 21
BATCH_ERRORS: dict[type[Exception], ErrorCode] = {
    CorruptBatchError: ErrorCode.CORRUPT_MESSAGE,
    UnsupportedBatchError: ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    InvalidRecordsError: ErrorCode.INVALID_RECORD,
    UnsupportedCompressionError: ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
    BatchTooLargeError: ErrorCode.MESSAGE_TOO_LARGE,
    RecordListTooLargeError: ErrorCode.RECORD_LIST_TOO_LARGE,
}

Partition = ProduceResponse.TopicProduceResponse.PartitionProduceResponse


def handle_produce(broker: Broker, request: Any, version: int) -> Any | None:
    responses = []
    appended = False
    for topic in request.topic_data:
        partitions = []
        for data in topic.partition_data:
            error, base_offset = _produce_partition(broker, topic.name, data.index, data.records)
            appended |= error is ErrorCode.NONE
            partitions.append(Partition(index=data.index, error_code=error.value, base_offset=base_offset,
                                        log_append_time_ms=-1, log_start_offset=-1, record_errors=[],
                                        error_message=None))
        responses.append(ProduceResponse.TopicProduceResponse(name=topic.name, partition_responses=partitions))
    if appended:
        broker.appended.notify()
    if request.acks == 0:
        return None
    return ProduceResponse(version=version, responses=responses, throttle_time_ms=0)


def _produce_partition(broker: Broker, name: str, partition: int, records: bytes | None) -> tuple[ErrorCode, int]:
    if not broker.allowed_topic(Operation.WRITE, name):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1
    try:
        view = resolve_topic(broker.store, name, broker.options.compacted_suffix)
    except InvalidTopicNameError:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1
    except UnknownTopicError:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if view.compacted:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1
    if not 0 <= partition < view.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if not records:
        return ErrorCode.CORRUPT_MESSAGE, -1
    try:
        batches = decode_batches(records,
                                 batch_bytes_max=broker.store.topic_metadata(view.topic).config.max_message_bytes,
                                 total_bytes_max=broker.options.socket_request_max_bytes)
    except tuple(BATCH_ERRORS) as error:
        return BATCH_ERRORS[type(error)], -1
    fresh, repeated_offset = _without_retries(broker, view.topic, partition, batches)
    if not fresh:
        return ErrorCode.NONE, repeated_offset if repeated_offset is not None else -1
    codec = records[ATTRIBUTES_POSITION + 1] & CODEC_MASK if len(records) >= BATCH_HEADER.size else 0
    table = pa.concat_tables([batch.records for batch in fresh])
    try:
        result = broker.store.append(view.topic, table, partition, compression=STORE_CODECS.get(codec))
    except MessageTooLargeError:
        return ErrorCode.MESSAGE_TOO_LARGE, -1
    except InvalidMessagesError:
        return ErrorCode.INVALID_RECORD, -1
    except LedgerviewError:
        log.exception("appending to %s-%d failed", view.topic, partition)
        return ErrorCode.KAFKA_STORAGE_ERROR, -1
    first_offset = int(result.offsets[0])
    position = first_offset
    for batch in fresh:
        if batch.producer_id != NO_PRODUCER_ID:
            key = (view.topic, partition, batch.producer_id, batch.producer_epoch)
            broker.sequences.remember(key, batch.base_sequence, position)
        position += batch.records.num_rows
    return ErrorCode.NONE, first_offset if repeated_offset is None else repeated_offset


def _without_retries(broker: Broker, topic: str, partition: int,
                     batches: list[ProducedBatch]) -> tuple[list[ProducedBatch], int | None]:
    """The batches not stored yet, and the first offset of the first batch that was (None if none was)."""
    fresh, repeated = [], None
    for batch in batches:
        key = (topic, partition, batch.producer_id, batch.producer_epoch)
        stored = None if batch.producer_id == NO_PRODUCER_ID else broker.sequences.stored_offset(
            key, batch.base_sequence)
        if stored is None:
            fresh.append(batch)
        elif repeated is None and not fresh:
            repeated = stored
    return fresh, repeated
