"""Metadata of a damaged partition, through kafka-python's admin client and consumer on a real endpoint.

A flipped byte in partition 1's active segment (below the recovery point, so its log does not open): once a request
has touched the partition, Metadata lists it under both names, ``t`` and ``t.compacted``, in the listing of every
topic and when asked by name, with KAFKA_STORAGE_ERROR and node 0 offline, as Fetch, ListOffsets and Produce answer
it; partitions 0 and 2 stay online and readable. Restoring the segment's bytes brings partition 1 back online
without a restart."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaStorageError

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.protocol import ErrorCode
from storage import Store

MESSAGES = 10
DAMAGED = 1
NAMES = ["t", "t.compacted"]


@dataclass
class Damaged:
    bootstrap: str
    segment: Path
    sound_bytes: bytes


@pytest.fixture
def damaged(tmp_path: Path) -> Iterator[Damaged]:
    """An endpoint over topic ``t`` of three partitions, ten messages each, partition 1's only (active) segment with
    a byte flipped in its first batch after a clean close."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t", partitions=3)
        for partition in range(3):
            store.append("t", [{"key": None, "value": b"p%d-%d" % (partition, n)} for n in range(MESSAGES)],
                         partition=partition)
    [segment] = (data / f"t-{DAMAGED}").glob("*.log")
    sound_bytes = segment.read_bytes()
    flipped = bytearray(sound_bytes)
    flipped[len(flipped) // 2] ^= 0xFF
    segment.write_bytes(bytes(flipped))
    with KafkaEndpoint(data, port=0) as endpoint:
        yield Damaged(f"127.0.0.1:{endpoint.port}", segment, sound_bytes)


def partition_states(bootstrap: str, topics: list[str] | None) -> dict[tuple[str, int], tuple[int, int, list[int]]]:
    """Each partition of ``topics`` (None: every topic) as Metadata describes it: error code, leader, offline
    replicas."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described: list[dict[str, Any]] = admin.describe_topics(topics)
    finally:
        admin.close()
    return {(topic["name"], partition["partition_index"]): (
                partition["error_code"], partition["leader_id"], partition["offline_replicas"])
            for topic in described if topic["name"] in NAMES for partition in topic["partitions"]}


def online(*partitions: int) -> dict[tuple[str, int], tuple[int, int, list[int]]]:
    return {(name, partition): (ErrorCode.NONE.value, 0, []) for name in NAMES for partition in partitions}


def read_all(bootstrap: str, partitions: list[int]) -> dict[int, list[bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100, consumer_timeout_ms=10_000)
    targets = [TopicPartition("t", partition) for partition in partitions]
    consumer.assign(targets)
    for target in targets:
        consumer.seek(target, 0)
    values: dict[int, list[bytes]] = {partition: [] for partition in partitions}
    try:
        for message in consumer:
            values[message.partition].append(message.value)
            if all(len(read) == MESSAGES for read in values.values()):
                break
    finally:
        consumer.close()
    return values


def written(partition: int) -> list[bytes]:
    return [b"p%d-%d" % (partition, n) for n in range(MESSAGES)]


def test_a_damaged_partition_is_listed_offline_with_a_storage_error_until_its_files_are_repaired(
        damaged: Damaged) -> None:
    producer = KafkaProducer(bootstrap_servers=damaged.bootstrap, retries=0)
    try:
        with pytest.raises(KafkaStorageError):  # the request that finds the damage
            producer.send("t", b"new", partition=DAMAGED).get(timeout=30)
    finally:
        producer.close()

    offline = {(name, DAMAGED): (ErrorCode.KAFKA_STORAGE_ERROR.value, 0, [0]) for name in NAMES}
    assert partition_states(damaged.bootstrap, None) == online(0, 2) | offline
    assert partition_states(damaged.bootstrap, NAMES) == online(0, 2) | offline
    assert read_all(damaged.bootstrap, [0, 2]) == {0: written(0), 2: written(2)}

    damaged.segment.write_bytes(damaged.sound_bytes)
    assert partition_states(damaged.bootstrap, None) == online(0, 1, 2)
    assert partition_states(damaged.bootstrap, NAMES) == online(0, 1, 2)
    assert read_all(damaged.bootstrap, [DAMAGED]) == {DAMAGED: written(DAMAGED)}
