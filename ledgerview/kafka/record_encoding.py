"""Arrow columns to Kafka's RecordBatch v2 (ledgerview/kafka/records.py has the format), a whole batch at a time,
for Fetch responses.

Stored messages usually come in runs of one shape (same-sized keys and values, no headers): such a run is written
as a 2-D array of bytes whose fields are columns, keys and values copied as one 2-D slice each. Other batches take
the general path: every varint and position is computed with numpy and keys and values are scattered into one
buffer. Headers, rare in practice, take a per-record path. Both paths give the same bytes
(tests/test_kafka_records_uniform.py).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Final

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.kafka.records import (
    BATCH_HEADER_BYTES,
    CRC_START,
    LENGTH_FIELD_END,
    MAGIC,
    NO_PRODUCER_ID,
    region_mask,
)
from ledgerview.kafka.varints import encode_varint, varint_sizes, write_varints, zigzag
from storage.binary_arrays import value_lengths, value_offsets

_AFTER_CRC: Final = struct.Struct(">hiqqqhii")
_BEFORE_CRC: Final = struct.Struct(">qiibI")


@dataclass(frozen=True)
class RecordLayout:
    """Where each record of a batch goes once encoded: every varint field, its size, and the records' extents.
    Computed once to size a fetched batch and kept for its encoding (ledgerview/kafka/batch_layouts.py)."""

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

    @property
    def batch_bytes(self) -> int:
        """The exact size of the encoded batch, header included, known before encoding it (a fetch response's
        sizes come first)."""
        return BATCH_HEADER_BYTES + self.records_bytes

    @property
    def held_bytes(self) -> int:
        """The memory its arrays take."""
        arrays = [*self.fields, *self.sizes, self.length_field, self.length_sizes, self.starts, self.key_lengths,
                  self.value_lengths, self.header_bytes]
        return sum(array.nbytes for array in arrays) + (0 if self.headers is None else self.headers.nbytes)


def record_layout(batch: pa.RecordBatch) -> RecordLayout:
    """The layout of ``batch`` (columns offset, timestamp, key, value, headers) encoded."""
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
    return RecordLayout(fields, sizes, length_field, length_sizes, ends - length_sizes - body_lengths, int(ends[-1]),
                         key_lengths, value_lengths, headers, header_bytes)


def encode_batch(batch: pa.RecordBatch, *, last_offset: int | None = None, into: memoryview | None = None,
                 layout: RecordLayout | None = None) -> bytearray | memoryview:
    """One uncompressed RecordBatch v2 of the messages of ``batch`` (columns offset, timestamp, key, value,
    headers; offsets increasing, gaps allowed). ``last_offset``: the batch's last offset when it must reach past
    its last message (a compacted view's removed tail); default the last message's offset. The records are
    written in place after the header (one buffer, no copy), into ``into`` when given (exactly
    ``record_layout(batch).batch_bytes`` writable bytes, whatever they hold: every byte is written, so a buffer can be
    reused), else into a new bytearray, not Arrow's pool, so the memory leaves the process once the batch is sent
    (ledgerview/kafka/large_buffers.py). ``layout``: ``record_layout(batch)`` when it was computed already.
    Returns the buffer written."""
    offsets = batch.column("offset").to_numpy()
    timestamps = batch.column("timestamp").to_numpy()
    layout = record_layout(batch) if layout is None else layout
    size = layout.batch_bytes
    frame = bytearray(size) if into is None else into
    if len(frame) != size:
        raise ValueError(f"a batch of {size} encoded bytes given a buffer of {len(frame)}")
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


def _same_shape_runs(layout: RecordLayout) -> list[tuple[int, int]] | None:
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


def _write_run(out: np.ndarray, batch: pa.RecordBatch, layout: RecordLayout, start: int, stop: int) -> None:
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


def _write_records(out: np.ndarray, batch: pa.RecordBatch, layout: RecordLayout) -> None:
    """The records written field by field over all records at once (any layout, headers too); every byte of them
    is written (``out`` may hold a former batch's bytes)."""
    write_varints(out, layout.starts, layout.length_field, layout.length_sizes)
    out[layout.starts + layout.length_sizes] = 0  # attributes
    if layout.headers is None:
        out[np.append(layout.starts[1:], layout.records_bytes) - 1] = 0  # headerCount, each record's last byte
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


def _write_header(frame: bytearray | memoryview, base_offset: int, last_delta: int, base_timestamp: int,
                  max_timestamp: int, count: int) -> None:
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
    out[region_mask(len(out), positions, np.maximum(lengths, 0))] = data


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
