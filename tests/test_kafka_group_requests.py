"""Group requests a well-behaved client does not send, or sends at the wrong time, against the real endpoint as raw
frames (kafka-python's protocol classes): the coordinator answers each with Kafka's error and stays sound for the
group's other members."""

from __future__ import annotations

import asyncio
import select
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from ledgerview.kafka import EndpointOptions, KafkaEndpoint
from ledgerview.kafka.broker_config import BrokerConfigError, endpoint_options
from ledgerview.kafka.coordinator import GroupCoordinator, JoinRequest
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.service.config import parse_service_config
from storage import Store
from storage.cursors import read_subscription_cursor
from storage.files import partition_folder, subscription_file
from tests.kafka_support import RawClient, Running, kafka, wait_for

__all__ = ["kafka"]

JOIN_VERSION = 2
"""Before KIP-394: a join without a member id enters the group at once."""


@pytest.fixture
def clients(kafka: Running) -> Iterator[list[RawClient]]:
    """Four raw connections to the endpoint, closed after the test."""
    opened = [RawClient(kafka.bootstrap) for _ in range(4)]
    yield opened
    for client in opened:
        client.close()


def join_request(group: str, protocols: list[str], *, member_id: str = "", session_timeout_ms: int = 10_000,
                 rebalance_timeout_ms: int = 60_000) -> JoinGroupRequest:
    return JoinGroupRequest(group_id=group, session_timeout_ms=session_timeout_ms,
                            rebalance_timeout_ms=rebalance_timeout_ms, member_id=member_id, protocol_type="consumer",
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name=name, metadata=b"m")
                                       for name in protocols])


def send(client: RawClient, request: Any, version: int) -> None:
    """Send a request without waiting for its response (``receive`` reads it)."""
    client.correlation_id += 1
    request.with_header(correlation_id=client.correlation_id, client_id="test")
    client.send_frame(bytes(request.encode(version=version, header=True, framed=True)))


def receive(client: RawClient, response_class: Any, version: int) -> Any:
    return response_class.decode(client.read_frame(), version=version, header=True)


def answered(client: RawClient) -> bool:
    """Whether a response waits to be read on the connection."""
    return bool(select.select([client.socket], [], [], 0)[0])


def describe(client: RawClient, group: str) -> Any:
    return client.request(DescribeGroupsRequest(groups=[group]), DescribeGroupsResponse, 0).groups[0]


def sync(client: RawClient, group: str, generation: int, member_id: str,
         assignments: dict[str, bytes] | None = None) -> Any:
    wanted = [SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=assignment)
              for member, assignment in (assignments or {}).items()]
    return client.request(SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                           assignments=wanted), SyncGroupResponse, 1)


def test_a_member_sharing_no_protocol_with_every_member_is_refused(kafka: Running, clients: list[RawClient]) -> None:
    """Each protocol the third member offers is another member's, but none is both's: it gets
    INCONSISTENT_GROUP_PROTOCOL at once, as in Kafka. It was let in, and the barrier's close found no protocol for
    the group and raised: the connection whose rejoin closed it was dropped and the other joins never answered (and a
    barrier closed by its deadline ended the timer that expires every group's members)."""
    first, second, third, observer = clients
    leader = first.request(join_request("g", ["x", "y"]), JoinGroupResponse, JOIN_VERSION)
    assert (leader.error_code, leader.generation_id) == (ErrorCode.NONE, 1)
    send(second, join_request("g", ["y", "z"]), JOIN_VERSION)  # a rebalance, waiting for the first to rejoin
    send(third, join_request("g", ["x", "z"]), JOIN_VERSION)
    wait_for(lambda: answered(third) or len(describe(observer, "g").members) == 3, "the third join to be handled")
    rejoined = first.request(join_request("g", ["x", "y"], member_id=leader.member_id), JoinGroupResponse,
                             JOIN_VERSION)
    assert (rejoined.error_code, rejoined.generation_id, rejoined.protocol_name) == (ErrorCode.NONE, 2, "y")
    assert len(rejoined.members) == 2
    assert receive(third, JoinGroupResponse, JOIN_VERSION).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    follower = receive(second, JoinGroupResponse, JOIN_VERSION)
    assert (follower.error_code, follower.generation_id, follower.leader) == (ErrorCode.NONE, 2, leader.member_id)


