"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup: the wire side of the group coordinator
(ledgerview/kafka/coordinator.py holds the state machine).

A group id must follow the subscription-name rules (storage/cursors.py), because its committed offsets are the
subscription cursor records of the same name: a ledgerview Consumer of that subscription sees them too.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse, SyncGroupResponse

from ledgerview.kafka.authorizer import Operation, ResourceType
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.coordinator import JoinRequest
from ledgerview.kafka.protocol import ErrorCode
from storage.cursors import InvalidSubscriptionNameError, validate_subscription_name


def valid_group_id(group_id: object) -> bool:
    try:
        validate_subscription_name(group_id)
    except InvalidSubscriptionNameError:
        return False
    return True


def may_read(broker: Broker, group_id: str) -> bool:
    """Whether the principal may READ the group: what joining, syncing, heartbeats and leaving need."""
    return broker.allowed(Operation.READ, ResourceType.GROUP, group_id)


def refused(broker: Broker, group_id: str) -> ErrorCode | None:
    """INVALID_GROUP_ID or GROUP_AUTHORIZATION_FAILED when a SyncGroup, Heartbeat or LeaveGroup may not name
    ``group_id``, as a JoinGroup may not; else None."""
    if not valid_group_id(group_id):
        return ErrorCode.INVALID_GROUP_ID
    return None if may_read(broker, group_id) else ErrorCode.GROUP_AUTHORIZATION_FAILED


async def handle_join_group(broker: Broker, request: Any, version: int) -> Any:
    def response(error: ErrorCode, **fields: Any) -> Any:
        return JoinGroupResponse(version=version, throttle_time_ms=0, error_code=error.value, **fields)

    if not valid_group_id(request.group_id):
        return response(ErrorCode.INVALID_GROUP_ID, generation_id=-1, protocol_name="", leader="",
                        member_id=request.member_id, members=[])
    if not may_read(broker, request.group_id):
        return response(ErrorCode.GROUP_AUTHORIZATION_FAILED, generation_id=-1, protocol_name="", leader="",
                        member_id=request.member_id, members=[])
    options = broker.options
    if not options.group_min_session_timeout_ms <= request.session_timeout_ms <= options.group_max_session_timeout_ms:
        return response(ErrorCode.INVALID_SESSION_TIMEOUT, generation_id=-1, protocol_name="", leader="",
                        member_id=request.member_id, members=[])
    rebalance_timeout_ms = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
    join = JoinRequest(request.member_id, request.session_timeout_ms, rebalance_timeout_ms,
                       request.protocol_type, [(p.name, bytes(p.metadata)) for p in request.protocols],
                       require_member_id=version >= 4)
    result = await broker.coordinator.join(request.group_id, join, max_size=options.group_max_size)
    member = JoinGroupResponse.JoinGroupResponseMember
    return response(result.error, generation_id=result.generation, protocol_name=result.protocol,
                    leader=result.leader, member_id=result.member_id,
                    members=[member(member_id=member_id, group_instance_id=None, metadata=metadata)
                             for member_id, metadata in result.members])


async def handle_sync_group(broker: Broker, request: Any, version: int) -> Any:
    if (error := refused(broker, request.group_id)) is not None:
        return SyncGroupResponse(version=version, throttle_time_ms=0, error_code=error.value, assignment=b"")
    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
    error, assignment = await broker.coordinator.sync(request.group_id, request.generation_id, request.member_id,
                                                      assignments)
    return SyncGroupResponse(version=version, throttle_time_ms=0, error_code=error.value, assignment=assignment)


def handle_heartbeat(broker: Broker, request: Any, version: int) -> Any:
    error = refused(broker, request.group_id)
    if error is None:
        error = broker.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id)
    return HeartbeatResponse(version=version, throttle_time_ms=0, error_code=error.value)


def handle_leave_group(broker: Broker, request: Any, version: int) -> Any:
    member_ids = [request.member_id] if version < 3 else [m.member_id for m in request.members]
    if (error := refused(broker, request.group_id)) is not None:
        return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=error.value, members=[])
    errors = broker.coordinator.leave(request.group_id, member_ids)
    member = LeaveGroupResponse.MemberResponse
    members = [member(member_id=member_id, group_instance_id=None, error_code=error.value)
               for member_id, error in zip(member_ids, errors, strict=True)]
    top = errors[0] if version < 3 else ErrorCode.NONE
    return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=top.value, members=members)
