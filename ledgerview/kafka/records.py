"""Kafka's RecordBatch v2 (magic 2) to Arrow columns and back, a whole batch at a time.

Layout (DefaultRecordBatch.java): a 61-byte big-endian header ``baseOffset, batchLength, partitionLeaderEpoch,
magic, crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence,
recordsCount``, the CRC-32C covering attributes to the end; then the records (compressed as one blob when the
attributes name a codec), each ``length attributes timestampDelta offsetDelta keyLength key valueLength value
headersCount headers`` with zigzag varints.

This module has the format and its decoding; ledgerview/kafka/record_encoding.py writes batches. Producers send
records of one size in long runs (same-sized keys and values, no headers), so decoding first tries uniform runs: a
run of same-shaped records is a 2-D array of bytes, whose fields are columns, checked and read in a few column
operations, keys and values copied as one 2-D slice each. Batches that are not a few such runs take the general
path: it finds the record starts (guessed runs of equal lengths checked in numpy passes, a loop over the length
varints where runs are short), reads every other field of every record in numpy passes
(ledgerview/kafka/varints.py) and gathers keys and values into Arrow binary columns. Headers, rare in practice,
take a per-record path. Both paths give the same records (tests/test_kafka_records_uniform.py).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import crc32c
import numpy as np
import pyarrow as pa

from ledgerview.kafka.compression import DecompressedTooLargeError, Records, decompress, no_reserve
from ledgerview.kafka.varints import (
    INT_VARINT_BYTES_MAX,
    LONG_VARINT_BYTES_MAX,
    VarintError,
    read_varint,
    read_varints,
)
from storage.schema import HEADER_TYPE

BATCH_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_BYTES: Final = BATCH_HEADER.size
CRC_START: Final = 21
MAGIC: Final = 2
LENGTH_FIELD_END: Final = 12
CODEC_MASK: Final = 0b111
TRANSACTIONAL_FLAG: Final = 0b1_0000
CONTROL_FLAG: Final = 0b10_0000
NO_PRODUCER_ID: Final = -1
MESSAGE_MAX_BYTES_DEFAULT: Final = 1048588
"""Kafka's broker default ``message.max.bytes``, the largest batch (here: its decompressed records)."""
RECORDS_MAX_BYTES_DEFAULT: Final = 104857600
"""Kafka's ``socket.request.max.bytes`` default, the most one partition's records may decompress to."""

assert BATCH_HEADER_BYTES == 61


class RecordBatchError(ValueError):
    """Produced bytes that are not a batch ledgerview can store; ``reason`` says which check failed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class CorruptBatchError(RecordBatchError):
    """A truncated batch, a CRC mismatch, or records that do not parse."""


class UnsupportedBatchError(RecordBatchError):
    """A valid batch of a kind ledgerview does not store: old magic, transactional or control batches."""


class InvalidRecordsError(RecordBatchError):
    """Records whose inner offsets are not 0, 1, 2, ... as a producer must send them."""


class BatchTooLargeError(RecordBatchError):
    """A batch larger on the wire than the topic's max.message.bytes (Kafka's MESSAGE_TOO_LARGE)."""


class RecordListTooLargeError(RecordBatchError):
    """One partition's batches decompress to more than the request may bring in (Kafka's RECORD_LIST_TOO_LARGE)."""


@dataclass(frozen=True)
class ProducedBatch:
    """One decoded batch of a Produce request."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: pa.Table
    """Columns key, value, timestamp, headers (storage.schema's append input)."""


