"""Fetch: stored Arrow batches encoded as Kafka record batches, long-polling until data arrives.

The response carries at most the broker's fetch.max.bytes (EndpointOptions.fetch_max_bytes) or the client's
max_bytes when smaller, and each partition its partition_max_bytes within what is left, counted as each batch's
header plus its messages' estimated sizes.

Per partition, a bounded read of the raw log or of the compacted view (readers.partition_read: the ledger with
its original offsets, then the raw tail) from the fetch offset, sliced to the partition's byte budget (the first
batch is always sent whole enough to hold one message, as KIP-74 asks). The handler only selects and sizes the
batches (consecutive small ones grouped, large ones split, into Kafka batches of up to about
BATCH_ENCODE_BYTES): it returns a StreamedFetchResponse (ledgerview/kafka/fetch_response.py) whose batches are
encoded one at a time as the connection writes them (ledgerview/kafka/response_sender.py), so a response is never
held whole. Encoded batches are cached by offset
range (ledgerview/kafka/batch_cache.py); a batch is laid out once, to size it, its layout kept for its encoding
(batch_layouts.py), and encoded into a reused buffer (batch_buffers.py). When a partition's read stops at its byte
budget, the response carries a read-ahead: once it is written, the connection reads that partition on as the
consumer's next Fetch will and encodes its batches into the cache while the client handles this response
(ledgerview/kafka/read_ahead.py).

Reaching the high-water mark: the compacted view (and a cleaned raw log) has gaps in its offsets. Clients move to
the last batch's ``lastOffsetDelta + 1``, so when a read reaches the end offset its last batch is widened to end
at the end offset - 1; when nothing is left to send below the end offset, an empty batch spans the gap. Otherwise
a consumer would stop short of the high-water mark for good and never see its lag reach 0.

A damaged batch (a CRC that does not match, in a sealed segment or a ledger): every batch before it is served;
a fetch from its offset gets CORRUPT_MESSAGE for the partition, as Kafka answers a corrupt record on read, and
the damage is logged with the file and position. A partition whose log does not open at all (a damaged batch where
it is recovered) gets KAFKA_STORAGE_ERROR (topics.unreadable); the response's other partitions are served.

Long polling: while the response holds fewer than min_bytes, wait for this endpoint's next append, or re-check
every POLL_INTERVAL_SECONDS for appends made by other processes, until max_wait_ms passes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from ledgerview.kafka.authorizer import Operation
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.fetch_response import (
    Buffer,
    PartitionAnswer,
    Piece,
    StreamedFetchResponse,
    close_all,
    fixed,
)
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.read_ahead import KeptRead, NextRead
from ledgerview.kafka.record_encoding import encode_batch, encode_empty_batch
from ledgerview.kafka.records import BATCH_HEADER_BYTES
from ledgerview.kafka.topics import TopicView, resolve_topic, unreadable
from readers.partition_read import open_partition_read
from storage.binary_arrays import value_lengths
from storage.errors import (
    CorruptDataError,
    CorruptSegmentError,
    InvalidTopicNameError,
    LedgerviewError,
    OffsetOutOfRangeError,
    UnknownTopicError,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_SECONDS = 0.1
RECORD_OVERHEAD_BYTES = 16
"""Rough bytes a record adds beyond its key and value (varints, attributes), for the byte budget."""

BATCH_ENCODE_BYTES = 1024 * 1024
"""The most estimated message bytes encoded into one Kafka batch (a larger message goes alone): a response is
written one batch at a time, so this bounds what one encoding step holds and how long it keeps the event loop."""


async def handle_fetch(broker: Broker, request: Any, version: int) -> StreamedFetchResponse:
    deadline = time.monotonic() + request.max_wait_ms / 1000
    while True:
        response = _read_all(broker, request, version)
        remaining = deadline - time.monotonic()
        if response.records_bytes >= max(request.min_bytes, 1) or response.has_errors or remaining <= 0:
            return response
        response.close()
        await broker.appended.wait(min(remaining, POLL_INTERVAL_SECONDS))


def _read_all(broker: Broker, request: Any, version: int) -> StreamedFetchResponse:
    cap = broker.options.fetch_max_bytes
    budget = min(request.max_bytes, cap) if request.max_bytes > 0 else cap
    response = StreamedFetchResponse(version, [])
    total = 0
    next_reads: list[NextRead] = []
    try:
        for topic in request.topics:
            answers = []
            for wanted in topic.partitions:
                read = NextRead(topic.topic, wanted.partition, wanted.fetch_offset,
                                min(wanted.partition_max_bytes, max(budget - total, 0)), first=total == 0)
                kept = broker.kept_reads.take(read)
                if kept is not None:
                    response.closers.extend(kept.closers)
                answer = read_partition(broker, read.topic, read.partition, read.offset, read.max_bytes,
                                        first=read.first, closers=response.closers, kept=kept)
                if answer.batches and answer.resume_offset is not None:
                    next_reads.append(replace(read, offset=answer.resume_offset))
                total += answer.records_bytes
                answers.append(answer)
            response.topics.append((topic.topic, answers))
    except BaseException:
        response.close()
        raise
    finally:
        broker.kept_reads.drop()  # what this Fetch did not ask for
    if next_reads:
        response.read_ahead = functools.partial(read_ahead, broker, next_reads)
    return response


def read_ahead(broker: Broker, reads: list[NextRead]) -> Generator[Piece, None, None]:
    """The batches of each of ``reads``, read now as the Fetch asking for it would read them, for the caller to
    encode into the fetch cache meanwhile (response_sender.py); a read of the raw log is also kept for that Fetch
    (broker.kept_reads: ledgerview/kafka/read_ahead.py). A read answered with an error is not kept; an OSError or
    a store error (the topic deleted since, say) ends the read-ahead quietly, without closing the connection as it
    would if raised: the Fetch that asks for that read meets it and answers for it."""
    for read in reads:
        closers: list[Callable[[], None]] = []
        try:
            view = resolve_topic(broker.store, read.topic, broker.options.compacted_suffix)  # before the read
            answer = read_partition(broker, read.topic, read.partition, read.offset, read.max_bytes,
                                    first=read.first, closers=closers)
        except BaseException as error:
            close_all(closers)
            if isinstance(error, OSError | LedgerviewError):
                log.debug("reading %s-%d ahead from offset %d failed: %s", read.topic, read.partition, read.offset,
                          error)
                return
            raise
        if answer.error is not ErrorCode.NONE or view.compacted:
            try:
                yield from answer.batches if answer.error is ErrorCode.NONE else ()
            finally:
                close_all(closers)
            continue
        broker.kept_reads.keep(read, KeptRead(answer, closers, view.created_ms))
        yield from answer.batches


def read_partition(broker: Broker, name: str, partition: int, offset: int, max_bytes: int, *, first: bool,
                   closers: list[Callable[[], None]], kept: KeptRead | None = None) -> PartitionAnswer:
    """The batches of one partition from ``offset``, within ``max_bytes`` unless this is the first partition of
    the response with data (then at least one message), sized but not encoded yet; the read they come from is
    added to ``closers``. ``kept``, read ahead for exactly this read, is served instead of reading again once the
    principal and the partition are checked as for any read, if it still stands (_still_served)."""
    if not broker.allowed_topic(Operation.READ, name):
        return PartitionAnswer(partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    try:
        view = resolve_topic(broker.store, name, broker.options.compacted_suffix)
    except (InvalidTopicNameError, UnknownTopicError):
        return PartitionAnswer(partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    except CorruptDataError as error:
        return PartitionAnswer(partition, unreadable(name, partition, error))
    if not 0 <= partition < view.partitions:
        return PartitionAnswer(partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    served = None if kept is None else _still_served(broker, view, partition, offset, kept)
    if served is not None:
        return served
    try:
        read = open_partition_read(broker.store, view.topic, partition, offset, read_compacted=view.compacted)
    except OffsetOutOfRangeError as error:
        return PartitionAnswer(partition, ErrorCode.OFFSET_OUT_OF_RANGE, error.end, error.start)
    except CorruptDataError as error:  # the partition's log does not open (a damaged batch where it is recovered)
        return PartitionAnswer(partition, unreadable(name, partition, error))
    closers.append(read.close)
    try:
        log_start = 0 if read.ledger is not None else broker.store.start_offset(view.topic, partition)
        end = read.end_offset
        batches = _UntilDamage(read.batches())
        pieces, resume_offset = _pieces(broker, view, partition, batches, offset, end, max_bytes,
                                        at_least_one=first)
        if batches.damage is not None:
            log.error("serving %s-%d up to a damaged batch: %s", name, partition, batches.damage)
            if not pieces:
                return PartitionAnswer(partition, ErrorCode.CORRUPT_MESSAGE, end, log_start)
        return PartitionAnswer(partition, ErrorCode.NONE, end, log_start, pieces, resume_offset)
    except LedgerviewError:  # a corrupt sealed segment, say: the client sees a storage error, not a reconnect storm
        log.exception("reading %s-%d from offset %d failed", name, partition, offset)
        return PartitionAnswer(partition, ErrorCode.KAFKA_STORAGE_ERROR)


def _still_served(broker: Broker, view: TopicView, partition: int, offset: int, kept: KeptRead) -> (
    PartitionAnswer | None
):
    """``kept``'s answer with the partition's current high-water mark and log start, if the log it was read from
    still serves it: the same topic (not deleted and created again since), whose log start has not passed
    ``offset`` (retention, DeleteRecords); else None, and the partition is read again."""
    if view.compacted or view.created_ms != kept.topic_created_ms:
        return None
    log_start = broker.store.start_offset(view.topic, partition)
    if log_start > offset:
        return None
    return replace(kept.answer, high_watermark=broker.store.end_offset(view.topic, partition),
                   log_start_offset=log_start)


class _UntilDamage:
    """The batches of a read up to the first damaged one (CorruptSegmentError, kept in ``damage``): what comes
    before it is served, and the fetch at its offset gets CORRUPT_MESSAGE, which ends real clients' reads with an
    error (KAFKA_STORAGE_ERROR would have them retry for ever)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self.damage: CorruptSegmentError | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._batches
        except CorruptSegmentError as error:
            self.damage = error


