"""Bad requests get Kafka's error codes, never a silent drop or a lost message (DESIGN.md invariant 10): unknown
topic, invalid topic name, offset out of range, message too large, corrupt batches, a read-only compacted name, an
ApiVersions version the endpoint does not speak; a corrupt segment is a storage error (invariant 1: never skipped)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.kafka.protocol import VERSIONS, ApiKey, ErrorCode
from tests.kafka_support import RawClient, Running, fetch_request, kafka

__all__ = ["kafka"]


@pytest.fixture
def client(kafka: Running) -> Any:
    kafka.store.create_topic("small", partitions=1, config={"max.message.bytes": "1000"})
    raw = RawClient(kafka.bootstrap)
    yield raw
    raw.close()


def _batch(values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=10**7)
    for offset, value in enumerate(values):
        builder.append(offset, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())


def _produce(client: RawClient, topic: str, records: bytes, partition: int = 0) -> tuple[int, int]:
    partition_data = ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=records)
    request = ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=5000,
                             topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[partition_data])])
    response = client.request(request, ProduceResponse, 7)
    answer = response.responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def _fetch(client: RawClient, topic: str, offset: int) -> Any:
    """Fetch v11 of partition 0 from ``offset``, without waiting; the partition's answer."""
    request = fetch_request(topic, offset=offset, max_bytes=1 << 20)
    return client.request(request, FetchResponse, 11).responses[0].partitions[0]


def test_produce_errors(kafka: Running, client: RawClient) -> None:
    assert _produce(client, "small", _batch([b"ok"])) == (ErrorCode.NONE, 0)
    assert _produce(client, "missing", _batch([b"x"]))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _produce(client, "small", _batch([b"x"]), partition=3)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _produce(client, "bad/name", _batch([b"x"]))[0] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert _produce(client, "small.compacted", _batch([b"x"]))[0] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert _produce(client, "small", _batch([b"a", b"x" * 5000]))[0] == ErrorCode.MESSAGE_TOO_LARGE
    corrupt = bytearray(_batch([b"payload"]))
    corrupt[-1] ^= 0xFF
    assert _produce(client, "small", bytes(corrupt))[0] == ErrorCode.CORRUPT_MESSAGE
    assert _produce(client, "small", _batch([b"y"])[:-3])[0] == ErrorCode.CORRUPT_MESSAGE
    assert kafka.store.read("small", 0)["value"].to_pylist() == [b"ok"]  # nothing of the bad requests stored
    assert _produce(client, "small", _batch([b"after"])) == (ErrorCode.NONE, 1)


def test_fetch_and_list_offsets_errors(kafka: Running, client: RawClient) -> None:
    kafka.store.append("small", [(None, b"a"), (None, b"b")], partition=0)

    def fetch(topic: str, offset: int) -> Any:
        return _fetch(client, topic, offset)

    out_of_range = fetch("small", 5)
    assert (out_of_range.error_code, out_of_range.high_watermark) == (ErrorCode.OFFSET_OUT_OF_RANGE, 2)
    assert fetch("missing", 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    at_end = fetch("small", 2)
    assert (at_end.error_code, at_end.high_watermark, at_end.records) == (ErrorCode.NONE, 2, b"")
    listed = ListOffsetsRequest(version=5, replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name="missing", partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                                      timestamp=-1)])])
    answer = client.request(listed, ListOffsetsResponse, 5).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_metadata_lists_both_names_and_flags_unknown_and_invalid_topics(kafka: Running, client: RawClient) -> None:
    everything = client.request(MetadataRequest(version=8, topics=None, allow_auto_topic_creation=False),
                                MetadataResponse, 8)
    assert sorted(topic.name for topic in everything.topics) == ["small", "small.compacted"]
    asked = MetadataRequest(version=8, allow_auto_topic_creation=False, topics=[
        MetadataRequest.MetadataRequestTopic(name=name) for name in ("missing", "no way", "small.compacted")])
    errors = {topic.name: topic.error_code for topic in client.request(asked, MetadataResponse, 8).topics}
    assert errors == {"missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no way": ErrorCode.INVALID_TOPIC_EXCEPTION,
                      "small.compacted": ErrorCode.NONE}


def test_an_unknown_api_versions_version_gets_a_v0_error_listing_the_range(client: RawClient) -> None:
    request = ApiVersionsRequest(version=2)
    request.with_header(correlation_id=9, client_id="probe")
    frame = bytearray(request.encode(header=True, framed=True))
    frame[6:8] = (99).to_bytes(2, "big")  # the request header's api_version: a version from the future
    client.send_frame(bytes(frame))
    response = ApiVersionsResponse.decode(client.read_frame(), version=0, header=True)
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
    versions = VERSIONS[ApiKey.API_VERSIONS]
    assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [
        (ApiKey.API_VERSIONS, versions.advertised_min, versions.maximum)]
    supported = client.request(ApiVersionsRequest(version=2), ApiVersionsResponse, 2)  # the connection lives on
    produce = next(k for k in supported.api_keys if k.api_key == ApiKey.PRODUCE)
    assert produce.min_version == 0  # librdkafka < 2.11.1 needs Produce to advertise version 0 (KAFKA-18659)


def test_a_corrupt_sealed_segment_is_a_corrupt_message_not_a_closed_connection(kafka: Running,
                                                                                client: RawClient) -> None:
    kafka.store.create_topic("fragile", partitions=1)
    kafka.store.append("fragile", [(None, b"x" * 100) for _ in range(20)], partition=0)
    kafka.store.roll("fragile", 0)
    kafka.store.append("fragile", [(None, b"after")], partition=0)
    segment = kafka.data / "fragile-0" / ("0" * 20 + ".log")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    answer = _fetch(client, "fragile", 0)
    assert answer.error_code == ErrorCode.CORRUPT_MESSAGE  # the damage is the first batch: nothing before it
    assert _produce(client, "small", _batch([b"still served"]))[0] == ErrorCode.NONE