def decode_batches(data: bytes | memoryview, *, batch_bytes_max: int = MESSAGE_MAX_BYTES_DEFAULT,
                   total_bytes_max: int = RECORDS_MAX_BYTES_DEFAULT,
                   reserve: Callable[[int], None] = no_reserve) -> list[ProducedBatch]:
    """Every batch of a Produce request's records field, checked (magic, length, CRC-32C, offsets). As Kafka does,
    a batch larger on the wire than ``batch_bytes_max`` (the topic's max.message.bytes) raises BatchTooLargeError,
    and each message's own size is checked when it is appended; a compressed batch may hold more than that once
    decompressed. Batches that together decompress to more than ``total_bytes_max`` raise RecordListTooLargeError:
    decompression stops there, so a compression bomb is never inflated past that bound. ``reserve(n)`` is called
    before ``n`` more bytes are decompressed (ledgerview/kafka/compression.py), and with the records' size before
    they are decoded into columns."""
    view = memoryview(data)
    batches = []
    position = spent = 0
    while position < len(view):
        if len(view) - position < BATCH_HEADER_BYTES:
            raise CorruptBatchError(f"{len(view) - position} bytes left, less than a batch header")
        (_, length, _, magic, crc, attributes, last_delta, base_timestamp, _, producer_id, producer_epoch,
         base_sequence, count) = BATCH_HEADER.unpack_from(view, position)
        if magic != MAGIC:
            raise UnsupportedBatchError(f"magic {magic}: only record batches v2 (magic 2) are accepted")
        end = position + LENGTH_FIELD_END + length
        if length < BATCH_HEADER_BYTES - LENGTH_FIELD_END or end > len(view):
            raise CorruptBatchError(f"batch length {length} does not fit the {len(view) - position} bytes left")
        if crc32c.crc32c(view[position + CRC_START : end]) != crc:
            raise CorruptBatchError("CRC-32C mismatch")
        if attributes & (TRANSACTIONAL_FLAG | CONTROL_FLAG):
            raise UnsupportedBatchError("transactional and control batches are not supported")
        if count != last_delta + 1:
            raise InvalidRecordsError(f"{count} records but lastOffsetDelta {last_delta}")
        if end - position > batch_bytes_max:
            raise BatchTooLargeError(f"a batch of {end - position} bytes, above max.message.bytes {batch_bytes_max}")
        body = _decompressed(attributes & CODEC_MASK, view[position + BATCH_HEADER_BYTES : end],
                             total_bytes_max - spent, reserve)
        spent += len(body)
        reserve(len(body))  # the decoded keys and values: at most the records' size
        batches.append(ProducedBatch(producer_id, producer_epoch, base_sequence,
                                     decode_records(body, count, base_timestamp)))
        position = end
    return batches


def _decompressed(codec: int, data: memoryview, remaining_bytes: int, reserve: Callable[[int], None]) -> Records:
    try:
        return decompress(codec, data, limit_bytes=remaining_bytes, reserve=reserve)
    except DecompressedTooLargeError as error:
        raise RecordListTooLargeError(f"the batches decompress to more than {error.limit_bytes} more bytes, "
                                      "past the records a request may bring in") from error
    except (zlib.error, OSError, pa.ArrowInvalid, IndexError, struct.error) as error:
        raise CorruptBatchError(f"compressed records do not decompress: {error}") from error


def decode_records(body: Records, count: int, base_timestamp: int) -> pa.Table:
    """The ``count`` uncompressed records of one batch as columns key, value, timestamp, headers."""
    try:
        return _decode_records(body, count, base_timestamp)
    except (VarintError, IndexError, UnicodeDecodeError) as error:  # a header key must be UTF-8
        raise CorruptBatchError(f"records do not parse: {error}") from error


def _decode_records(body: Records, count: int, base_timestamp: int) -> pa.Table:
    data = np.frombuffer(body, dtype=np.uint8)
    runs = _uniform_runs(body, data, count)
    if runs is not None:
        return _decode_runs(data, runs, count, base_timestamp)
    starts, ends = _record_bounds(body, count)
    position = starts + 1  # the record's attributes byte, unused
    timestamp_deltas, sizes = read_varints(data, position, LONG_VARINT_BYTES_MAX)
    position += sizes
    offset_deltas, sizes = read_varints(data, position)
    if not np.array_equal(offset_deltas, np.arange(count)):
        raise InvalidRecordsError("inner offset deltas are not 0, 1, 2, ...")
    position += sizes
    key_lengths, sizes = read_varints(data, position)
    key_starts = position + sizes
    position = key_starts + np.maximum(key_lengths, 0)
    value_lengths, sizes = read_varints(data, position)
    value_starts = position + sizes
    position = value_starts + np.maximum(value_lengths, 0)
    header_counts, sizes = read_varints(data, position)
    position += sizes
    if (key_lengths < -1).any() or (value_lengths < -1).any() or (header_counts < 0).any():
        raise CorruptBatchError("negative lengths in records")
    if header_counts.any():
        headers = _decode_headers(body, position, ends, header_counts)
    elif not np.array_equal(position, ends):
        raise CorruptBatchError("record lengths do not match their fields")
    else:
        headers = pa.nulls(count, HEADER_TYPE)
    return pa.table({
        "key": _gather_binary(data, key_starts, key_lengths),
        "value": _gather_binary(data, value_starts, value_lengths),
        "timestamp": _int64_array(timestamp_deltas + base_timestamp),
        "headers": headers,
    })


