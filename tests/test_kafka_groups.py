"""Consumer groups through the endpoint: two kafka-python members rebalance the partitions between them, commit,
and a new member resumes from the commits, which are the subscription cursor records a ledgerview Consumer of
the same name reads; confluent-kafka's subscribe and commit too. Also the coordinator's state machine alone."""

from __future__ import annotations

import asyncio
import logging

import pytest
from confluent_kafka import Consumer
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetMetadataTooLargeError
from kafka.structs import OffsetAndMetadata

from ledgerview.kafka.coordinator import GroupCoordinator, GroupState, JoinRequest
from ledgerview.kafka.protocol import ErrorCode
from readers import Consumer as LedgerviewConsumer
from tests.kafka_support import Running, kafka, wait_for

__all__ = ["kafka"]

logging.getLogger("kafka").setLevel(logging.ERROR)

GROUP_CONFIG = {"heartbeat_interval_ms": 200, "session_timeout_ms": 6000, "fetch_max_wait_ms": 100,
                "auto_offset_reset": "earliest", "enable_auto_commit": False, "request_timeout_ms": 20000}


def _member(running: Running, group: str) -> KafkaConsumer:
    consumer = KafkaConsumer(bootstrap_servers=running.bootstrap, group_id=group, **GROUP_CONFIG)
    consumer.subscribe(["jobs"])
    return consumer


def _poll_into(consumer: KafkaConsumer, seen: dict[tuple[int, int], bytes]) -> None:
    # Long enough for a rebalance to finish inside one poll: kafka-python 3.0.12 never applies the assignment a
    # leader got when its poll timed out while it rejoined (its need_rejoin is False once it has assigned, so the
    # finished join is not awaited again), and that member then sends no heartbeat until its session expires.
    for partition, records in consumer.poll(timeout_ms=1000).items():
        for record in records:
            seen[(partition.partition, record.offset)] = record.value


@pytest.mark.slow
def test_two_kafka_python_members_split_partitions_commit_and_resume(kafka: Running) -> None:
    kafka.store.create_topic("jobs", partitions=4)
    for partition in range(4):
        kafka.store.append("jobs", [(None, b"%d-%d" % (partition, i)) for i in range(25)], partition=partition)
    first, seen = _member(kafka, "workers"), {}
    wait_for(lambda: _poll_into(first, seen) or len(first.assignment()) == 4, "the first member to own 4 partitions")
    second = _member(kafka, "workers")

    def split() -> bool:
        _poll_into(first, seen)
        _poll_into(second, seen)
        mine, theirs = first.assignment(), second.assignment()
        return len(mine) == 2 and len(theirs) == 2 and not mine & theirs

    wait_for(split, "a rebalance giving each member 2 of the 4 partitions")
    wait_for(lambda: _poll_into(first, seen) or _poll_into(second, seen) or len(seen) == 100,
             "the two members to consume all 100 messages")
    assert sorted(seen.values()) == sorted(b"%d-%d" % (p, i) for p in range(4) for i in range(25))
    first.commit()
    second.commit()
    first.close()
    second.close()
    with LedgerviewConsumer(kafka.store, "jobs", "workers") as subscription:
        assert subscription.acknowledged == {0: 25, 1: 25, 2: 25, 3: 25}
    kafka.store.append("jobs", [(None, b"new")], partition=2)
    resumed, later = _member(kafka, "workers"), {}
    wait_for(lambda: _poll_into(resumed, later) or later, "the resumed member to receive the new message")
    resumed.close()
    assert later == {(2, 25): b"new"}


@pytest.mark.slow
def test_confluent_subscribe_commit_and_resume(kafka: Running) -> None:
    kafka.store.create_topic("jobs", partitions=2)
    for partition in range(2):
        kafka.store.append("jobs", [(None, b"%d" % i) for i in range(10)], partition=partition)
    config = {"bootstrap.servers": kafka.bootstrap, "group.id": "cgroup", "auto.offset.reset": "earliest",
              "enable.auto.commit": False}
    consumer = Consumer(config)
    consumer.subscribe(["jobs"])
    received: list[object] = []
    wait_for(lambda: received.extend(m for m in consumer.consume(100, timeout=0.5) if m.error() is None)
             or len(received) == 20, "confluent-kafka to consume 20 messages")
    consumer.commit(asynchronous=False)
    consumer.close()
    with LedgerviewConsumer(kafka.store, "jobs", "cgroup") as subscription:
        assert subscription.acknowledged == {0: 10, 1: 10}
    kafka.store.append("jobs", [(None, b"later")], partition=1)
    consumer = Consumer(config)
    consumer.subscribe(["jobs"])
    again: list[object] = []
    wait_for(lambda: again.extend(m for m in consumer.consume(100, timeout=0.5) if m.error() is None) or again,
             "the resumed confluent consumer to receive the new message")
    consumer.close()
    assert [(m.partition(), m.offset(), m.value()) for m in again] == [(1, 10, b"later")]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------- the state machine alone
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _join(member_id: str = "", rebalance_timeout_ms: int = 10_000) -> JoinRequest:
    return JoinRequest(member_id, 3000, rebalance_timeout_ms, "consumer", [("range", b"meta")])


