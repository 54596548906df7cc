"""Kafka's RecordBatch v2 (magic 2) to Arrow columns and back, a whole batch at a time.

Layout (DefaultRecordBatch.java): a 61-byte big-endian header ``baseOffset, batchLength, partitionLeaderEpoch,
magic, crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence,
recordsCount``, the CRC-32C covering attributes to the end; then the records (compressed as one blob when the
attributes name a codec), each ``length attributes timestampDelta offsetDelta keyLength key valueLength value
headersCount headers`` with zigzag varints.

Producers send records of one size in long runs (same-sized keys and values, no headers), so both directions first
try uniform runs: a run of same-shaped records is a 2-D array of bytes, whose fields are columns, checked and read
(decode) or written (encode) in a few column operations, keys and values copied as one 2-D slice each. Batches
that are not a few such runs take the general path: decoding finds the record starts (guessed runs of equal
lengths checked in numpy passes, a loop over the length varints where runs are short), reads every other field of
every record in numpy passes (ledgerview/kafka/varints.py) and gathers keys and values into Arrow binary columns;
encoding computes every varint and position with numpy and scatters keys and values into one buffer. Headers, rare
in practice, take a per-record path. Both paths give the same records (tests/test_kafka_records_uniform.py).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.kafka.compression import DecompressedTooLargeError, Records, decompress, no_reserve
from ledgerview.kafka.varints import (
    INT_VARINT_BYTES_MAX,
    LONG_VARINT_BYTES_MAX,
    VarintError,
    encode_varint,
    read_varint,
    read_varints,
    varint_sizes,
    write_varints,
    zigzag,
)
from storage.binary_arrays import value_lengths, value_offsets
from storage.schema import HEADER_TYPE

BATCH_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_BYTES: Final = BATCH_HEADER.size
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")
_BEFORE_CRC: Final = struct.Struct(">qiibI")
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


def _region_mask(size: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
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
        gathered = data[_region_mask(len(data), starts, sizes)]
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


# ------------------------------------------------------------------------------------------------------- encode
@dataclass(frozen=True)
class _RecordLayout:
    """Where each record of a batch goes once encoded: every varint field, its size, and the records' extents."""

    fields: list[np.ndarray]
    sizes: list[np.ndarray]
    length_field: np.ndarray
    length_sizes: np.ndarray
    starts: np.ndarray
    records_bytes: int
    key_lengths: np.ndarray
    value_lengths: np.ndarray
    headers: pa.Array | None
    header_bytes: np.ndarray


def _layout(batch: pa.RecordBatch) -> _RecordLayout:
    offsets = batch.column("offset").to_numpy()
    timestamps = batch.column("timestamp").to_numpy()
    key_lengths, value_lengths = _binary_lengths(batch.column("key")), _binary_lengths(batch.column("value"))
    headers = _encode_headers(batch.column("headers"))
    header_bytes = np.ones(batch.num_rows, np.int64) if headers is None else _binary_lengths(headers)
    fields = [zigzag(timestamps - int(timestamps.min())), zigzag(offsets - int(offsets[0])), zigzag(key_lengths),
              zigzag(value_lengths)]
    sizes = [varint_sizes(field) for field in fields]
    body_lengths = (1 + sizes[0] + sizes[1] + sizes[2] + np.maximum(key_lengths, 0) + sizes[3]
                    + np.maximum(value_lengths, 0) + header_bytes)
    length_field = zigzag(body_lengths)
    length_sizes = varint_sizes(length_field)
    ends = np.cumsum(length_sizes + body_lengths)
    return _RecordLayout(fields, sizes, length_field, length_sizes, ends - length_sizes - body_lengths, int(ends[-1]),
                         key_lengths, value_lengths, headers, header_bytes)


def encoded_batch_bytes(batch: pa.RecordBatch) -> int:
    """The exact size of ``encode_batch(batch)``, without encoding it (a fetch response's sizes come first)."""
    return BATCH_HEADER_BYTES + _layout(batch).records_bytes