def _int64_array(values: np.ndarray) -> pa.Array:
    """An Arrow int64 array over ``values`` (pa.array of an ndarray would import pandas on its first call)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


# ------------------------------------------------------------------------------------------ decode, uniform runs
@dataclass(frozen=True)
class _UniformRun:
    """``records`` consecutive records from byte ``start``, each laid out as ``shape`` says: the same length, key
    length and value length, no headers, and timestamp and offset deltas of the same varint sizes (their values
    differ)."""

    start: int
    records: int
    shape: _RecordShape


UNIFORM_RUNS_MAX = 8
"""More runs than this (values of many sizes, headers): the general path decodes the batch."""


def _uniform_runs(body: Records, data: np.ndarray, count: int) -> list[_UniformRun] | None:
    """The records as a few uniform runs, or None when they are not (then the general path decodes them, and
    raises the error a bad batch deserves).

    Producers send records of one size in long runs (same-sized keys and values; a run ends where a delta's
    varint grows a byte, e.g. the offset delta at 64 and 8192). Each run is taken as a 2-D array of records, so
    checking that every record has the first one's layout, and reading its fields, are a few column operations
    instead of varint reads per record. A record whose layout differs (or a run shorter than MIN_RUN_RECORDS
    before the last) ends the attempt: at most UNIFORM_RUNS_MAX column passes over the batch are spent on it."""
    runs: list[_UniformRun] = []
    position = done = 0
    while done < count:
        run = _uniform_run(body, data, position, count - done)
        if run is None or len(runs) == UNIFORM_RUNS_MAX or (run.records < MIN_RUN_RECORDS
                                                           and done + run.records < count):
            return None
        runs.append(run)
        position += run.records * run.shape.stride
        done += run.records
    return runs if position == len(data) else None


def _uniform_run(body: Records, data: np.ndarray, start: int, count_max: int) -> _UniformRun | None:
    """The longest run of records from ``start`` (at most ``count_max``) laid out as the first one."""
    first = _record_shape(body, start)
    if first is None:
        return None
    records = min(count_max, (len(data) - start) // first.stride)
    if records == 0:
        return None
    table = data[start : start + records * first.stride].reshape(records, first.stride)
    same = np.ones(records, np.bool_)
    for column in first.fixed_columns:  # the length, key length, value length and header count bytes
        same &= table[:, column] == table[0, column]
    for at, size in ((first.timestamp_at, first.timestamp_bytes), (first.offset_at, first.offset_bytes)):
        for column in range(at, at + size):  # a varint of the same size: "more follow" on all bytes but its last
            same &= (table[:, column] >= 0x80) == (column < at + size - 1)
    records = records if same.all() else int(same.argmin())
    return _UniformRun(start, records, first)


@dataclass(frozen=True)
class _RecordShape:
    """Where one record's fields are, counted from its first byte."""

    stride: int
    timestamp_at: int
    timestamp_bytes: int
    offset_at: int
    offset_bytes: int
    key_at: int
    key_length: int
    value_at: int
    value_length: int
    fixed_columns: tuple[int, ...]
    """Bytes every record of a uniform run has equal to this one's."""


def _record_shape(body: Records, start: int) -> _RecordShape | None:
    """The layout of the record at ``start``; None when it is not one a uniform run can have (headers, varints
    longer than the general path reads, fields that do not fill the record, bytes past the end)."""
    try:
        length, timestamp_at = read_varint(body, start)
        timestamp_at += 1  # the attributes byte
        _, offset_at = read_varint(body, timestamp_at)
        _, key_length_at = read_varint(body, offset_at)
        key_length, key_at = read_varint(body, key_length_at)
        value_length_at = key_at + max(key_length, 0)
        value_length, value_at = read_varint(body, value_length_at)
        header_count_at = value_at + max(value_length, 0)
        header_count, end = read_varint(body, header_count_at)
    except (VarintError, IndexError):
        return None
    length_bytes = timestamp_at - 1 - start
    sizes = (length_bytes, offset_at - timestamp_at, key_length_at - offset_at, key_at - key_length_at,
             value_at - value_length_at)
    if (header_count != 0 or key_length < -1 or value_length < -1 or end != start + length_bytes + length
            or end > len(body) or max(sizes[0], *sizes[2:]) > INT_VARINT_BYTES_MAX
            or sizes[1] > LONG_VARINT_BYTES_MAX):
        return None
    fixed = (*range(length_bytes), *range(key_length_at - start, key_at - start),
             *range(value_length_at - start, value_at - start), *range(header_count_at - start, end - start))
    return _RecordShape(end - start, timestamp_at - start, offset_at - timestamp_at, offset_at - start,
                        key_length_at - offset_at, key_at - start, key_length, value_at - start, value_length,
                        fixed)


