"""The batch: the unit of writing, checksumming and indexing in segments and compacted ledgers.

A batch is a 48-byte little-endian header followed by a columnar payload, one Arrow IPC record-batch message
(the columns of ``storage.schema.STORED_SCHEMA`` less those the header implies, below; body optionally lz4- or
zstd-compressed by Arrow itself); a compressed
batch whose keys or values repeat enough is instead an Arrow IPC stream whose key and value columns may be
dictionary-encoded (storage/dictionary_columns.py), which ``decode_payload`` turns back into STORED_SCHEMA::

    0  int64   base_offset        offset of the first message (or lower, after cleaning removed it)
    8  int32   batch_length       header + payload, a multiple of 8 so payloads stay 8-byte aligned
    12 uint32  crc                CRC-32C of bytes 0 .. 12 then 16 .. batch_length: all but itself
    16 uint8   magic              format version, 1
    17 uint8   attributes         bits 0-1 compression (0 none, 1 lz4, 2 zstd), bit 2 timestamps are LogAppendTime,
                                  bit 3 first_timestamp holds the delete horizon (set by the cleaner), bit 4 the
                                  payload has no offset column, bit 5 no headers column (the columns it implies)
    18 int16   reserved           0
    20 int32   last_offset_delta  last offset - base_offset (the cleaner keeps a batch's offset range)
    24 int32   record_count       0 only in a batch the cleaner emptied, kept for its offset range
    28 int64   first_timestamp    timestamp of the first message, or the delete horizon (bit 3)
    36 int64   max_timestamp
    44 int32   reserved           0

The CRC covers every byte of the batch except its own four, so any corruption of a header or payload is detected
(the offsets too: unlike Kafka we never rewrite a batch's offsets in place).

A payload leaves out the columns its header implies: the offsets when they run on from base_offset one by one
(every appended batch), the headers when no message has any. That is 12 bytes a message that every append would
otherwise write, fsync and checksum; decoding puts the columns back, so readers always see STORED_SCHEMA.
See docs/FORMAT.md.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, replace
from typing import Final, TypeAlias

import crc32c
import numpy as np
import pyarrow as pa

from storage.dictionary_columns import with_dictionaries, without_dictionaries
from storage.schema import APPENDED_SCHEMA, STORED_SCHEMA, null_headers

HEADER = struct.Struct("<qiIBBhiiqqi")
HEADER_BYTES: Final = HEADER.size
MAGIC: Final = 1
CRC_OFFSET: Final = 12
CRC_START: Final = 16
COMPRESSION_CODES: Final = {None: 0, "lz4": 1, "zstd": 2}
_COMPRESSION_NAMES: Final = {code: name for name, code in COMPRESSION_CODES.items()}
_COMPRESSION_MASK: Final = 0b11
LOG_APPEND_TIME_FLAG: Final = 0b100
DELETE_HORIZON_FLAG: Final = 0b1000
"""Kafka's KIP-534: the cleaner kept tombstones in this batch and stamped ``first_timestamp`` with the time after
which a later pass may remove them."""
OFFSETS_IMPLIED_FLAG: Final = 0b1_0000
"""The payload has no offset column: message i has offset base_offset + i (the cleaner may stretch the batch's range
past its last message, as it does any batch's)."""
NO_HEADERS_FLAG: Final = 0b10_0000
"""The payload has no headers column: no message of the batch has headers."""
_IMPLIED_MASK: Final = OFFSETS_IMPLIED_FLAG | NO_HEADERS_FLAG
_KNOWN_ATTRIBUTES: Final = 0b11_1111

assert HEADER_BYTES == 48


class BatchFormatError(ValueError):
    """The bytes at a position are not a valid batch; ``reason`` says which check failed."""

    def __init__(self, reason: str, base_offset: int | None = None) -> None:
        self.reason = reason
        self.base_offset = base_offset
        self.position = -1
        """Where the batch starts in its file, when known (set by the scan that found it)."""
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one batch, as decoded; ``position`` is where it starts in its file."""

    base_offset: int
    batch_length: int
    crc: int
    attributes: int
    last_offset_delta: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    position: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def end_position(self) -> int:
        return self.position + self.batch_length

    @property
    def offsets_implied(self) -> bool:
        """Whether the payload leaves its offsets out: they are base_offset .. last_offset, decoded from here."""
        return bool(self.attributes & OFFSETS_IMPLIED_FLAG)

    @property
    def compression(self) -> str | None:
        return _COMPRESSION_NAMES.get(self.attributes & _COMPRESSION_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the cleaner may remove this batch's tombstones (None: no pass kept them yet)."""
        return self.first_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

    @property
    def message_first_timestamp(self) -> int | None:
        """The first message's timestamp, unless the field holds a delete horizon instead."""
        return None if self.attributes & DELETE_HORIZON_FLAG else self.first_timestamp


def _payload_schema(implied: int) -> pa.Schema:
    """STORED_SCHEMA without the columns the ``implied`` attribute bits leave out."""
    left_out = {"offset"} if implied & OFFSETS_IMPLIED_FLAG else set()
    left_out |= {"headers"} if implied & NO_HEADERS_FLAG else set()
    return pa.schema([field for field in STORED_SCHEMA if field.name not in left_out])


_OFFSET_FIELD: Final = STORED_SCHEMA.field("offset")
_HEADERS_FIELD: Final = STORED_SCHEMA.field("headers")
_PAYLOAD_SCHEMAS: Final = {implied: _payload_schema(implied) for implied in (0, OFFSETS_IMPLIED_FLAG, NO_HEADERS_FLAG,
                                                                             _IMPLIED_MASK)}


def _ipc_schema_prefix_bytes(schema: pa.Schema, compression: str | None) -> int:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression)):
        pass
    return int(sink.getvalue().size) - 8  # the stream ends with an 8-byte end-of-stream marker


