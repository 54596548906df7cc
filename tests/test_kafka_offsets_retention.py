"""offsets.retention.minutes: committed offsets of a group with no members whose last commit is older than the
retention are removed, when the endpoint starts and every offsets.retention.check.interval.ms; recent commits and
groups with members keep theirs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.coordinator import Group, GroupCoordinator, JoinRequest, Member
from ledgerview.kafka.offsets_retention import expire_group_offsets
from ledgerview.kafka.protocol import ErrorCode
from storage import Store
from storage.cursors import SubscriptionCursor, read_subscription_cursor, write_subscription_cursor
from tests.kafka_support import wait_for

WEEK_MS = 10080 * 60_000
NOW_MS = 1_800_000_000_000


def _commit(store: Store, group_id: str, partition: int, updated_ms: int) -> None:
    folder = store.partition_log("t", partition).folder
    write_subscription_cursor(folder, SubscriptionCursor(group_id, partition, 5, False, None, updated_ms, "m"))


def _committed(store: Store, group_id: str, partition: int) -> int | None:
    cursor = read_subscription_cursor(store.partition_log("t", partition).folder, group_id, partition)
    return None if cursor is None else cursor.acked_offset


def test_old_offsets_of_empty_groups_are_removed_and_the_others_kept(tmp_path: Path) -> None:
    with Store.open(tmp_path / "data") as store:
        store.create_topic("t", partitions=2)
        _commit(store, "gone", 0, NOW_MS - WEEK_MS - 1)
        _commit(store, "gone", 1, NOW_MS - 10)  # a recent commit on another partition stays
        _commit(store, "recent", 0, NOW_MS - WEEK_MS + 1000)
        _commit(store, "alive", 0, NOW_MS - 2 * WEEK_MS)
        coordinator = GroupCoordinator()
        request = JoinRequest("m", 45000, 300000, "consumer", [("range", b"")])
        coordinator.groups["alive"] = Group("alive", members={"m": Member("m", request, 0.0)})
        assert expire_group_offsets(store, coordinator, retention_minutes=10080, now_ms=NOW_MS) == 1
        assert _committed(store, "gone", 0) is None
        assert _committed(store, "gone", 1) == 5
        assert _committed(store, "recent", 0) == 5
        assert _committed(store, "alive", 0) == 5


def test_the_endpoint_expires_offsets_on_its_schedule(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
        _commit(store, "old", 0, int(time.time() * 1000) - 2 * 60_000)
    options = EndpointOptions(port=0, offsets_retention_minutes=1, offsets_retention_check_interval_ms=200)
    with KafkaEndpoint(data, options=options) as endpoint, Store.open(data) as store:
        wait_for(lambda: _committed(store, "old", 0) is None, "the old offsets to be removed at start")
        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{endpoint.port}", group_id="fresh",
                                 enable_auto_commit=False)
        try:
            consumer.assign([TopicPartition("t", 0)])
            consumer.commit({TopicPartition("t", 0): OffsetAndMetadata(3, "", -1)})
            time.sleep(0.5)  # a few checks pass: a fresh commit stays
            assert consumer.committed(TopicPartition("t", 0)) == 3
        finally:
            consumer.close()


def test_a_group_that_emptied_lately_keeps_its_offsets_however_old_its_commits(tmp_path: Path) -> None:
    """As Kafka since KIP-211: an empty group's offsets expire offsets.retention.minutes after its last member left,
    not after its last commit. A consumer of a quiet topic (librdkafka commits only offsets that moved) whose last
    commit was a month old lost its positions at the first check after it stopped, a restart's few seconds were
    enough, and it started over from auto.offset.reset."""
    now_s = [0.0]
    coordinator = GroupCoordinator(lambda: now_s[0])

    async def member_comes_and_goes() -> None:
        joined = await coordinator.join("quiet", JoinRequest("", 45000, 300000, "consumer", [("range", b"")]))
        assert coordinator.leave("quiet", [joined.member_id]) == [ErrorCode.NONE]

    with Store.open(tmp_path / "data") as store:
        store.create_topic("t", partitions=1)
        _commit(store, "quiet", 0, NOW_MS - 4 * WEEK_MS)
        _commit(store, "gone", 0, NOW_MS - 4 * WEEK_MS)  # no member while this endpoint ran: its commit counts
        asyncio.run(member_comes_and_goes())
        now_s[0] = WEEK_MS / 1000 - 1
        assert expire_group_offsets(store, coordinator, retention_minutes=10080, now_ms=NOW_MS) == 1
        assert (_committed(store, "quiet", 0), _committed(store, "gone", 0)) == (5, None)
        now_s[0] = WEEK_MS / 1000 + 1
        assert expire_group_offsets(store, coordinator, retention_minutes=10080, now_ms=NOW_MS) == 1
        assert _committed(store, "quiet", 0) is None
        assert coordinator.emptied == {}