def _decode_runs(data: np.ndarray, runs: list[_UniformRun], count: int, base_timestamp: int) -> pa.Table:
    """The records of uniform runs as columns: each field read as columns of the run's 2-D array of records, keys
    and values copied as one 2-D slice each."""
    timestamps = np.empty(count, np.int64)
    key_lengths = np.repeat([run.shape.key_length for run in runs], [run.records for run in runs])
    value_lengths = np.repeat([run.shape.value_length for run in runs], [run.records for run in runs])
    key_offsets, value_offsets = _binary_offsets(key_lengths), _binary_offsets(value_lengths)
    keys, key_buffer = _pool_bytes(int(key_offsets[-1]))
    values, value_buffer = _pool_bytes(int(value_offsets[-1]))
    done = 0
    for run in runs:
        shape = run.shape
        table = data[run.start : run.start + run.records * shape.stride].reshape(run.records, shape.stride)
        offset_deltas = _column_varints(table, shape.offset_at, shape.offset_bytes)
        if not np.array_equal(offset_deltas, np.arange(done, done + run.records)):
            raise InvalidRecordsError("inner offset deltas are not 0, 1, 2, ...")
        timestamps[done : done + run.records] = _column_varints(table, shape.timestamp_at, shape.timestamp_bytes)
        for out, offsets, at, length in ((keys, key_offsets, shape.key_at, shape.key_length),
                                         (values, value_offsets, shape.value_at, shape.value_length)):
            if length > 0:
                first = int(offsets[done])
                out[first : first + run.records * length].reshape(run.records, length)[:] = table[:, at : at + length]
        done += run.records
    timestamps += base_timestamp
    return pa.table({
        "key": _binary_array(key_lengths, key_offsets, key_buffer),
        "value": _binary_array(value_lengths, value_offsets, value_buffer),
        "timestamp": _int64_array(timestamps),
        "headers": pa.nulls(count, HEADER_TYPE),
    })


def _column_varints(table: np.ndarray, at: int, size: int) -> np.ndarray:
    """The signed varints of ``size`` bytes in columns ``at``... of every row, as read_varints reads them."""
    zigzagged = (table[:, at] & 0x7F).astype(np.uint64)
    for byte_index in range(1, size):
        zigzagged |= (table[:, at + byte_index] & 0x7F).astype(np.uint64) << np.uint64(7 * byte_index)
    return (zigzagged >> np.uint64(1)).astype(np.int64) ^ -(zigzagged & np.uint64(1)).astype(np.int64)