def test_a_session_timeout_outside_the_group_bounds_is_refused(clients: list[RawClient]) -> None:
    """Kafka's group.min.session.timeout.ms and group.max.session.timeout.ms, 6 s and 30 min by default. Any positive
    session timeout was taken, so a member that asked 2**31 - 1 ms and went silent kept its partitions from the rest
    of its group for 24 days."""
    client = clients[0]
    for timeout in (5999, 1_800_001, 2**31 - 1, 0):
        refused = client.request(join_request(f"g{timeout}", ["range"], session_timeout_ms=timeout),
                                 JoinGroupResponse, JOIN_VERSION)
        assert refused.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    for timeout in (6000, 1_800_000):
        joined = client.request(join_request(f"g{timeout}", ["range"], session_timeout_ms=timeout),
                                JoinGroupResponse, JOIN_VERSION)
        assert (joined.error_code, joined.generation_id) == (ErrorCode.NONE, 1)


def test_the_session_bounds_are_broker_properties(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Store.open(data).close()
    options = endpoint_options({"group.min.session.timeout.ms": "100", "group.max.session.timeout.ms": "1000"},
                               "server.properties", EndpointOptions(port=0))
    with KafkaEndpoint(data, options=options) as endpoint:
        client = RawClient(f"127.0.0.1:{endpoint.port}")
        try:
            codes = [client.request(join_request(f"g{timeout}", ["range"], session_timeout_ms=timeout),
                                    JoinGroupResponse, JOIN_VERSION).error_code for timeout in (99, 100, 1000, 1001)]
        finally:
            client.close()
    assert codes == [ErrorCode.INVALID_SESSION_TIMEOUT, ErrorCode.NONE, ErrorCode.NONE,
                     ErrorCode.INVALID_SESSION_TIMEOUT]
    service = parse_service_config({"kafka": {"group": {"max": {"session": {"timeout": {"ms": 60000}}}}}}, "s.toml")
    assert service.kafka.endpoint_options().group_max_session_timeout_ms == 60000
    with pytest.raises(BrokerConfigError, match=r"group.max.session.timeout.ms: 0 is below 1"):
        endpoint_options({"group.max.session.timeout.ms": "0"}, "server.properties", EndpointOptions())
    with pytest.raises(ValueError, match="no session timeout would be accepted"):
        EndpointOptions(group_min_session_timeout_ms=2000, group_max_session_timeout_ms=1000)


def commit(client: RawClient, offset: int, generation: int, member_id: str) -> int:
    """The error code of committing ``offset`` on t-0 for group g."""
    partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=offset, committed_metadata="")
    topic = OffsetCommitRequest.OffsetCommitRequestTopic(name="t", partitions=[partition])
    request = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=generation, member_id=member_id,
                                  retention_time_ms=-1, topics=[topic])
    return int(client.request(request, OffsetCommitResponse, 2).topics[0].partitions[0].error_code)


def committed(kafka: Running) -> int | None:
    cursor = read_subscription_cursor(partition_folder(kafka.store.root, "t", 0), "g", 0)
    return None if cursor is None else cursor.acked_offset