def test_coordinator_barrier_waits_for_every_member_then_drops_the_silent_at_the_deadline() -> None:
    async def scenario() -> None:
        clock = Clock()
        coordinator = GroupCoordinator(clock)
        first = await coordinator.join("g", _join())
        assert (first.error, first.generation, first.leader) == (ErrorCode.NONE, 1, first.member_id)
        assert await coordinator.sync("g", 1, first.member_id, {first.member_id: b"all"}) == (ErrorCode.NONE, b"all")
        second_join = asyncio.ensure_future(coordinator.join("g", _join()))
        await asyncio.sleep(0)
        assert not second_join.done()  # the barrier waits for the first member to rejoin
        assert coordinator.heartbeat("g", 1, first.member_id) is ErrorCode.REBALANCE_IN_PROGRESS
        rejoined = await asyncio.gather(coordinator.join("g", _join(first.member_id)), second_join)
        assert {r.generation for r in rejoined} == {2}
        assert rejoined[0].members and not rejoined[1].members  # only the leader gets the member list
        follower = asyncio.ensure_future(coordinator.sync("g", 2, rejoined[1].member_id, {}))
        await asyncio.sleep(0)
        assert not follower.done()  # followers wait for the leader's assignments
        leader_answer = await coordinator.sync("g", 2, first.member_id,
                                               {first.member_id: b"a", rejoined[1].member_id: b"b"})
        assert leader_answer == (ErrorCode.NONE, b"a") and await follower == (ErrorCode.NONE, b"b")
        assert coordinator.groups["g"].state is GroupState.STABLE
        third = asyncio.ensure_future(coordinator.join("g", _join(rebalance_timeout_ms=5000)))
        await asyncio.sleep(0)
        clock.now = 11.0  # nobody else rejoins; past the largest rebalance timeout the barrier closes
        coordinator.expire()
        alone = await third
        assert (alone.error, alone.generation, len(alone.members)) == (ErrorCode.NONE, 3, 1)
        assert coordinator.heartbeat("g", 3, first.member_id) is ErrorCode.UNKNOWN_MEMBER_ID
        assert coordinator.check_commit("g", 2, alone.member_id) is ErrorCode.ILLEGAL_GENERATION

    asyncio.run(scenario())


def test_coordinator_expires_a_member_whose_session_times_out() -> None:
    async def scenario() -> None:
        clock = Clock()
        coordinator = GroupCoordinator(clock)
        member = await coordinator.join("g", _join())
        await coordinator.sync("g", 1, member.member_id, {})
        clock.now = 3.5
        coordinator.expire()
        assert "g" not in coordinator.groups  # no member left: nothing of the group is kept
        assert coordinator.heartbeat("g", 1, member.member_id) is ErrorCode.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


def test_a_commits_metadata_is_kept_and_an_oversized_one_refused(kafka: Running) -> None:
    kafka.store.create_topic("orders", partitions=1)
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id="audit", enable_auto_commit=False,
                             request_timeout_ms=20000)
    try:
        target = TopicPartition("orders", 0)
        consumer.assign([target])
        consumer.commit({target: OffsetAndMetadata(0, "checkpoint after batch 7", -1)})
        committed = consumer.committed(target, metadata=True)
        assert (committed.offset, committed.metadata) == (0, "checkpoint after batch 7")
        with pytest.raises(OffsetMetadataTooLargeError):
            consumer.commit({target: OffsetAndMetadata(0, "x" * 4097, -1)})  # Kafka's offset.metadata.max.bytes
        assert consumer.committed(target, metadata=True).metadata == "checkpoint after batch 7"
    finally:
        consumer.close()


