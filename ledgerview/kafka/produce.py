"""Produce: Kafka record batches decoded into Arrow columns and appended with Store.append, so produced messages
are the same messages the Reader, Spark SQL and the compactor see.

Per partition of a request:

1. Check the principal may WRITE the topic (TOPIC_AUTHORIZATION_FAILED); resolve the topic (a compacted name is
   read-only: INVALID_TOPIC_EXCEPTION) and the partition.
2. Decode every batch of the records field (magic 2, CRC-32C, contiguous inner offsets, any of the clients'
   codecs), on the endpoint's worker thread when compressed or large (ledgerview/kafka/heavy_work.py), so the
   event loop keeps serving other connections meanwhile; the decompressed bytes count in queued.max.request.bytes
   from before they are produced until the records are appended or refused, and decompression waits while that
   pool is full (ledgerview/kafka/request_queue.py). A batch larger on the wire than the topic's
   max.message.bytes is MESSAGE_TOO_LARGE, as in Kafka (a compressed batch may hold more once decompressed; each
   message's size is checked when appended). Decompression stops as soon as the partition's batches together pass
   socket.request.max.bytes (RECORD_LIST_TOO_LARGE), so a compression bomb is never inflated past that bound.
3. Under the partition's writer lock, check each idempotent producer's batch against the partition's producer
   state (storage/producer_state.py, kept on disk, as Kafka's ProducerStateManager): a batch the producer sent
   before (same producer id, epoch, first and last sequence as one of its last five) is a duplicate, answered with
   its first offset and not stored again (also after a kill -9 of the endpoint); a first sequence that does not
   follow the producer's last is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is INVALID_PRODUCER_EPOCH.
4. Journal the idempotent batches, then append every batch in one Store.append (validated whole before anything
   is written: all or nothing), with the producer's codec when it is one the store keeps (lz4, zstd) and the
   topic's compression.type is "producer".

acks=0 gets no response at all, as Kafka clients expect.
"""

from __future__ import annotations

import functools
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
from ledgerview.kafka.topics import resolve_topic, unreadable
from storage.errors import (
    CorruptDataError,
    InvalidMessagesError,
    InvalidTopicNameError,
    LedgerviewError,
    MessageTooLargeError,
    UnknownTopicError,
)
from storage.partition_log import PartitionLog
from storage.producer_state import ProducerBatch, ProducerState, Verdict, last_sequence

log = logging.getLogger(__name__)

STORE_CODECS = {3: "lz4", 4: "zstd"}
OFF_LOOP_RECORDS_BYTES = 64 * 1024
"""Records this large, or compressed, are decoded on the worker thread (ledgerview/kafka/heavy_work.py)."""
ATTRIBUTES_POSITION = 21
BATCH_ERRORS: dict[type[Exception], ErrorCode] = {
    CorruptBatchError: ErrorCode.CORRUPT_MESSAGE,
    UnsupportedBatchError: ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    InvalidRecordsError: ErrorCode.INVALID_RECORD,
    UnsupportedCompressionError: ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
    BatchTooLargeError: ErrorCode.MESSAGE_TOO_LARGE,
    RecordListTooLargeError: ErrorCode.RECORD_LIST_TOO_LARGE,
}

VERDICT_ERRORS = {Verdict.OUT_OF_ORDER: ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                  Verdict.FENCED: ErrorCode.INVALID_PRODUCER_EPOCH}

Partition = ProduceResponse.TopicProduceResponse.PartitionProduceResponse


async def handle_produce(broker: Broker, request: Any, version: int) -> Any | None:
    responses = []
    appended = False
    for topic in request.topic_data:
        partitions = []
        for data in topic.partition_data:
            error, base_offset = await _produce_partition(broker, topic.name, data.index, data.records)
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


