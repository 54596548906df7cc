"""The RecordBatch v2 codec against kafka-python's own builder and reader: whatever a Kafka client writes decodes
to the same messages, whatever the endpoint encodes a client reads back with its CRC checked; random binary keys
and values of every size (so guessed record starts land on any byte), nulls, headers, gaps in offsets."""

from __future__ import annotations

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ledgerview.kafka.record_encoding import encode_batch, encode_empty_batch
from ledgerview.kafka.records import CorruptBatchError, InvalidRecordsError, UnsupportedBatchError, decode_batches
from storage.schema import HEADER_TYPE

binary = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=2)
message = st.tuples(binary, binary, st.integers(-5000, 5000), headers)
messages = st.lists(message, min_size=1, max_size=120)
Row = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]


def _built(rows: list[Row], compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=7, producer_epoch=1, base_sequence=40, batch_size=10**8)
    for offset, (key, value, delta, pairs) in enumerate(rows):
        builder.append(offset, timestamp=1_700_000_000_000 + delta, key=key, value=value, headers=pairs)
    return bytes(builder.build())


@given(messages)
def test_decoding_what_kafka_python_builds(rows: list[Row]) -> None:
    [batch] = decode_batches(_built(rows))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 1, 40)
    table = batch.records
    assert table["key"].to_pylist() == [key for key, _, _, _ in rows]
    assert table["value"].to_pylist() == [value for _, value, _, _ in rows]
    assert table["timestamp"].to_pylist() == [1_700_000_000_000 + delta for _, _, delta, _ in rows]
    assert [[(h["key"], h["value"]) for h in row or []] for row in table["headers"].to_pylist()] == [
        pairs for _, _, _, pairs in rows]


@given(messages, st.lists(st.integers(1, 50), min_size=120, max_size=120))
def test_kafka_python_reads_what_the_endpoint_encodes(
        rows: list[Row], gaps: list[int]) -> None:
    offsets = np.cumsum(gaps[: len(rows)]) + 1000
    batch = pa.RecordBatch.from_arrays([
        pa.array(offsets, pa.int64()),
        pa.array([1_700_000_000_000 + delta for _, _, delta, _ in rows], pa.int64()),
        pa.array([key for key, _, _, _ in rows], pa.binary()),
        pa.array([value for _, value, _, _ in rows], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in pairs] or None for _, _, _, pairs in rows], HEADER_TYPE),
    ], names=["offset", "timestamp", "key", "value", "headers"])
    encoded = DefaultRecordBatch(encode_batch(batch, last_offset=int(offsets[-1]) + 3))
    assert encoded.validate_crc()
    assert encoded.next_offset == int(offsets[-1]) + 4  # widened: the consumer moves past the removed tail
    records = list(encoded)
    assert [r.offset for r in records] == offsets.tolist()
    assert [(r.key, r.value, list(r.headers)) for r in records] == [(k, v, p) for k, v, _, p in rows]


def test_gzip_batches_and_empty_batches() -> None:
    rows = [(b"k%d" % i, b"v" * i, 0, []) for i in range(50)]
    [batch] = decode_batches(_built(rows, compression=1))
    assert batch.records["value"].to_pylist() == [b"v" * i for i in range(50)]
    empty = DefaultRecordBatch(encode_empty_batch(10, 14))
    assert empty.validate_crc() and list(empty) == [] and empty.next_offset == 15


def test_bad_batches_are_refused_with_the_reason() -> None:
    good = _built([(b"k", b"v", 0, [])])
    with pytest.raises(CorruptBatchError, match="CRC"):
        decode_batches(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(CorruptBatchError, match="does not fit"):
        decode_batches(good[:-2])
    with pytest.raises(UnsupportedBatchError, match="magic"):
        decode_batches(good[:16] + b"\x01" + good[17:])
    two = _built([(b"k", b"v", 0, []), (b"k", b"w", 0, [])])
    patched = bytearray(two)
    patched[60] = 3  # recordsCount 3 while lastOffsetDelta says 2 records, under a valid CRC
    patched[17:21] = crc32c.crc32c(bytes(patched[21:])).to_bytes(4, "big")
    with pytest.raises(InvalidRecordsError, match="lastOffsetDelta"):
        decode_batches(bytes(patched))
