"""A Fetch encodes consecutive small stored batches as one Kafka batch: encoding costs per batch, and a Kafka
producer's batches (batch.size 16 KiB) are about a hundred messages, so a log they wrote was served ten times
slower than one of large batches (bench/RESULTS.md, issue 19). A stored batch larger than BATCH_ENCODE_BYTES is
still cut into Kafka batches of about that size."""

from __future__ import annotations

from kafka.protocol.consumer import FetchResponse
from kafka.record import MemoryRecords

from ledgerview.kafka.fetch import BATCH_ENCODE_BYTES, RECORD_OVERHEAD_BYTES
from tests.kafka_support import RawClient, Running, fetch_request, kafka

__all__ = ["kafka"]

Message = tuple[int, bytes | None, bytes | None]


def fetched_batches(bootstrap: str, topic: str) -> list[list[Message]]:
    """Partition 0 of ``topic`` from offset 0 in one Fetch, as its Kafka batches' (offset, key, value)."""
    client = RawClient(bootstrap)
    try:
        response = client.request(fetch_request(topic, max_bytes=32 * 1024 * 1024), FetchResponse, 11)
    finally:
        client.close()
    records = MemoryRecords(response.responses[0].partitions[0].records)
    batches = []
    while (batch := records.next_batch()) is not None:
        batches.append([(record.offset, record.key, record.value) for record in batch])
    return batches


def test_small_stored_batches_go_out_as_one_kafka_batch_and_a_large_one_is_cut(kafka: Running) -> None:
    kafka.store.create_topic("t")
    small = [(b"k%d" % i, b"v%d" % i) for i in range(2_000)]
    for start in range(0, len(small), 20):  # 100 stored batches of 20 messages
        kafka.store.append("t", small[start : start + 20], partition=0)
    large = [(None, bytes([i % 256]) * 3_000) for i in range(1_000)]
    kafka.store.append("t", large, partition=0)  # one stored batch of 3 MB

    batches = fetched_batches(kafka.bootstrap, "t")

    messages = [message for batch in batches for message in batch]
    assert messages == [(offset, key, value) for offset, (key, value) in enumerate(small + large)]
    assert len(batches[0]) == 2_000  # the 100 small stored batches, as one
    per_batch = BATCH_ENCODE_BYTES // (3_000 + RECORD_OVERHEAD_BYTES)
    assert [len(batch) for batch in batches[1:]] == [per_batch, per_batch, 1_000 - 2 * per_batch]