def test_requests_naming_groups_without_members_keep_nothing() -> None:
    """A heartbeat, sync, leave or commit check naming any group id, and a join with a member id, made the
    coordinator keep a group for that id, and a group whose members had all gone was kept too: a client sending
    requests for ever new group ids grew the endpoint's memory without bound."""
    async def scenario() -> None:
        coordinator = GroupCoordinator(Clock())
        for index in range(100):
            group_id = f"g{index}"
            assert coordinator.heartbeat(group_id, 1, "m") is ErrorCode.UNKNOWN_MEMBER_ID
            assert await coordinator.sync(group_id, 1, "m", {}) == (ErrorCode.UNKNOWN_MEMBER_ID, b"")
            assert coordinator.leave(group_id, ["m"]) == [ErrorCode.UNKNOWN_MEMBER_ID]
            assert coordinator.check_commit(group_id, 1, "m") is not ErrorCode.NONE
            assert (await coordinator.join(group_id, _join("m"))).error is ErrorCode.UNKNOWN_MEMBER_ID
            member = await coordinator.join(group_id, _join())
            assert coordinator.leave(group_id, [member.member_id]) == [ErrorCode.NONE]
        assert coordinator.groups == {}

    asyncio.run(scenario())


async def _settle() -> None:
    """Let every task that can run, run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _two_members(coordinator: GroupCoordinator, rebalance_timeout_ms: int = 10_000) -> tuple[str, str]:
    """The leader and the follower of group g at generation 2, both joined, neither synced."""
    first = await coordinator.join("g", _join(rebalance_timeout_ms=rebalance_timeout_ms))
    second = asyncio.ensure_future(coordinator.join("g", _join(rebalance_timeout_ms=rebalance_timeout_ms)))
    await asyncio.sleep(0)
    leader, follower = await asyncio.gather(
        coordinator.join("g", _join(first.member_id, rebalance_timeout_ms=rebalance_timeout_ms)), second)
    assert (leader.generation, follower.generation, leader.leader) == (2, 2, leader.member_id)
    return leader.member_id, follower.member_id


def test_a_followers_second_sync_answers_its_first() -> None:
    """A follower's SyncGroup waiting for the leader's, and then another from the same member (a client that gave up
    and retried on a new connection): the first was never answered, and its connection's handler, which reads no
    request while it waits, was held with its buffers for as long as the endpoint ran."""
    async def scenario() -> None:
        coordinator = GroupCoordinator(Clock())
        leader, follower = await _two_members(coordinator)
        waiting = asyncio.ensure_future(coordinator.sync("g", 2, follower, {}))
        await _settle()
        retried = asyncio.ensure_future(coordinator.sync("g", 2, follower, {}))
        await _settle()
        assert waiting.done() and waiting.result() == (ErrorCode.REBALANCE_IN_PROGRESS, b"")
        assert await coordinator.sync("g", 2, leader, {leader: b"a", follower: b"b"}) == (ErrorCode.NONE, b"a")
        assert await retried == (ErrorCode.NONE, b"b")

    asyncio.run(scenario())


def test_members_that_do_not_sync_within_the_rebalance_timeout_are_dropped() -> None:
    """As Kafka's pending-sync expiry: a leader that keeps heartbeating but never sends its SyncGroup is dropped once
    the rebalance timeout has passed since the join was answered, and the group rebalances without it. Its
    heartbeats kept the group completing the rebalance for ever, every follower's SyncGroup waiting."""
    async def scenario() -> None:
        clock = Clock()
        coordinator = GroupCoordinator(clock)
        leader, follower = await _two_members(coordinator, rebalance_timeout_ms=5000)
        waiting = asyncio.ensure_future(coordinator.sync("g", 2, follower, {}))
        for now in (2.0, 4.0, 6.0):  # heartbeats within the 3 s sessions
            clock.now = now
            assert coordinator.heartbeat("g", 2, leader) is ErrorCode.NONE
            assert coordinator.heartbeat("g", 2, follower) is ErrorCode.NONE
            coordinator.expire()
            await _settle()
            assert waiting.done() is (now > 5)
        assert waiting.result() == (ErrorCode.REBALANCE_IN_PROGRESS, b"")
        assert coordinator.heartbeat("g", 2, leader) is ErrorCode.UNKNOWN_MEMBER_ID
        assert coordinator.heartbeat("g", 2, follower) is ErrorCode.REBALANCE_IN_PROGRESS
        alone = await coordinator.join("g", _join(follower, rebalance_timeout_ms=5000))
        assert (alone.error, alone.generation, alone.leader) == (ErrorCode.NONE, 3, follower)

    asyncio.run(scenario())
