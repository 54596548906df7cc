"""The batch codec: round trips and detection of every corruption (invariants 1 and 10)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from storage.codec import (
    CRC_START,
    HEADER_BYTES,
    NO_HEADERS_FLAG,
    OFFSETS_IMPLIED_FLAG,
    BatchFormatError,
    decode_payload,
    encode_batch,
    read_header,
    verify_batch,
    with_checksum,
)
from storage.schema import HEADER_TYPE, STORED_SCHEMA, null_headers


def make_batch(rows: int = 20, base: int = 100) -> pa.RecordBatch:
    headers = pa.array([[{"key": "h", "value": b"x"}] if i % 3 == 0 else None for i in range(rows)], HEADER_TYPE)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(base, base + rows, dtype=np.int64)),
            pa.array(np.arange(rows, dtype=np.int64) * 7 + 1000),
            pa.array([f"k{i % 5}".encode() if i % 4 else None for i in range(rows)], pa.binary()),
            pa.array([f"value-{i}".encode() if i % 6 else None for i in range(rows)], pa.binary()),
            headers,
        ],
        schema=STORED_SCHEMA,
    )


def encoded_bytes(batch: pa.RecordBatch, compression: str | None = None) -> bytes:
    encoded = encode_batch(batch, compression=compression)
    return b"".join(bytes(piece) for piece in encoded.pieces)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_round_trip(compression: str | None) -> None:
    batch = make_batch()
    data = encoded_bytes(batch, compression)
    header = read_header(data, 0, len(data))
    verify_batch(data, header)
    assert (header.base_offset, header.last_offset, header.record_count) == (100, 119, 20)
    assert (header.first_timestamp, header.max_timestamp) == (1000, 1000 + 19 * 7)
    assert header.compression == compression
    assert header.batch_length == len(data) and len(data) % 8 == 0
    assert decode_payload(pa.py_buffer(data), header).equals(batch)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_slice_is_stored_as_its_own_rows(compression: str | None) -> None:
    """Appends hand the encoder zero-copy slices of bigger tables; the payload is written from the column
    buffers as they are, so the slice's offsets into them must be rebased, not carried over."""
    whole = make_batch(rows=50)
    part = whole.slice(17, 20)
    data = encoded_bytes(part, compression)
    header = read_header(data, 0, len(data))
    verify_batch(data, header)
    assert decode_payload(pa.py_buffer(data), header).equals(part)
    if compression is None:  # contiguous offsets, so the payload leaves their column out
        assert data[HEADER_BYTES:] == part.select(["timestamp", "key", "value", "headers"]).serialize().to_pybytes()


def test_offsets_with_gaps_keep_their_values() -> None:
    batch = make_batch().filter(pa.array([i % 2 == 0 for i in range(20)]))
    data = encoded_bytes(batch)
    header = read_header(data, 0, len(data))
    assert (header.base_offset, header.last_offset, header.record_count) == (100, 118, 10)
    assert not header.attributes & OFFSETS_IMPLIED_FLAG
    assert decode_payload(pa.py_buffer(data), header).column(0).to_pylist() == list(range(100, 119, 2))


def without_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.set_column(4, STORED_SCHEMA.field(4), null_headers(batch.num_rows))


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_an_appended_batch_stores_neither_its_offsets_nor_its_empty_headers(compression: str | None) -> None:
    """Contiguous offsets and no headers (every plain append): 12 bytes a message the header implies."""
    batch = without_headers(make_batch(rows=1000, base=7_000))
    data = encoded_bytes(batch, compression)
    header = read_header(data, 0, len(data))
    verify_batch(data, header)
    assert header.attributes & (OFFSETS_IMPLIED_FLAG | NO_HEADERS_FLAG) == OFFSETS_IMPLIED_FLAG | NO_HEADERS_FLAG
    decoded = decode_payload(pa.py_buffer(data), header)
    assert decoded.schema == STORED_SCHEMA and decoded.equals(batch)
    if compression is None:
        assert data[HEADER_BYTES:] == batch.select(["timestamp", "key", "value"]).serialize().to_pybytes()


def test_a_batch_of_the_format_before_implied_columns_still_decodes() -> None:
    """Batches written before bits 4 and 5 existed hold every column and set neither bit."""
    batch = without_headers(make_batch(rows=30))
    encoded = encode_batch(batch)
    old_header = replace(encoded.header, attributes=0, batch_length=HEADER_BYTES + batch.serialize().size)
    old = with_checksum(old_header, (batch.serialize(),))
    data = b"".join(bytes(piece) for piece in old.pieces)
    header = read_header(data, 0, len(data))
    verify_batch(data, header)
    assert decode_payload(pa.py_buffer(data), header).equals(batch)