def _pieces(broker: Broker, view: TopicView, partition: int, batches: _UntilDamage, offset: int,
            end: int, max_bytes: int, *, at_least_one: bool) -> tuple[list[Piece], int | None]:
    """The batches within the byte budget, consecutive small ones grouped into one Kafka batch of about
    BATCH_ENCODE_BYTES at most (encoding costs per batch, and a Kafka producer's batches are often about a hundred
    messages); the last one reaches end - 1 when the read reached the end (not when it stopped at a damaged
    batch). With them, when the budget stopped the read, the offset after the last message served (where the
    consumer's next Fetch starts, gaps in the offsets or not), else None."""
    pieces: list[Piece] = []
    group: list[pa.RecordBatch] = []
    group_bytes = spent = 0
    for batch in batches:
        room = max_bytes - spent - BATCH_HEADER_BYTES
        rows, taken_bytes = batch.num_rows, _total_message_bytes(batch)
        if taken_bytes > room:  # the batch is cut at the budget: each message sized
            ends = np.cumsum(_message_bytes(batch))
            rows = _rows_within(ends, room, at_least_one=at_least_one and not spent)
            if rows == 0:
                break
            taken_bytes = int(ends[rows - 1])
        if group and (group_bytes + taken_bytes > BATCH_ENCODE_BYTES or not batch.schema.equals(group[0].schema)):
            pieces.extend(_group_pieces(broker, view, partition, group, group_bytes, None))
            group, group_bytes = [], 0
        group.append(batch.slice(0, rows))
        group_bytes += taken_bytes
        spent += BATCH_HEADER_BYTES + taken_bytes
        if rows < batch.num_rows:
            break
    else:
        if group:
            pieces.extend(_group_pieces(broker, view, partition, group, group_bytes,
                                        None if batches.damage else end - 1))
        elif offset < end and batches.damage is None:
            pieces.append(fixed(encode_empty_batch(offset, end - 1)))
        return pieces, None
    if not group:
        return pieces, None
    pieces.extend(_group_pieces(broker, view, partition, group, group_bytes, None))
    return pieces, group[-1].column("offset")[-1].as_py() + 1


