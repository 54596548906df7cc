"""The streamed Fetch response is byte for byte what kafka-python's FetchResponse encodes, for every version, and
each batch's size is known exactly before it is encoded and the batch reads back through kafka-python's decoder."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kafka.record.default_records import DefaultRecordBatch

from ledgerview.kafka.fetch_response import PartitionAnswer, StreamedFetchResponse, fixed
from ledgerview.kafka.protocol import ErrorCode, encode_response
from ledgerview.kafka.record_encoding import encode_batch, record_layout
from storage.schema import HEADER_TYPE

TopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = TopicResponse.PartitionData
binary = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=2)


@pytest.mark.parametrize("version", range(4, 12))
def test_pieces_match_kafka_python(version: int) -> None:
    answers = {"a": [PartitionAnswer(0, ErrorCode.NONE, 10, 2, [fixed(b"xyz"), fixed(b"0123")]),
                     PartitionAnswer(3, ErrorCode.OFFSET_OUT_OF_RANGE, 7, 1)],
               "bb": [PartitionAnswer(1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]}
    streamed = StreamedFetchResponse(version, list(answers.items()))
    framed = streamed.framed(correlation_id=42)
    written = b"".join(bytes(piece.make()) for piece in framed.pieces)
    assert sum(piece.size for piece in framed.pieces) == len(written)

    expected = FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=[
        TopicResponse(topic=name, partitions=[PartitionData(
            partition_index=answer.index, error_code=answer.error.value, high_watermark=answer.high_watermark,
            last_stable_offset=answer.high_watermark, log_start_offset=answer.log_start_offset,
            aborted_transactions=None, preferred_read_replica=-1,
            records=b"".join(bytes(piece.make()) for piece in answer.batches)) for answer in partitions])
        for name, partitions in answers.items()])
    assert written == encode_response(expected, 42)


@given(st.lists(st.tuples(binary, binary, st.integers(-5000, 5000), headers), min_size=1, max_size=60))
def test_batch_size_is_known_before_encoding_and_the_batch_decodes(
        rows: list[tuple[bytes | None, bytes | None, int, list[Any]]]) -> None:
    batch = pa.RecordBatch.from_arrays([
        pa.array(np.arange(len(rows)) * 3 + 100, pa.int64()),
        pa.array([1_700_000_000_000 + delta for _, _, delta, _ in rows], pa.int64()),
        pa.array([key for key, _, _, _ in rows], pa.binary()),
        pa.array([value for _, value, _, _ in rows], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in pairs] or None for _, _, _, pairs in rows], HEADER_TYPE),
    ], names=["offset", "timestamp", "key", "value", "headers"])
    encoded = bytes(encode_batch(batch))
    assert record_layout(batch).batch_bytes == len(encoded)
    # kafka-python's own decoder, not ours, reads the batch back: every record, its CRC checked.
    decoded = DefaultRecordBatch(encoded)
    assert decoded.validate_crc()
    assert [(record.offset, record.timestamp, record.key, record.value, record.headers) for record in decoded] == [
        (100 + 3 * index, 1_700_000_000_000 + delta, key, value, [(k, v) for k, v in pairs])
        for index, (key, value, delta, pairs) in enumerate(rows)]