def test_a_commit_outside_the_generation_is_refused_while_the_group_has_members(
        kafka: Running, clients: list[RawClient]) -> None:
    """As Kafka: a commit without member id and generation (an assign-only consumer's, an admin tool's alter) is
    taken only while the group has no member, and a member's only once its rebalance is complete. Both were stored:
    anyone could overwrite the positions of a group at work, and a member could commit between its JoinGroup and its
    SyncGroup, for partitions the new assignment may give another."""
    kafka.store.create_topic("t", partitions=1)
    member, stranger = clients[:2]
    joined = member.request(join_request("g", ["range"]), JoinGroupResponse, JOIN_VERSION)
    assert commit(member, 5, joined.generation_id, joined.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert sync(member, "g", joined.generation_id, joined.member_id).error_code == ErrorCode.NONE
    assert commit(member, 5, joined.generation_id, joined.member_id) == ErrorCode.NONE
    assert commit(stranger, 99, -1, "") == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit(stranger, 99, joined.generation_id + 1, joined.member_id) == ErrorCode.ILLEGAL_GENERATION
    assert committed(kafka) == 5
    left = member.request(LeaveGroupRequest(group_id="g", member_id=joined.member_id), LeaveGroupResponse, 0)
    assert left.error_code == ErrorCode.NONE
    assert commit(stranger, 99, -1, "") == ErrorCode.NONE  # no member now: the positions are the operator's
    assert committed(kafka) == 99


def test_describe_groups_names_the_rebalance_state(clients: list[RawClient]) -> None:
    """A group whose members have joined and wait for the leader's SyncGroup is CompletingRebalance, as Kafka says;
    it was described as PreparingRebalance, which sends an operator to look for a member that has not rejoined."""
    first, second, _, observer = clients
    leader = first.request(join_request("g", ["range"]), JoinGroupResponse, JOIN_VERSION)
    assert describe(observer, "g").group_state == "CompletingRebalance"
    assert sync(first, "g", 1, leader.member_id, {leader.member_id: b"a"}).error_code == ErrorCode.NONE
    assert describe(observer, "g").group_state == "Stable"
    send(second, join_request("g", ["range"]), JOIN_VERSION)
    wait_for(lambda: describe(observer, "g").group_state == "PreparingRebalance", "the rebalance to start")


def test_a_commit_that_cannot_be_written_is_a_storage_error(kafka: Running, clients: list[RawClient]) -> None:
    """A group's record that cannot be written or read (a full disk, a damaged data folder, a partition folder gone
    after its topic was looked up because another process deleted the topic): the OSError closed the client's
    connection, and a consumer committing every few seconds reconnected and failed again. It is KAFKA_STORAGE_ERROR
    for that partition, as a produce that cannot be written is, and the connection serves on."""
    kafka.store.create_topic("t", partitions=1)
    client = clients[0]
    record = subscription_file(partition_folder(kafka.store.root, "t", 0), "g")
    record.mkdir(parents=True)  # a directory where the record belongs: neither written nor read
    assert commit(client, 5, -1, "") == ErrorCode.KAFKA_STORAGE_ERROR
    fetch = OffsetFetchRequest(group_id="g", topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name="t",
                                                                                            partition_indexes=[0])])
    fetched = client.request(fetch, OffsetFetchResponse, 1).topics[0].partitions[0]
    assert (fetched.committed_offset, fetched.error_code) == (-1, ErrorCode.KAFKA_STORAGE_ERROR)
    shutil.rmtree(partition_folder(kafka.store.root, "t", 0))
    assert commit(client, 5, -1, "") == ErrorCode.KAFKA_STORAGE_ERROR
    assert describe(client, "g").error_code == ErrorCode.NONE


def test_an_invalid_group_id_is_refused_by_every_group_request(clients: list[RawClient]) -> None:
    """As JoinGroup and OffsetCommit already did, and Kafka does: SyncGroup, Heartbeat and LeaveGroup naming a group
    id no group can have answer INVALID_GROUP_ID; they answered UNKNOWN_MEMBER_ID, as for a member gone."""
    client = clients[0]
    for group_id in ("", "bad/name", "x" * 300):
        heartbeat = client.request(HeartbeatRequest(group_id=group_id, generation_id=1, member_id="m"),
                                   HeartbeatResponse, 0)
        synced = client.request(SyncGroupRequest(group_id=group_id, generation_id=1, member_id="m", assignments=[]),
                                SyncGroupResponse, 0)
        left = client.request(LeaveGroupRequest(group_id=group_id, member_id="m"), LeaveGroupResponse, 0)
        assert [heartbeat.error_code, synced.error_code, left.error_code] == [ErrorCode.INVALID_GROUP_ID] * 3