def encode_batch(batch: pa.RecordBatch, *, last_offset: int | None = None) -> bytearray:
    """One uncompressed RecordBatch v2 of the messages of ``batch`` (columns offset, timestamp, key, value,
    headers; offsets increasing, gaps allowed). ``last_offset``: the batch's last offset when it must reach past
    its last message (a compacted view's removed tail); default the last message's offset. The records are
    written in place after the header (one buffer, no copy); a bytearray, not Arrow's pool, so the memory leaves
    the process once the batch is sent (ledgerview/kafka/large_buffers.py)."""
    offsets = batch.column("offset").to_numpy()
    timestamps = batch.column("timestamp").to_numpy()
    layout = _layout(batch)
    frame = bytearray(BATCH_HEADER_BYTES + layout.records_bytes)
    out = np.frombuffer(frame, np.uint8)[BATCH_HEADER_BYTES:]
    runs = _same_shape_runs(layout)
    if runs is not None:
        for start, stop in runs:
            _write_run(out, batch, layout, start, stop)
    else:
        _write_records(out, batch, layout)
    last = int(offsets[-1]) if last_offset is None else last_offset
    base_offset = int(offsets[0])
    _write_header(frame, base_offset, last - base_offset, int(timestamps.min()), int(timestamps.max()),
                  batch.num_rows)
    return frame


ENCODE_RUNS_MAX = 16
"""More runs of same-shaped records than this: the records are written field by field (_write_records)."""


def _same_shape_runs(layout: _RecordLayout) -> list[tuple[int, int]] | None:
    """The records as a few runs [start, stop) of records laid out alike (same key and value lengths, same varint
    sizes, no headers), or None."""
    if layout.headers is not None or not len(layout.starts):
        return None
    changes = ((np.diff(layout.key_lengths) != 0) | (np.diff(layout.value_lengths) != 0)
               | (np.diff(layout.sizes[0]) != 0) | (np.diff(layout.sizes[1]) != 0))
    cuts = np.flatnonzero(changes) + 1
    if len(cuts) >= ENCODE_RUNS_MAX:
        return None
    bounds = [0, *cuts.tolist(), len(layout.starts)]
    return list(itertools.pairwise(bounds))


def _write_run(out: np.ndarray, batch: pa.RecordBatch, layout: _RecordLayout, start: int, stop: int) -> None:
    """Records ``start`` to ``stop`` (laid out alike) written as columns of a 2-D view of their bytes: every byte
    of them is written (``out`` may be uninitialised). The varints before the key are assembled in a small
    contiguous array first, so the records' bytes are swept three times (head, key, value with what follows)."""
    records = stop - start
    first = int(layout.starts[start])
    end = int(layout.starts[stop]) if stop < len(layout.starts) else layout.records_bytes
    stride = (end - first) // records
    table = out[first:end].reshape(records, stride)
    sizes = [int(layout.length_sizes[start]), 1, *(int(size[start]) for size in layout.sizes[:3])]
    head = np.empty((records, sum(sizes)), np.uint8)
    column = _write_column_varints(head, 0, layout.length_field[start : start + 1], sizes[0])
    head[:, column] = 0  # attributes
    column += 1
    for field, size in zip(layout.fields[:3], sizes[2:], strict=True):
        sliced = field[start : start + 1] if field is layout.fields[2] else field[start:stop]
        column = _write_column_varints(head, column, sliced, size)
    table[:, :column] = head
    key_length, value_length = int(layout.key_lengths[start]), int(layout.value_lengths[start])
    column = _write_binary_column(table, column, batch.column("key"), start, stop, key_length)
    value_length_bytes = int(layout.sizes[3][start])
    _write_column_varints(table, column, layout.fields[3][start : start + 1], value_length_bytes)
    column = _write_binary_column(table, column + value_length_bytes, batch.column("value"), start, stop,
                                  value_length)
    table[:, column] = 0  # headerCount
    if column + 1 != stride:
        raise AssertionError(f"a record of {stride} bytes written as {column + 1}")


def _write_binary_column(table: np.ndarray, column: int, array: pa.Array, start: int, stop: int, length: int) -> int:
    """Values ``start`` to ``stop`` of ``array``, each ``length`` bytes (-1: null, none), from ``column``."""
    if length <= 0:
        return column
    offsets = value_offsets(array)
    data = np.frombuffer(array.buffers()[2], np.uint8)[int(offsets[start]) : int(offsets[stop])]
    table[:, column : column + length] = data.reshape(stop - start, length)
    return column + length