_SCHEMA_PREFIX = {(name, implied): _ipc_schema_prefix_bytes(schema, name)
                  for name in COMPRESSION_CODES for implied, schema in _PAYLOAD_SCHEMAS.items()}
_WRITE_OPTIONS = {name: pa.ipc.IpcWriteOptions(compression=name) for name in COMPRESSION_CODES}
_READ_OPTIONS: Final = pa.ipc.IpcReadOptions(use_threads=False)
"""Decompression on Arrow's thread pool costs more than it saves on batches of this size."""


Piece: TypeAlias = pa.Buffer | bytes
"""Part of a payload: a zero-copy slice of a column's buffer, or bytes Arrow made (metadata, padding)."""


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch ready to write: ``header_bytes`` then the ``payload`` pieces; ``header.position`` is still 0."""

    header: BatchHeader
    header_bytes: bytes
    payload: tuple[Piece, ...]

    @property
    def pieces(self) -> list[Piece]:
        """Everything to write, in order, for one ``os.writev``."""
        return [self.header_bytes, *self.payload]


class _PayloadCollector:
    """The file Arrow's IPC stream writer writes record batches to.

    It keeps the pieces instead of copying them (column buffers arrive as zero-copy ``pa.Buffer`` slices) and drops
    the stream's first ``skip_bytes`` (the schema message): a batch is never assembled in memory, only checksummed
    and written with one ``writev``, as the Arrow IPC file writer writes it.
    """

    closed = False

    def __init__(self, skip_bytes: int) -> None:
        self.skip_bytes = skip_bytes
        self.position = 0
        self.pieces: list[Piece] = []

    def write(self, data: Piece) -> int:
        size = len(data) if isinstance(data, bytes) else data.size
        start = self.position
        self.position += size
        if self.position > self.skip_bytes:
            if start < self.skip_bytes:
                data = data[self.skip_bytes - start :]
            self.pieces.append(data)
        return size

    def tell(self) -> int:
        return self.position

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _payload(batch: pa.RecordBatch, compression: str | None, *, offsets_implied: bool
             ) -> tuple[tuple[Piece, ...], int, int]:
    """The batch's payload as pieces, its size and the attribute bits of the columns it leaves out: one Arrow IPC
    record-batch message, or (compressed batches whose key or value column pays for a dictionary) an Arrow IPC
    stream without its end-of-stream marker."""
    implied = (OFFSETS_IMPLIED_FLAG if offsets_implied else 0) | (
        NO_HEADERS_FLAG if 0 < batch.column("headers").null_count == batch.num_rows else 0)
    schema = _PAYLOAD_SCHEMAS[implied]
    if batch.schema.names != schema.names:
        batch = batch.select(schema.names)  # 1.6 us, where from_arrays takes 5
    if not batch.schema.equals(schema):  # other field attributes (nullability, metadata)
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    encoded = with_dictionaries(batch) if compression else None
    if encoded is not None:
        return (*_stream_pieces(encoded, compression), implied)
    return (*_message_pieces(batch, compression, implied), implied)


def _stream_pieces(batch: pa.RecordBatch, compression: str | None) -> tuple[tuple[Piece, ...], int]:
    """A whole Arrow IPC stream of ``batch`` but its end-of-stream marker, as pieces, and its size."""
    collector = _PayloadCollector(skip_bytes=0)
    writer = pa.ipc.new_stream(pa.PythonFile(collector, mode="w"), batch.schema, options=_WRITE_OPTIONS[compression])
    writer.write_batch(batch)
    pieces, size = tuple(collector.pieces), collector.position
    writer.close()  # its end-of-stream marker lands after the pieces taken above
    return pieces, size


class _MessageWriter:
    """An Arrow IPC stream writer of one payload schema and codec, kept open so that each batch costs only its
    record-batch message: opening a writer for every batch cost as much as writing a 10,000-message batch's pieces
    (12 us, bench/RESULTS.md, issue 19)."""

    def __init__(self, compression: str | None, implied: int) -> None:
        self._collector = _PayloadCollector(skip_bytes=_SCHEMA_PREFIX[compression, implied])
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._collector, mode="w"), _PAYLOAD_SCHEMAS[implied],
                                         options=_WRITE_OPTIONS[compression])

    def pieces(self, batch: pa.RecordBatch) -> tuple[tuple[Piece, ...], int]:
        """The record-batch message of ``batch`` as pieces, and its size."""
        collector = self._collector
        start = max(collector.position, collector.skip_bytes)
        collector.pieces = []
        self._writer.write_batch(batch)
        pieces, collector.pieces = tuple(collector.pieces), []  # keeps no view of the batch's buffers
        return pieces, collector.position - start


_THREAD_WRITERS = threading.local()
"""Each thread's _MessageWriter by (codec, implied columns): a writer is not shared between threads."""