async def _produce_partition(broker: Broker, name: str, partition: int, records: memoryview | None
                             ) -> tuple[ErrorCode, int]:
    if not broker.allowed_topic(Operation.WRITE, name):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1
    try:
        view = resolve_topic(broker.store, name, broker.options.compacted_suffix)
    except InvalidTopicNameError:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1
    except UnknownTopicError:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    except CorruptDataError as error:
        return unreadable(name, partition, error), -1
    if view.compacted:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1
    if not 0 <= partition < view.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if not records:
        return ErrorCode.CORRUPT_MESSAGE, -1
    codec = records[ATTRIBUTES_POSITION + 1] & CODEC_MASK if len(records) >= BATCH_HEADER.size else 0
    decode = functools.partial(decode_batches, records,
                               batch_bytes_max=broker.store.topic_metadata(view.topic).config.max_message_bytes,
                               total_bytes_max=broker.options.socket_request_max_bytes)
    reserved = 0
    try:
        if codec or len(records) > OFF_LOOP_RECORDS_BYTES:
            batches, reserved = await broker.heavy_work.run(lambda reserve: decode(reserve=reserve),
                                                            parked_bytes=broker.request_bytes)
        else:
            batches = decode()
    except tuple(BATCH_ERRORS) as error:
        return BATCH_ERRORS[type(error)], -1
    try:
        partition_log = broker.store.partition_log(view.topic, partition)
        with partition_log.writer_lock:
            partition_log.refresh()
            return _append(broker, partition_log, batches, STORE_CODECS.get(codec))
    except MessageTooLargeError:
        return ErrorCode.MESSAGE_TOO_LARGE, -1
    except InvalidMessagesError:
        return ErrorCode.INVALID_RECORD, -1
    except CorruptDataError as error:  # the partition's log does not open (a damaged batch where it is recovered)
        return unreadable(name, partition, error), -1
    except (LedgerviewError, OSError):
        log.exception("appending to %s-%d failed", view.topic, partition)
        return ErrorCode.KAFKA_STORAGE_ERROR, -1
    finally:
        broker.heavy_work.release(reserved)  # the decoded records are appended or refused


def _append(broker: Broker, partition_log: PartitionLog, batches: list[ProducedBatch], codec: str | None) -> (
    tuple[ErrorCode, int]
):
    """Check the idempotent producers' batches against the partition's producer state, then journal and append
    them all in one Store.append; the caller holds the partition's writer lock."""
    state = broker.sequences.state_of(partition_log)
    first_offset = partition_log.end_offset
    error, duplicate_offset, planned = _plan(state, batches, first_offset, partition_log.clock())
    if error is not ErrorCode.NONE or duplicate_offset is not None:
        return error, -1 if duplicate_offset is None else duplicate_offset
    active = partition_log.active.base_offset
    journal_bytes = state.begin(planned) if planned else 0
    try:
        broker.store.append(partition_log.topic, pa.concat_tables([batch.records for batch in batches]),
                            partition_log.partition, compression=codec)
    except BaseException:
        if planned:
            state.abandon(journal_bytes)
        raise
    if planned:
        state.commit(planned, end_offset=partition_log.end_offset,
                     rolled=partition_log.active.base_offset != active)
    return ErrorCode.NONE, first_offset


def _plan(state: ProducerState, batches: list[ProducedBatch], first_offset: int, now_ms: int) -> (
    tuple[ErrorCode, int | None, list[ProducerBatch]]
):
    """Kafka's producer-state checks of each batch in order: the error for the partition, the first offset of an
    earlier copy when a batch is a duplicate (nothing is appended then, as Kafka answers), and the idempotent
    batches to journal with the offsets they will get."""
    planned: list[ProducerBatch] = []
    offset = first_offset
    for batch in batches:
        count = batch.records.num_rows
        if batch.producer_id != NO_PRODUCER_ID:
            last = last_sequence(batch.base_sequence, count)
            previous = next((earlier for earlier in reversed(planned) if earlier.producer_id == batch.producer_id),
                            None)
            if previous is None:
                verdict, earlier_offset = state.check(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                                      last)
            else:
                verdict, earlier_offset = (Verdict.APPEND if previous.followed_by(
                    batch.producer_epoch, batch.base_sequence) else Verdict.OUT_OF_ORDER), None
            if verdict is Verdict.DUPLICATE:
                return ErrorCode.NONE, earlier_offset, []
            if verdict is not Verdict.APPEND:
                return VERDICT_ERRORS[verdict], None, []
            planned.append(ProducerBatch(batch.producer_id, batch.producer_epoch, batch.base_sequence, last,
                                         offset, offset + count - 1, now_ms))
        offset += count
    return ErrorCode.NONE, None, planned
