"""A flipped byte in a batch of a sealed segment, fetched through the endpoint: kcat, confluent-kafka and
kafka-python get every message before the damaged batch, then CORRUPT_MESSAGE ends their read; none hangs."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as PythonPartition
from kafka.errors import CorruptRecordError

from ledgerview.kafka import KafkaEndpoint
from storage import Store

BATCHES, PER_BATCH, DAMAGED = 5, 10, 2
BEFORE = [b"%d" % n for n in range(DAMAGED * PER_BATCH)]
KCAT = shutil.which("kcat")


@pytest.fixture
def bootstrap(tmp_path: Path) -> Iterator[str]:
    """An endpoint over a topic of five ten-message batches in a sealed segment, the third with a flipped byte."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
        for batch in range(BATCHES):
            store.append("t", [{"key": None, "value": b"%d" % n}
                               for n in range(batch * PER_BATCH, (batch + 1) * PER_BATCH)], partition=0)
        store.roll("t", 0)
        [segment, _] = store.segments("t", 0)
        header = list(segment.scan(0))[DAMAGED]
        path = Path(segment.source)
    damaged = bytearray(path.read_bytes())
    damaged[header.position + header.batch_length - 16] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with KafkaEndpoint(data, port=0) as endpoint:
        yield f"127.0.0.1:{endpoint.port}"


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it with apt-get)")
def test_kcat_gets_the_messages_before_the_damage_then_an_error(bootstrap: str) -> None:
    assert KCAT is not None
    done = subprocess.run([KCAT, "-b", bootstrap, "-C", "-t", "t", "-o", "beginning", "-e", "-f", "%s\n"],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode != 0
    assert done.stdout.splitlines() == BEFORE
    assert b"Invalid message" in done.stderr, done.stderr  # librdkafka's text for CORRUPT_MESSAGE


def test_confluent_kafka_gets_the_messages_before_the_damage_then_an_error(bootstrap: str) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition("t", 0, 0)])
    received, error, deadline = [], None, time.monotonic() + 60
    try:
        while error is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                error = message.error()
            else:
                received.append(message.value())
    finally:
        consumer.close()
    assert received == BEFORE
    assert error is not None and error.code() == KafkaError.INVALID_MSG  # Kafka's CORRUPT_MESSAGE, code 2


def test_kafka_python_gets_the_messages_before_the_damage_then_an_error(bootstrap: str) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    consumer.assign([PythonPartition("t", 0)])
    consumer.seek(PythonPartition("t", 0), 0)
    received: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        with pytest.raises(CorruptRecordError):
            while time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    received += [record.value for record in records]
    finally:
        consumer.close()
    assert received == BEFORE