def _binary_offsets(lengths: np.ndarray) -> np.ndarray:
    """Arrow binary offsets (int32) of values of ``lengths`` (-1: null, no bytes)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(np.maximum(lengths, 0), out=offsets[1:])
    return offsets


def _binary_array(lengths: np.ndarray, offsets: np.ndarray, data: np.ndarray | pa.Buffer) -> pa.Array:
    """A binary array of ``data`` cut at ``offsets``; a length of -1 is a null."""
    valid = lengths >= 0
    nulls = int(len(lengths) - np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    values = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return pa.Array.from_buffers(pa.binary(), len(lengths), [bitmap, pa.py_buffer(offsets), values],
                                 null_count=nulls)


def _pool_bytes(size: int) -> tuple[np.ndarray, pa.Buffer]:
    """``size`` writable bytes from Arrow's memory pool: a numpy view of them and the buffer that owns them. For
    decoded keys and values, which the store's append reads once and lets go: the pool reuses freed memory, where
    glibc hands blocks of 128 KiB or more back to the kernel (ledgerview/kafka/large_buffers.py) and each new one
    is faulted in again, a page at a time (about a fifth of the endpoint's page faults on produce, measured)."""
    buffer = pa.allocate_buffer(size)
    return np.frombuffer(buffer, np.uint8), buffer


def _record_bounds(body: Records, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each record's fields start (after its length varint) and where it ends.

    Records of one batch often have the same length for long runs (same-sized values; lengths change only when
    a delta's varint grows a byte). So: guess that every remaining record has the length of the next one, check
    the guess for all of them in one numpy pass, keep the run that matches, and repeat; when runs get short,
    walk the rest one record at a time.
    """
    data = np.frombuffer(body, dtype=np.uint8)
    starts: list[np.ndarray] = []
    position, done = 0, 0
    while done < count:
        length, fields_start = read_varint(body, position)
        stride = fields_start - position + length
        if stride <= 0:
            raise CorruptBatchError(f"a record of {length} bytes")
        guesses = position + stride * np.arange(count - done, dtype=np.int64)
        guesses = guesses[guesses < len(body)]
        lengths, sizes = read_varints(data, guesses, strict=False)
        matching = (sizes > 0) & (lengths + sizes == stride)
        run = len(matching) if matching.all() else int(matching.argmin())
        if run < MIN_RUN_RECORDS:
            starts.append(_walk_records(body, position, count - done))
            break
        starts.append(guesses[:run])
        position += stride * run
        done += run
    record_starts = np.concatenate(starts) if starts else np.empty(0, np.int64)
    ends = np.append(record_starts[1:], len(body)) if count else record_starts
    lengths, sizes = read_varints(data, record_starts)
    if len(record_starts) != count or not np.array_equal(record_starts + sizes + lengths, ends):
        raise CorruptBatchError(f"{count} records do not fill the {len(body)} bytes of the batch")
    return record_starts + sizes, ends


MIN_RUN_RECORDS = 32


def _walk_records(body: Records, position: int, count: int) -> np.ndarray:
    """The start of each of ``count`` records from ``position``, one length varint at a time."""
    starts = [0] * count
    for index in range(count):
        starts[index] = position
        byte = body[position]
        if byte < 0x80:
            position += 1 + ((byte >> 1) ^ -(byte & 1))
        elif body[position + 1] < 0x80:  # records of 64 to 8191 bytes: the common case gets no call
            raw = (byte & 0x7F) | (body[position + 1] << 7)
            position += 2 + ((raw >> 1) ^ -(raw & 1))
        else:
            length, position = read_varint(body, position)
            position += length
    return np.array(starts, dtype=np.int64)


def region_mask(size: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A boolean mask of ``size`` bytes, true inside the non-overlapping regions [start, start + length)."""
    runs = np.empty(2 * len(starts) + 1, dtype=np.int64)
    runs[1:-1:2] = lengths
    runs[0:-1:2] = np.diff(starts, prepend=0)
    runs[2:-1:2] -= lengths[:-1]
    runs[-1] = size - starts[-1] - lengths[-1] if len(starts) else size
    inside = np.zeros(len(runs), dtype=np.bool_)
    inside[1::2] = True
    return np.repeat(inside, runs)


SLICED_GATHER_BYTES = 4096
"""Records of this many bytes on average are gathered one slice each rather than through a byte mask."""


def _gather_binary(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of the regions of ``data``; a length of -1 is a null."""
    sizes = np.maximum(lengths, 0)
    offsets = _binary_offsets(lengths)
    if len(starts) * SLICED_GATHER_BYTES <= len(data):  # large values: no mask the size of the records
        gathered = np.empty(int(offsets[-1]), np.uint8)
        for start, size, offset in zip(starts.tolist(), sizes.tolist(), offsets.tolist(), strict=False):
            gathered[offset : offset + size] = data[start : start + size]
    else:
        gathered = data[region_mask(len(data), starts, sizes)]
    return _binary_array(lengths, offsets, gathered)


def _decode_headers(body: Records, positions: np.ndarray, ends: np.ndarray, counts: np.ndarray) -> pa.Array:
    rows: list[list[dict[str, object]] | None] = []
    for position, end, count in zip(positions.tolist(), ends.tolist(), counts.tolist(), strict=True):
        pairs: list[dict[str, object]] = []
        for _ in range(count):
            key_length, position = read_varint(body, position)
            key = str(body[position : position + key_length], "utf-8")
            position += key_length
            value_length, position = read_varint(body, position)
            value = None if value_length < 0 else bytes(body[position : position + value_length])
            position += max(value_length, 0)
            pairs.append({"key": key, "value": value})
        if position != end:
            raise CorruptBatchError("record lengths do not match their headers")
        rows.append(pairs or None)
    return pa.array(rows, HEADER_TYPE)