def _group_pieces(broker: Broker, view: TopicView, partition: int, group: list[pa.RecordBatch], group_bytes: int,
                  last_offset: int | None) -> Iterator[Piece]:
    """A group of consecutive batches (of ``group_bytes`` estimated message bytes) as one Kafka batch, or a lone
    batch larger than BATCH_ENCODE_BYTES as Kafka batches of about that size (one message at least); the last one
    ends at ``last_offset`` when given."""
    if len(group) > 1 or group_bytes <= BATCH_ENCODE_BYTES:
        yield _encoding(broker, view, partition, group, last_offset)
        return
    [batch] = group
    ends = np.cumsum(_message_bytes(batch))
    start = 0
    while start < batch.num_rows:
        reached = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, reached + BATCH_ENCODE_BYTES, side="right")), start + 1)
        yield _encoding(broker, view, partition, [batch.slice(start, stop - start)],
                        last_offset if stop == batch.num_rows else None)
        start = stop


def _encoding(broker: Broker, view: TopicView, partition: int, batches: list[pa.RecordBatch],
              last_offset: int | None) -> Piece:
    """One Kafka batch of ``batches`` (consecutive, of one schema), sized now and encoded (or taken from the
    cache) when written. Several are joined for each of the two steps, a copy dropped after it: until then the
    response holds only the read's batches, most of them slices of the segments' memory maps."""
    first = batches[0].column("offset")[0].as_py()
    last = batches[-1].column("offset")[-1].as_py() if last_offset is None else last_offset
    rows = sum(batch.num_rows for batch in batches)
    key = (view.topic, view.created_ms, view.compacted, partition, first, last, rows)
    cache = broker.fetch_cache

    def joined() -> pa.RecordBatch:
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

    size = cache.sized(key, joined)

    def encode() -> Buffer:
        batch = joined()
        return encode_batch(batch, last_offset=last, into=cache.buffer(size), layout=cache.layout(key, batch))

    return Piece(size, lambda: cache.get_or_encode(key, encode), cache.charge(size),
                 lambda encoded: cache.written(key, encoded))


def _message_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Each message's estimated size: key, value and RECORD_OVERHEAD_BYTES."""
    sizes = np.full(batch.num_rows, RECORD_OVERHEAD_BYTES, dtype=np.int64)
    for name in ("key", "value"):
        sizes += value_lengths(batch.column(name))
    return sizes


def _total_message_bytes(batch: pa.RecordBatch) -> int:
    """The sum of ``_message_bytes``, from the key and value columns' offsets alone."""
    values = batch.column("key").total_values_length + batch.column("value").total_values_length
    return int(RECORD_OVERHEAD_BYTES * batch.num_rows + values)


def _rows_within(ends: np.ndarray, budget: int, *, at_least_one: bool) -> int:
    """How many leading messages, whose estimated sizes summed up to each are ``ends``, fit ``budget`` bytes (one
    at least when ``at_least_one``)."""
    fitting = int(np.searchsorted(ends, budget, side="right"))
    return max(fitting, 1) if at_least_one else fitting