def test_a_join_without_member_id_is_answered_member_id_required(clients: list[RawClient]) -> None:
    """KIP-394, from JoinGroup version 4: a join without a member id is answered MEMBER_ID_REQUIRED with a member id
    and makes no member (the group stays empty, no rebalance starts); the join with that id enters the group. It
    entered at once and waited at the barrier, so anonymous joins held members and connections as long as the
    rebalance timeout they asked. A member id nobody was given stays UNKNOWN_MEMBER_ID, and a pending id's
    LeaveGroup drops it."""
    client, observer = clients[0], clients[1]
    for version in (4, 5):
        required = client.request(join_request(f"v{version}", ["range"]), JoinGroupResponse, version)
        assert (required.error_code, required.generation_id) == (ErrorCode.MEMBER_ID_REQUIRED, -1)
        assert required.member_id and describe(observer, f"v{version}").members == []
        joined = client.request(join_request(f"v{version}", ["range"], member_id=required.member_id),
                                JoinGroupResponse, version)
        assert (joined.error_code, joined.generation_id, joined.member_id, joined.leader) == (
            ErrorCode.NONE, 1, required.member_id, required.member_id)
    unknown = client.request(join_request("v5", ["range"], member_id="member-made-up"), JoinGroupResponse, 5)
    assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    left = client.request(join_request("gone", ["range"]), JoinGroupResponse, 5)
    leave = client.request(LeaveGroupRequest(group_id="gone", member_id=left.member_id), LeaveGroupResponse, 0)
    assert leave.error_code == ErrorCode.NONE
    again = client.request(join_request("gone", ["range"], member_id=left.member_id), JoinGroupResponse, 5)
    assert again.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_pending_member_id_is_dropped_after_its_session_timeout() -> None:
    """The state machine alone, on its own clock: a member id given with MEMBER_ID_REQUIRED is kept for the session
    timeout of the join that got it, and a join with it after that is UNKNOWN_MEMBER_ID."""
    async def scenario() -> None:
        now = [0.0]
        coordinator = GroupCoordinator(lambda: now[0])

        def request(member_id: str = "") -> JoinRequest:
            return JoinRequest(member_id, 6000, 60_000, "consumer", [("range", b"m")], require_member_id=True)

        late = await coordinator.join("g", request())
        now[0] = 1.0
        on_time = await coordinator.join("g", request())
        assert late.error is on_time.error is ErrorCode.MEMBER_ID_REQUIRED and "g" not in coordinator.groups
        now[0] = 6.5
        coordinator.expire()
        joined = await coordinator.join("g", request(on_time.member_id))
        assert (joined.error, joined.generation) == (ErrorCode.NONE, 1)
        assert (await coordinator.join("g", request(late.member_id))).error is ErrorCode.UNKNOWN_MEMBER_ID
        assert coordinator.pending == {}
        assert await coordinator.sync("g", 1, joined.member_id, {}) == (ErrorCode.NONE, b"")
        newcomer = await coordinator.join("g", request())
        rejoin = asyncio.ensure_future(coordinator.join("g", request(joined.member_id)))  # the leader's: a rebalance
        await asyncio.sleep(0)
        assert not rejoin.done()  # the barrier waits for the pending id
        now[0] = 12.6
        coordinator.expire()  # which expires: the barrier closes without it
        assert ((await rejoin).error, (await rejoin).generation, len((await rejoin).members)) == (ErrorCode.NONE, 2, 1)
        assert newcomer.error is ErrorCode.MEMBER_ID_REQUIRED and coordinator.pending == {}

    asyncio.run(scenario())


