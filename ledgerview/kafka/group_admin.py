"""ListGroups, DescribeGroups, DeleteGroups and OffsetDelete: what Kafka's admin tools and confluent-kafka's
AdminClient ask about groups (list_consumer_groups, describe_consumer_groups, delete_consumer_groups).

A group is known when it has members here now or committed positions on disk (readers/groups.py: Kafka groups
and ledgerview subscriptions are the same records), so a group whose consumers stopped is still listed, EMPTY,
as Kafka lists it. As in Kafka, a group with members cannot be deleted (NON_EMPTY_GROUP) and a group's offsets on
a topic it is subscribed to now cannot be deleted (GROUP_SUBSCRIBED_TO_TOPIC is not told apart here: any member
makes the group non-empty).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteGroupsResponse, DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import OffsetDeleteResponse

from ledgerview.kafka.authorizer import CLUSTER_NAME, Operation, ResourceType
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.coordinator import Group
from ledgerview.kafka.groups import valid_group_id
from ledgerview.kafka.offsets import resolve_partition
from ledgerview.kafka.protocol import ErrorCode
from readers.groups import list_groups
from storage.cursors import remove_subscription_cursor
from storage.files import partition_folder

CONSUMER_PROTOCOL = "consumer"
ListedGroup = ListGroupsResponse.ListedGroup
DescribedGroup = DescribeGroupsResponse.DescribedGroup
DescribedMember = DescribedGroup.DescribedGroupMember
DeletedGroup = DeleteGroupsResponse.DeletableGroupResult
DeletedTopic = OffsetDeleteResponse.OffsetDeleteResponseTopic
DeletedPartition = DeletedTopic.OffsetDeleteResponsePartition


def handle_list_groups(broker: Broker, request: Any, version: int) -> Any:
    live = {group_id: group for group_id, group in broker.coordinator.groups.items() if group.members}
    names = sorted(set(live) | set(list_groups(broker.store)))
    if not broker.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        names = [name for name in names if broker.allowed(Operation.DESCRIBE, ResourceType.GROUP, name)]
    groups = [ListedGroup(group_id=name, protocol_type=live[name].protocol_type or CONSUMER_PROTOCOL
                          if name in live else CONSUMER_PROTOCOL) for name in names]
    return ListGroupsResponse(version=version, throttle_time_ms=0, error_code=0, groups=groups)


def handle_describe_groups(broker: Broker, request: Any, version: int) -> Any:
    known = set(list_groups(broker.store))
    described = []
    for group_id in request.groups:
        group = broker.coordinator.groups.get(group_id)
        if not valid_group_id(group_id):
            described.append(_described(group_id, ErrorCode.INVALID_GROUP_ID, "Dead"))
        elif not broker.allowed(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            described.append(_described(group_id, ErrorCode.GROUP_AUTHORIZATION_FAILED, ""))
        elif group is not None and group.members:
            described.append(_live(group))
        else:
            described.append(_described(group_id, ErrorCode.NONE, "Empty" if group_id in known else "Dead"))
    return DescribeGroupsResponse(version=version, throttle_time_ms=0, groups=described)


def _live(group: Group) -> Any:
    members = [DescribedMember(member_id=member.member_id, client_id="", client_host="",
                               member_metadata=dict(member.request.protocols).get(group.protocol or "", b""),
                               member_assignment=member.assignment)
               for member in group.members.values()]
    return DescribedGroup(error_code=0, group_id=group.group_id, group_state=group.state.value,
                          protocol_type=group.protocol_type or CONSUMER_PROTOCOL, protocol_data=group.protocol or "",
                          members=members)


def _described(group_id: str, error: ErrorCode, state: str) -> Any:
    return DescribedGroup(error_code=error.value, group_id=group_id, group_state=state,
                          protocol_type=CONSUMER_PROTOCOL if state == "Empty" else "", protocol_data="", members=[])


def handle_delete_groups(broker: Broker, request: Any, version: int) -> Any:
    known = set(list_groups(broker.store))
    results = []
    for group_id in request.groups_names:
        results.append(DeletedGroup(group_id=group_id, error_code=_delete_group(broker, group_id, known).value))
    return DeleteGroupsResponse(version=version, throttle_time_ms=0, results=results)


def _delete_group(broker: Broker, group_id: str, known: set[str]) -> ErrorCode:
    if not valid_group_id(group_id):
        return ErrorCode.INVALID_GROUP_ID
    if not broker.allowed(Operation.DELETE, ResourceType.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    group = broker.coordinator.groups.get(group_id)
    if group is not None and group.members:
        return ErrorCode.NON_EMPTY_GROUP
    if group_id not in known:
        return ErrorCode.GROUP_ID_NOT_FOUND
    for topic in broker.store.list_topics():
        for partition in range(broker.store.topic_metadata(topic).partitions):
            remove_subscription_cursor(partition_folder(broker.store.root, topic, partition), group_id)
    broker.coordinator.groups.pop(group_id, None)
    return ErrorCode.NONE


def handle_offset_delete(broker: Broker, request: Any, version: int) -> Any:
    group_id = request.group_id
    group = broker.coordinator.groups.get(group_id)
    if not valid_group_id(group_id):
        return OffsetDeleteResponse(version=version, error_code=ErrorCode.INVALID_GROUP_ID.value, throttle_time_ms=0,
                                    topics=[])
    if not broker.allowed(Operation.DELETE, ResourceType.GROUP, group_id):
        return OffsetDeleteResponse(version=version, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED.value,
                                    throttle_time_ms=0, topics=[])
    if group is not None and group.members:
        return OffsetDeleteResponse(version=version, error_code=ErrorCode.NON_EMPTY_GROUP.value, throttle_time_ms=0,
                                    topics=[])
    topics = []
    for topic in request.topics:
        partitions = [DeletedPartition(partition_index=wanted.partition_index,
                                       error_code=_delete_offset(broker, group_id, topic.name,
                                                                 wanted.partition_index).value)
                      for wanted in topic.partitions]
        topics.append(DeletedTopic(name=topic.name, partitions=partitions))
    return OffsetDeleteResponse(version=version, error_code=0, throttle_time_ms=0, topics=topics)


def _delete_offset(broker: Broker, group_id: str, name: str, partition: int) -> ErrorCode:
    view = resolve_partition(broker, name, partition, Operation.READ)
    if isinstance(view, ErrorCode):
        return view
    folder = partition_folder(broker.store.root, view.topic, partition)  # the cursor records'; the log is not opened
    remove_subscription_cursor(folder, group_id)
    return ErrorCode.NONE