def _message_pieces(batch: pa.RecordBatch, compression: str | None, implied: int) -> tuple[tuple[Piece, ...], int]:
    """``batch``'s record-batch message from this thread's writer; a writer that failed mid-message (an
    interrupt, no memory) is dropped, since what it wrote so far is unknown."""
    writers: dict[tuple[str | None, int], _MessageWriter] = _THREAD_WRITERS.__dict__.setdefault("writers", {})
    key = (compression, implied)
    writer = writers.get(key)
    if writer is None:
        writer = writers[key] = _MessageWriter(compression, implied)
    try:
        return writer.pieces(batch)
    except BaseException:
        del writers[key]
        raise


def encode_batch(
    batch: pa.RecordBatch, *, compression: str | None = None, log_append_time: bool = False,
    offset_range: tuple[int, int] | None = None, delete_horizon_ms: int | None = None,
    timestamp_range: tuple[int, int] | None = None,
) -> EncodedBatch:
    """Encode a record batch of STORED_SCHEMA (offsets increasing), or of APPENDED_SCHEMA with ``offset_range``
    whose base is its first row's offset, the next rows' following one by one.

    Appends give at least one row and ``offset_range``. The cleaner may also give ``offset_range`` (base and last
    offset, wider than the rows' when cleaning removed messages at either end), ``delete_horizon_ms`` and, for a
    batch left without rows, ``timestamp_range`` (first and max timestamp of the messages it replaced).
    """
    if compression not in COMPRESSION_CODES:
        raise ValueError(f"compression {compression!r}; allowed: none, lz4, zstd")
    rows = batch.num_rows
    timestamps = batch.column("timestamp").to_numpy()
    first_timestamp, max_timestamp = timestamp_range or (int(timestamps[0]), int(np.max(timestamps)))
    if batch.schema.names == APPENDED_SCHEMA.names:
        if offset_range is None or not 0 < rows <= offset_range[1] - offset_range[0] + 1:
            raise ValueError(f"{rows} messages without offsets need an offset range of as many, not {offset_range}")
        base_offset, last_offset = offset_range
        offsets_implied = True
    else:
        offsets = batch.column(0).to_numpy()
        base_offset, last_offset = offset_range or (int(offsets[0]), int(offsets[-1]))
        offsets_implied = rows > 0 and int(offsets[0]) == base_offset and (
            int(offsets[-1]) - base_offset == rows - 1 and bool((np.diff(offsets) == 1).all()))
    payload, payload_bytes, implied = _payload(batch, compression, offsets_implied=offsets_implied)
    attributes = COMPRESSION_CODES[compression] | (LOG_APPEND_TIME_FLAG if log_append_time else 0) | implied
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
        first_timestamp = delete_horizon_ms
    header = BatchHeader(
        base_offset=base_offset,
        batch_length=HEADER_BYTES + payload_bytes,
        crc=0,
        attributes=attributes,
        last_offset_delta=last_offset - base_offset,
        record_count=rows,
        first_timestamp=first_timestamp,
        max_timestamp=max_timestamp,
        position=0,
    )
    return with_checksum(header, payload)


