"""A flipped byte in the active segment of one partition of a two-partition topic: that partition's log does not
open (the damaged batch is below the recovery point). Through the endpoint, real clients still produce to and
consume from the other partition, commit a group's positions on both, and see Kafka's KAFKA_STORAGE_ERROR (56) for
the damaged one, in that partition's answer, never a closed connection; the endpoint logs the damaged file."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as PythonPartition
from kafka.errors import KafkaStorageError
from kafka.structs import OffsetAndMetadata

from ledgerview.kafka import KafkaEndpoint
from storage import Store

pytestmark = pytest.mark.slow
MESSAGES = 10
KCAT = shutil.which("kcat")


class Damaged:
    def __init__(self, bootstrap: str, segment: Path) -> None:
        self.bootstrap, self.segment = bootstrap, segment


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Damaged]:
    """One endpoint over topic ``t`` of two partitions, ten messages each, partition 1's only (active) segment with a
    byte flipped in its first batch after a clean close; and topic ``broken``, whose metadata record is damaged."""
    data = tmp_path_factory.mktemp("damaged") / "data"
    with Store.open(data) as store:
        store.create_topic("broken")
        store.create_topic("t", partitions=2)
        for partition in (0, 1):
            store.append("t", [{"key": None, "value": b"p%d-%d" % (partition, n)} for n in range(MESSAGES)],
                         partition=partition)
    [segment] = (data / "t-1").glob("*.log")
    metadata = data / "__topics" / "broken" / "topic.json"
    metadata.write_bytes(metadata.read_bytes()[:-5])
    content = bytearray(segment.read_bytes())
    content[len(content) // 2] ^= 0xFF
    segment.write_bytes(bytes(content))
    with KafkaEndpoint(data, port=0) as endpoint:
        yield Damaged(f"127.0.0.1:{endpoint.port}", segment)


def test_the_sound_partition_is_served_and_the_damaged_one_answers_a_storage_error(
        damaged: Damaged, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ledgerview.kafka")
    producer = KafkaProducer(bootstrap_servers=damaged.bootstrap, retries=0)
    try:
        stored = producer.send("t", b"p0-new", partition=0).get(timeout=30)
        with pytest.raises(KafkaStorageError):
            producer.send("t", b"p1-new", partition=1).get(timeout=30)
    finally:
        producer.close()
    assert stored.offset == MESSAGES

    consumer = Consumer({"bootstrap.servers": damaged.bootstrap, "group.id": "reader", "enable.auto.commit": False})
    received: list[tuple[int, bytes | None]] = []
    try:
        consumer.assign([TopicPartition("t", 0, 0), TopicPartition("t", 1, 0)])
        deadline = time.monotonic() + 60
        while len(received) < MESSAGES + 1 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received.append((message.partition(), message.value()))
        assert consumer.get_watermark_offsets(TopicPartition("t", 0), timeout=30) == (0, MESSAGES + 1)
        with pytest.raises(KafkaException) as listed:
            consumer.get_watermark_offsets(TopicPartition("t", 1), timeout=30)
    finally:
        consumer.close()
    assert received == [(0, b"p0-%d" % n) for n in range(MESSAGES)] + [(0, b"p0-new")]
    assert listed.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR
    naming = [record for record in caplog.records if str(damaged.segment) in record.getMessage()]
    assert naming, caplog.text
    assert sum(record.levelno == logging.ERROR for record in naming) <= 1  # once an error, then debug: no flood


def test_a_group_commits_and_reads_its_positions_on_both_partitions(damaged: Damaged) -> None:
    consumer = KafkaConsumer(bootstrap_servers=damaged.bootstrap, group_id="positions", enable_auto_commit=False)
    sound, broken = PythonPartition("t", 0), PythonPartition("t", 1)
    try:
        consumer.commit({sound: OffsetAndMetadata(4, "", -1), broken: OffsetAndMetadata(3, "", -1)})
        assert (consumer.committed(sound), consumer.committed(broken)) == (4, 3)
    finally:
        consumer.close()


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it with apt-get)")
def test_kcat_names_the_storage_error_of_the_damaged_partition_only(damaged: Damaged) -> None:
    assert KCAT is not None

    def query(partition: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KCAT, "-b", damaged.bootstrap, "-Q", "-t", f"t:{partition}:-1"], capture_output=True,
                              text=True, timeout=60, check=False)

    sound, broken = query(0), query(1)
    assert sound.returncode == 0 and "t [0] offset" in sound.stdout, sound
    assert broken.returncode != 0
    assert "Disk error when trying to access log file on disk" in broken.stderr, broken  # KAFKA_STORAGE_ERROR


def test_a_topic_whose_metadata_record_is_damaged_hides_no_other_topic(damaged: Damaged) -> None:
    """Metadata of every topic let the damaged record's error escape, and the endpoint closed the connection: no
    client could list the topics or bootstrap by listing them."""
    consumer = Consumer({"bootstrap.servers": damaged.bootstrap, "group.id": "lister"})
    try:
        topics = consumer.list_topics(timeout=30).topics
    finally:
        consumer.close()
    assert topics["t"].error is None and sorted(topics["t"].partitions) == [0, 1]
    assert topics["broken"].error is not None and topics["broken"].error.code() == KafkaError.KAFKA_STORAGE_ERROR
    listed = KafkaConsumer(bootstrap_servers=damaged.bootstrap)
    try:
        assert "t" in listed.topics()
    finally:
        listed.close()