def test_implied_offsets_stay_right_when_the_header_range_is_stretched() -> None:
    """The cleaner stretches a kept batch's range to its group's end, reusing its payload: message i is still at
    base_offset + i."""
    batch = make_batch(rows=10)
    encoded = encode_batch(batch)
    assert encoded.header.attributes & OFFSETS_IMPLIED_FLAG
    wider = with_checksum(replace(encoded.header, last_offset_delta=encoded.header.last_offset_delta + 5),
                          encoded.payload)
    data = b"".join(bytes(piece) for piece in wider.pieces)
    header = read_header(data, 0, len(data))
    verify_batch(data, header)
    assert decode_payload(pa.py_buffer(data), header).equals(batch)


def test_offsets_that_repeat_are_stored_not_implied() -> None:
    """Only offsets that run on one by one from the base are left out; any others keep their column."""
    batch = make_batch(rows=3)
    repeated = batch.set_column(0, STORED_SCHEMA.field(0), pa.array([100, 100, 102], pa.int64()))
    data = encoded_bytes(repeated)
    header = read_header(data, 0, len(data))
    assert not header.attributes & OFFSETS_IMPLIED_FLAG
    assert decode_payload(pa.py_buffer(data), header).column(0).to_pylist() == [100, 100, 102]


def test_a_writer_interrupted_mid_message_leaves_the_next_batch_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose encoding fails part way (an interrupt, no memory) must not leave pieces for the next one."""
    from storage import codec
    batch = without_headers(make_batch(rows=40))
    encoded_bytes(batch)  # this thread's writer exists
    writes = 0
    original = codec._PayloadCollector.write

    def failing(self: codec._PayloadCollector, data: bytes) -> int:
        nonlocal writes
        writes += 1
        if writes == 3:
            raise KeyboardInterrupt
        return original(self, data)

    monkeypatch.setattr(codec._PayloadCollector, "write", failing)
    with pytest.raises(KeyboardInterrupt):
        encoded_bytes(batch)
    data = encoded_bytes(batch)
    header = read_header(data, 0, len(data))
    assert header.batch_length == len(data)
    verify_batch(data, header)
    assert decode_payload(pa.py_buffer(data), header).equals(batch)


def test_decoding_from_a_memory_buffer_does_not_copy() -> None:
    data = pa.py_buffer(encoded_bytes(make_batch()))
    header = read_header(memoryview(data), 0, data.size)
    values = decode_payload(data, header).column(3)
    value_buffer = values.buffers()[2]
    assert data.address <= value_buffer.address < data.address + data.size


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_every_single_byte_corruption_is_detected(compression: str | None) -> None:
    """Flip each byte of header and payload in turn: reading the batch must fail, never return other data."""
    batch = make_batch(rows=5)
    data = encoded_bytes(batch, compression)
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        with pytest.raises(BatchFormatError):
            verify_batch(bytes(damaged), read_header(bytes(damaged), 0, len(damaged)))


def test_a_truncated_batch_is_detected() -> None:
    data = encoded_bytes(make_batch())
    for cut in (0, 10, HEADER_BYTES - 1, HEADER_BYTES, CRC_START + 40, len(data) - 8):
        with pytest.raises(BatchFormatError):
            read_header(data[:cut], 0, cut)


def test_unknown_compression_is_refused() -> None:
    with pytest.raises(ValueError, match="allowed: none, lz4, zstd"):
        encode_batch(make_batch(), compression="gzip")


def test_batches_encoded_on_several_threads_at_once_decode_to_their_own_rows() -> None:
    """The encoder keeps an open IPC writer per thread: batches written at the same moment never share one."""
    def round_trip(number: int) -> bool:
        batch = without_headers(make_batch(rows=200 + number % 7, base=number * 1_000))
        data = encoded_bytes(batch)
        return decode_payload(pa.py_buffer(data), read_header(data, 0, len(data))).equals(batch)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(round_trip, range(400)))


def test_a_batch_whose_fields_differ_only_in_nullability_encodes() -> None:
    batch = without_headers(make_batch())
    loose = pa.schema([field.with_nullable(True) for field in STORED_SCHEMA])
    data = encoded_bytes(pa.RecordBatch.from_arrays(batch.columns, schema=loose))
    assert decode_payload(pa.py_buffer(data), read_header(data, 0, len(data))).equals(batch)
