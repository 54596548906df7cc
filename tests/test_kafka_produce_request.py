"""Produce requests read without copying their records (ledgerview/kafka/produce_request.py) against kafka-python's
own encoding and decoding of the same requests, v3-v8: the same fields, records that are views of the frame, and
truncated requests refused as kafka-python refuses them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceRequest as KafkaPythonProduceRequest

from ledgerview.kafka.produce_request import ProduceRequest

names = st.text(st.characters(codec="utf-8"), max_size=12)
partitions = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.one_of(st.none(), st.binary(max_size=64))),
                      max_size=3)
Request = tuple[int, str | None, int, int, list[tuple[str, list[tuple[int, bytes | None]]]]]
requests = st.tuples(st.integers(3, 8), st.one_of(st.none(), names), st.sampled_from([-1, 0, 1]),
                     st.integers(0, 2**31 - 1), st.lists(st.tuples(names, partitions), max_size=3))


def _encoded(version: int, transactional_id: str | None, acks: int, timeout_ms: int,
             topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> bytes:
    request = KafkaPythonProduceRequest(
        version=version, transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
        topic_data=[KafkaPythonProduceRequest.TopicProduceData(name=name, partition_data=[
            KafkaPythonProduceRequest.TopicProduceData.PartitionProduceData(index=index, records=records)
            for index, records in data]) for name, data in topics])
    return bytes(request.encode())


@given(requests)
def test_the_same_fields_as_kafka_python(request: Request) -> None:
    version, transactional_id, acks, timeout_ms, topics = request
    body = _encoded(version, transactional_id, acks, timeout_ms, topics)
    ours = ProduceRequest.decode(memoryview(body), version=version)
    theirs = KafkaPythonProduceRequest.decode(body, version=version)
    assert (ours.transactional_id, ours.acks, ours.timeout_ms) == (theirs.transactional_id, theirs.acks,
                                                                   theirs.timeout_ms)
    assert [(topic.name, [(data.index, None if data.records is None else bytes(data.records))
                          for data in topic.partition_data]) for topic in ours.topic_data] == [
        (topic.name, [(data.index, data.records) for data in topic.partition_data]) for topic in theirs.topic_data]


def test_records_are_views_of_the_frame_not_copies() -> None:
    frame = bytearray(_encoded(7, None, -1, 1000, [("t", [(0, b"records")])]))
    [topic] = ProduceRequest.decode(memoryview(frame), version=7).topic_data
    records = topic.partition_data[0].records
    assert records is not None and bytes(records) == b"records"
    frame[-1:] = b"S"
    assert bytes(records) == b"recordS"


@given(requests, st.data())
def test_truncated_requests_are_refused(request: Request, data: st.DataObject) -> None:
    body = _encoded(*request)
    cut = data.draw(st.integers(0, len(body) - 1))
    version = request[0]
    try:
        KafkaPythonProduceRequest.decode(body[:cut], version=version)
    except (ValueError, struct.error, IndexError):
        with pytest.raises((ValueError, struct.error)):
            ProduceRequest.decode(memoryview(body[:cut]), version=version)