def with_checksum(header: BatchHeader, payload: tuple[Piece, ...]) -> EncodedBatch:
    """The batch ready to write, its CRC-32C computed over ``header`` (whatever its crc field) and ``payload``."""
    body = _pack(header)
    crc = crc32c.crc32c(body[CRC_START:], crc32c.crc32c(body[:CRC_OFFSET]))
    for piece in payload:
        crc = crc32c.crc32c(piece, crc)
    sealed = replace(header, crc=crc, position=0)
    return EncodedBatch(sealed, _pack(sealed), payload)


def _pack(header: BatchHeader) -> bytes:
    return HEADER.pack(
        header.base_offset, header.batch_length, header.crc, MAGIC, header.attributes, 0,
        header.last_offset_delta, header.record_count, header.first_timestamp, header.max_timestamp, 0,
    )


def read_header(view: memoryview | bytes, position: int, available: int) -> BatchHeader:
    """Decode and sanity-check the header at ``position``; ``available`` is how many valid bytes follow it.

    Raises BatchFormatError for anything that cannot be a complete batch written by ``encode_batch``.
    """
    if available < HEADER_BYTES:
        raise BatchFormatError(f"only {available} bytes left, less than a {HEADER_BYTES}-byte batch header")
    (base_offset, length, crc, magic, attributes, reserved, delta, count, first_ts, max_ts, reserved2) = (
        HEADER.unpack_from(view, position)
    )
    if magic != MAGIC:
        raise BatchFormatError(f"unknown magic {magic} (expected {MAGIC})", base_offset)
    if length < HEADER_BYTES or length % 8 or length > available:
        raise BatchFormatError(
            f"batch length {length} does not fit (needs a multiple of 8 within {available} bytes)", base_offset
        )
    if count < 0 or delta < max(count - 1, 0) or base_offset < 0 or reserved or reserved2 or (
            attributes & ~_KNOWN_ATTRIBUTES):
        raise BatchFormatError("inconsistent header fields", base_offset)
    return BatchHeader(base_offset, length, crc, attributes, delta, count, first_ts, max_ts, position)


def verify_batch(view: memoryview | bytes, header: BatchHeader) -> None:
    """Check the CRC-32C of the batch described by ``header``; raises BatchFormatError on mismatch."""
    start = header.position
    head = crc32c.crc32c(view[start : start + CRC_OFFSET])
    actual = crc32c.crc32c(view[start + CRC_START : header.end_position], head)
    if actual != header.crc:
        raise BatchFormatError(f"CRC-32C mismatch (stored {header.crc:#010x}, computed {actual:#010x})",
                               header.base_offset)


def payload_of(buffer: pa.Buffer, header: BatchHeader) -> pa.Buffer:
    """The batch's payload, the bytes after its header, as a zero-copy slice of ``buffer``."""
    return buffer.slice(header.position + HEADER_BYTES, header.batch_length - HEADER_BYTES)