def _write_column_varints(table: np.ndarray, column: int, zigzagged: np.ndarray, size: int) -> int:
    """Each row's value (or the one value, for all rows) as a varint of ``size`` bytes from ``column``; returns
    the column after it."""
    for byte_index in range(size):
        digits = (zigzagged >> np.uint64(7 * byte_index)) & np.uint64(0x7F)
        table[:, column + byte_index] = digits.astype(np.uint8) | (0x80 if byte_index < size - 1 else 0)
    return column + size


def _write_records(out: np.ndarray, batch: pa.RecordBatch, layout: _RecordLayout) -> None:
    """The records written field by field over all records at once (any layout, headers too); ``out`` is zeros
    (every attributes byte, and headerCount 0)."""
    write_varints(out, layout.starts, layout.length_field, layout.length_sizes)
    position = layout.starts + layout.length_sizes + 1
    for field, size in zip(layout.fields[:3], layout.sizes[:3], strict=True):
        write_varints(out, position, field, size)
        position = position + size
    _scatter_binary(out, position, batch.column("key"), layout.key_lengths)
    position = position + np.maximum(layout.key_lengths, 0)
    write_varints(out, position, layout.fields[3], layout.sizes[3])
    position = position + layout.sizes[3]
    _scatter_binary(out, position, batch.column("value"), layout.value_lengths)
    if layout.headers is not None:
        _scatter_binary(out, position + np.maximum(layout.value_lengths, 0), layout.headers, layout.header_bytes)


def encode_empty_batch(base_offset: int, last_offset: int) -> bytes:
    """A batch with no records spanning [base_offset, last_offset]: moves a consumer past removed offsets."""
    frame = bytearray(BATCH_HEADER_BYTES)
    _write_header(frame, base_offset, last_offset - base_offset, -1, -1, 0)
    return bytes(frame)


def _write_header(frame: bytearray, base_offset: int, last_delta: int, base_timestamp: int, max_timestamp: int,
                  count: int) -> None:
    """The batch header at the front of ``frame``, whose records follow it; the CRC-32C covers them."""
    _AFTER_CRC.pack_into(frame, CRC_START, 0, last_delta, base_timestamp, max_timestamp, NO_PRODUCER_ID, -1, -1,
                         count)
    crc = crc32c.crc32c(memoryview(frame)[CRC_START:])
    _BEFORE_CRC.pack_into(frame, 0, base_offset, len(frame) - LENGTH_FIELD_END, 0, MAGIC, crc)


def _binary_lengths(array: pa.Array) -> np.ndarray:
    """Length of each value, -1 for a null (Kafka's null key or value)."""
    lengths = value_lengths(array).astype(np.int64)
    if array.null_count:
        lengths[~np.asarray(array.is_valid())] = -1
    return lengths


def _scatter_binary(out: np.ndarray, positions: np.ndarray, array: pa.Array, lengths: np.ndarray) -> None:
    """Copy each value of the binary ``array`` to ``out`` at its position, in one masked assignment."""
    offsets = value_offsets(array)
    first, last = int(offsets[0]), int(offsets[-1])
    if last == first:
        return
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8, count=last - first, offset=first)
    out[_region_mask(len(out), positions, np.maximum(lengths, 0))] = data


def _encode_headers(headers: pa.Array) -> pa.Array | None:
    """Each message's header section (count, then pairs) as a binary array; None when no message has headers."""
    if headers.null_count == len(headers) or not pc.list_value_length(headers).fill_null(0).to_numpy().any():
        return None
    sections = []
    for pairs in headers.to_pylist():
        section = bytearray(encode_varint(len(pairs or ())))
        for pair in pairs or ():
            key = pair["key"].encode()
            section += encode_varint(len(key)) + key
            value = pair["value"]
            section += encode_varint(-1) if value is None else encode_varint(len(value)) + value
        sections.append(bytes(section))
    return pa.array(sections, pa.binary())
