"""Real Kafka clients (kafka-python, confluent-kafka) against the endpoint on loopback: what they produce is what
the store, the readers and the compactor see, what the store holds is what they consume, including each topic's
compacted view under ``<topic>.compacted`` (DESIGN.md invariant 4: ledger then raw tail, original offsets)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from compactor import Compactor
from readers import Reader
from storage.partitioner import partition_for_keys
from tests.kafka_support import Running, kafka, wait_for

__all__ = ["kafka"]

pytestmark = pytest.mark.slow  # real clients: a few seconds each

logging.getLogger("kafka").setLevel(logging.WARNING)

FAST_CONSUMER = {"fetch_max_wait_ms": 100, "consumer_timeout_ms": 5000, "request_timeout_ms": 20000}


def _stored(running: Running, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes | None]]:
    table = running.store.read(topic, partition)
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def _kafka_python_read(running: Running, topic: str, partition: int, offset: int) -> list[object]:
    consumer = KafkaConsumer(bootstrap_servers=running.bootstrap, group_id=None, **FAST_CONSUMER)
    try:
        target = TopicPartition(topic, partition)
        consumer.assign([target])
        consumer.seek(target, offset)
        end = consumer.end_offsets([target])[target]
        messages: list[object] = []
        wait_for(lambda: messages.extend(_drain(consumer)) or consumer.position(target) >= end,
                 f"kafka-python to reach offset {end} of {topic}")
        return messages
    finally:
        consumer.close()


def _drain(consumer: KafkaConsumer) -> list[object]:
    return [record for records in consumer.poll(timeout_ms=200).values() for record in records]


def test_kafka_python_idempotent_producer_lands_where_murmur2_sends_keys(kafka: Running) -> None:
    kafka.store.create_topic("orders", partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)  # idempotent by default in kafka-python 3
    assert producer.config["enable_idempotence"]
    futures = [producer.send("orders", key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)])
               for i in range(300)]
    producer.flush()
    metadata = [future.get(timeout=30) for future in futures]
    producer.close()
    for index, meta in enumerate(metadata):
        table = kafka.store.read("orders", meta.partition, start_offset=meta.offset, max_messages=1)
        assert table["key"][0].as_py() == b"k%d" % index
        assert table["value"][0].as_py() == b"v%d" % index
        assert table["headers"][0].as_py() == [{"key": "n", "value": b"%d" % index}]
    keys = pa.array([b"k%d" % i for i in range(300)], pa.binary())
    assert [meta.partition for meta in metadata] == partition_for_keys(keys, 3).tolist()
    assert len(list(Reader(kafka.store, "orders", start="earliest"))) == 300


def test_kafka_python_assign_and_seek_reads_what_the_store_holds(kafka: Running) -> None:
    kafka.store.create_topic("log", partitions=1)
    kafka.store.append("log", [{"key": None if i % 4 == 0 else b"k%d" % i, "value": None if i % 7 == 0 else b"v%d" % i,
                                "timestamp": 1_700_000_000_000 + i, "headers": [("h", b"x")] if i % 3 == 0 else []}
                               for i in range(50)], partition=0)
    records = _kafka_python_read(kafka, "log", 0, 5)
    stored = kafka.store.read("log", 0, start_offset=5).to_pylist()
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [  # type: ignore[attr-defined]
        (m["offset"], m["key"], m["value"], m["timestamp"]) for m in stored]
    assert [list(r.headers) for r in records] == [  # type: ignore[attr-defined]
        [(h["key"], h["value"]) for h in m["headers"] or []] for m in stored]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_producer_codecs_and_consumer(kafka: Running, codec: str) -> None:
    kafka.store.create_topic("events", partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": codec, "linger.ms": 5,
                         "enable.idempotence": True})
    for i in range(2000):
        producer.produce("events", key=b"k%d" % (i % 50), value=b"value-%d" % i * 3)
    assert producer.flush(30) == 0
    assert _stored(kafka, "events", 0) == [(i, b"k%d" % (i % 50), b"value-%d" % i * 3) for i in range(2000)]
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "reader", "enable.auto.commit": False,
                         "check.crcs": True})
    try:
        consumer.assign([ConfluentPartition("events", 0, 0)])
        received: list[tuple[int, bytes, bytes]] = []

        def consumed_all() -> bool:
            for message in consumer.consume(1000, timeout=0.5):
                assert message.error() is None, message.error()
                received.append((message.offset(), message.key(), message.value()))
            return len(received) >= 2000

        wait_for(consumed_all, "confluent-kafka to consume 2000 messages")
        assert received == _stored(kafka, "events", 0)
    finally:
        consumer.close()


def _compacted_fixture(running: Running) -> dict[bytes, bytes]:
    """A compacted topic: keys updated and some deleted, compacted, then a raw tail; returns the expected view."""
    running.store.create_topic("prices", partitions=1)
    producer = Producer({"bootstrap.servers": running.bootstrap, "linger.ms": 1})
    expected: dict[bytes, bytes] = {}
    for i in range(400):
        key = b"sym%d" % (i % 40)
        value = None if i % 40 == 7 and i > 200 else b"%d" % i
        producer.produce("prices", key=key, value=value)
        expected.pop(key, None) if value is None else expected.__setitem__(key, value)
    producer.produce("prices", key=b"sym3", value=None)  # the last message is a tombstone: removed in the view
    expected.pop(b"sym3")
    assert producer.flush(30) == 0
    [result] = Compactor(running.store).compact("prices")
    assert result.messages_kept < 400
    return expected


def test_compacted_view_by_kafka_python_reaches_the_high_water_mark(kafka: Running) -> None:
    expected = _compacted_fixture(kafka)
    kafka.store.append("prices", [(b"sym1", b"tail")], partition=0)  # the raw tail above the horizon
    expected[b"sym1"] = b"tail"
    end = kafka.store.end_offset("prices", 0)
    records = _kafka_python_read(kafka, "prices.compacted", 0, 0)
    view: dict[bytes, bytes] = {}
    for record in records:
        view[record.key] = record.value  # type: ignore[attr-defined]
    assert view == expected
    offsets = [record.offset for record in records]  # type: ignore[attr-defined]
    assert offsets == sorted(offsets) and offsets[-1] == end - 1
    compacted = [(m.offset, m.key, m.value) for m in Reader(kafka.store, "prices", read_compacted=True)]
    assert [(r.offset, r.key, r.value) for r in records] == compacted  # type: ignore[attr-defined]


def test_compacted_view_by_confluent_reaches_eof_at_the_high_water_mark(kafka: Running) -> None:
    expected = _compacted_fixture(kafka)
    end = kafka.store.end_offset("prices", 0)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "view", "enable.auto.commit": False,
                         "enable.partition.eof": True, "check.crcs": True})
    try:
        consumer.assign([ConfluentPartition("prices.compacted", 0, 0)])
        view: dict[bytes, bytes] = {}
        eof_at: list[int] = []

        def reached_eof() -> bool:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    eof_at.append(message.offset())
                    return True
                view[message.key()] = message.value()
            return False

        wait_for(reached_eof, "confluent-kafka's end-of-partition on the compacted view")
        assert view == expected
        assert eof_at == [end]
        assert consumer.get_watermark_offsets(ConfluentPartition("prices.compacted", 0)) == (0, end)
    finally:
        consumer.close()


def test_producing_to_the_compacted_name_is_refused(kafka: Running) -> None:
    kafka.store.create_topic("prices", partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "message.timeout.ms": 5000})
    errors: list[object] = []
    producer.produce("prices.compacted", value=b"x", on_delivery=lambda error, message: errors.append(error))
    producer.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    assert "INVALID_TOPIC" in str(errors[0]) or "invalid" in str(errors[0]).lower()
    assert kafka.store.end_offset("prices", 0) == 0