def decode_payload(buffer: pa.Buffer, header: BatchHeader) -> pa.RecordBatch:
    """Decode the payload into a batch of STORED_SCHEMA; zero-copy from ``buffer`` (e.g. a memory map) when
    uncompressed, dictionary columns turned back into plain ones when the payload is a stream."""
    return joined_payloads([read_payload(buffer, header)], [header])


def read_payload(buffer: pa.Buffer, header: BatchHeader) -> pa.RecordBatch:
    """The payload's batch as stored: without the columns its header implies (``joined_payloads`` puts them back)."""
    payload = payload_of(buffer, header)
    implied = header.attributes & _IMPLIED_MASK
    try:
        batch = _read_payload(payload, _PAYLOAD_SCHEMAS[implied]) if header.attributes & _COMPRESSION_MASK else (
            pa.ipc.read_record_batch(payload, _PAYLOAD_SCHEMAS[implied]))
    except (pa.ArrowException, OSError) as error:
        raise BatchFormatError(f"payload is not a valid Arrow record batch: {error}", header.base_offset) from error
    if batch.num_rows != header.record_count:
        raise BatchFormatError(
            f"payload holds {batch.num_rows} messages, header says {header.record_count}", header.base_offset
        )
    return batch


def same_payload_schema(first: BatchHeader, second: BatchHeader) -> bool:
    """Whether the two batches' payloads have one schema (the same columns left out), so they can be joined."""
    return not (first.attributes ^ second.attributes) & _IMPLIED_MASK


def joined_payloads(payloads: list[pa.RecordBatch], headers: list[BatchHeader]) -> pa.RecordBatch:
    """Consecutive batches' payloads (``read_payload``, all of one schema: ``same_payload_schema``) as one batch of
    STORED_SCHEMA, with the columns their headers imply put back once for all of them: joining many small
    batches (a Kafka producer's are often about a hundred messages) pays these calls once instead of per batch."""
    batch = payloads[0] if len(payloads) == 1 else pa.concat_batches(payloads)
    implied = headers[0].attributes & _IMPLIED_MASK
    if implied & OFFSETS_IMPLIED_FLAG:  # read_header checked that each record_count fits its offset range
        batch = batch.add_column(0, _OFFSET_FIELD, pa.array(_implied_offsets(headers)))
    if implied & NO_HEADERS_FLAG:
        batch = batch.append_column(_HEADERS_FIELD, null_headers(batch.num_rows))
    return batch


def _implied_offsets(headers: list[BatchHeader]) -> np.ndarray:
    """Each batch's offsets, base_offset up by one per message, one batch after another."""
    if len(headers) == 1:
        return np.arange(headers[0].base_offset, headers[0].base_offset + headers[0].record_count, dtype=np.int64)
    counts = np.fromiter((header.record_count for header in headers), np.int64, len(headers))
    bases = np.fromiter((header.base_offset for header in headers), np.int64, len(headers))
    starts = np.cumsum(counts) - counts
    offsets: np.ndarray = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(bases - starts, counts)
    return offsets


def dictionary_columns(buffer: pa.Buffer, header: BatchHeader) -> tuple[str, ...]:
    """The columns a batch's payload stores as dictionaries (storage/dictionary_columns.py): none for the plain
    layout, a lone record-batch message. Raises BatchFormatError when the payload's first message does not parse."""
    if not header.attributes & _COMPRESSION_MASK or not header.record_count:
        return ()
    payload = payload_of(buffer, header)
    try:
        message = pa.ipc.read_message(payload)
        if message.type != "schema":
            return ()
        schema = pa.ipc.read_schema(message)
    except (pa.ArrowException, OSError) as error:
        raise BatchFormatError(f"payload is not a valid Arrow message: {error}", header.base_offset) from error
    return tuple(field.name for field in schema if pa.types.is_dictionary(field.type))


def _read_payload(payload: pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    """A compressed payload: a record-batch message of ``schema``, or a stream (schema message first) with
    dictionaries."""
    message = pa.ipc.read_message(payload)
    if message.type != "schema":
        return pa.ipc.read_record_batch(message, schema)
    try:
        batch = pa.ipc.open_stream(payload, options=_READ_OPTIONS).read_next_batch()
    except StopIteration:
        raise pa.ArrowInvalid("the stream ends before its record batch") from None
    return without_dictionaries(batch, schema)