def test_group_max_size_refuses_a_join_past_it(tmp_path: Path) -> None:
    """Kafka's group.max.size (a broker property; Int.MaxValue by default): with 2, a third member is refused
    GROUP_MAX_SIZE_REACHED, whether it asks for a member id or joins with one it was given while the group had room
    (and that id is then dropped). Any number of members could join."""
    data = tmp_path / "data"
    Store.open(data).close()
    options = endpoint_options({"group.max.size": "2"}, "server.properties", EndpointOptions(port=0))
    with KafkaEndpoint(data, options=options) as endpoint:
        first, second, third, observer = (RawClient(f"127.0.0.1:{endpoint.port}") for _ in range(4))
        try:
            leader = first.request(join_request("g", ["range"], member_id=first.request(
                join_request("g", ["range"]), JoinGroupResponse, 5).member_id), JoinGroupResponse, 5)
            assert sync(first, "g", 1, leader.member_id).error_code == ErrorCode.NONE
            second_id, third_id = (client.request(join_request("g", ["range"]), JoinGroupResponse, 5).member_id
                                   for client in (second, third))
            send(first, join_request("g", ["range"], member_id=leader.member_id), 5)  # the leader's: a rebalance
            wait_for(lambda: describe(observer, "g").group_state == "PreparingRebalance", "the leader's rejoin")
            send(second, join_request("g", ["range"], member_id=second_id), 5)
            wait_for(lambda: len(describe(observer, "g").members) == 2, "the second member's join")
            refused = third.request(join_request("g", ["range"], member_id=third_id), JoinGroupResponse, 5)
            assert (refused.error_code, refused.member_id) == (ErrorCode.GROUP_MAX_SIZE_REACHED, "")
            rejoined = receive(first, JoinGroupResponse, 5)  # the barrier waited for the third's id, now dropped
            assert (rejoined.error_code, rejoined.generation_id, len(rejoined.members)) == (ErrorCode.NONE, 2, 2)
            assert receive(second, JoinGroupResponse, 5).generation_id == 2
            codes = [third.request(join_request("g", ["range"], member_id=member_id), JoinGroupResponse,
                                   version).error_code for member_id, version in (("", 5), ("", 2), (third_id, 5))]
            assert codes == [ErrorCode.GROUP_MAX_SIZE_REACHED] * 3
            assert len(describe(observer, "g").members) == 2
        finally:
            for client in (first, second, third, observer):
                client.close()
    service = parse_service_config({"kafka": {"group": {"max": {"size": 5}}}}, "s.toml")
    assert service.kafka.endpoint_options().group_max_size == 5
    assert EndpointOptions().group_max_size == 2**31 - 1
    with pytest.raises(BrokerConfigError, match=r"group.max.size: 0 is below 1"):
        endpoint_options({"group.max.size": "0"}, "server.properties", EndpointOptions())


def test_the_barrier_waits_for_a_pending_member(clients: list[RawClient]) -> None:
    """As Kafka's hasAllMembersJoined: a rebalance does not close while a member id given with MEMBER_ID_REQUIRED
    is pending, so the member that joins with it is in the next generation instead of starting another rebalance.
    It closed at once with the members already in."""
    first, second, observer = clients[0], clients[1], clients[2]
    first_id = first.request(join_request("g", ["range"]), JoinGroupResponse, 5).member_id
    leader = first.request(join_request("g", ["range"], member_id=first_id), JoinGroupResponse, 5)
    assert sync(first, "g", 1, first_id, {first_id: b"a"}).error_code == ErrorCode.NONE
    second_id = second.request(join_request("g", ["range"]), JoinGroupResponse, 5).member_id
    send(first, join_request("g", ["range"], member_id=leader.member_id), 5)  # the leader's rejoin rebalances
    wait_for(lambda: describe(observer, "g").group_state == "PreparingRebalance", "the leader's rejoin")
    joined = second.request(join_request("g", ["range"], member_id=second_id), JoinGroupResponse, 5)
    rejoined = receive(first, JoinGroupResponse, 5)
    assert (joined.error_code, joined.generation_id, rejoined.generation_id) == (ErrorCode.NONE, 2, 2)
    assert sorted(member.member_id for member in rejoined.members) == sorted([first_id, second_id])
