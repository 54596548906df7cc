"""CreateAcls, DescribeAcls and DeleteAcls over the data folder's ACL record (what confluent-kafka's AdminClient
and kafka-acls send), and the binding filters the ``acls`` command shares.

Describing needs DESCRIBE on the cluster, creating and deleting ALTER on it (CLUSTER_AUTHORIZATION_FAILED
otherwise); without an authorizer every one of them is SECURITY_DISABLED, as in Kafka. A binding Kafka would
refuse (a filter-only value such as ANY, a principal not ``User:``, a cluster not named kafka-cluster) is
INVALID_REQUEST with the reason, and nothing of it is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import CreateAclsResponse, DeleteAclsResponse, DescribeAclsResponse

from ledgerview.kafka.authorizer import (
    CLUSTER_NAME,
    WILDCARD,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    resource_matches,
)
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.protocol import ErrorCode
from storage.errors import LedgerviewError
from storage.security_records import AclEntry, SecurityRecord

DescribedResource = DescribeAclsResponse.DescribeAclsResource
Described = DescribedResource.AclDescription
CreationResult = CreateAclsResponse.AclCreationResult
FilterResult = DeleteAclsResponse.DeleteAclsFilterResult
MatchingAcl = FilterResult.DeleteAclsMatchingAcl


class InvalidAclError(LedgerviewError):
    """An ACL binding or filter Kafka would refuse."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        super().__init__(f"Invalid ACL {field} {value!r}: {allowed}.")


@dataclass(frozen=True)
class AclFilter:
    """Which bindings a describe or delete selects; None (or ANY) matches every value of a field."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, entry: AclEntry) -> bool:
        return (self.resource_type in (ResourceType.ANY, ResourceType[entry.resource_type])
                and self._pattern_matches(entry)
                and self.principal in (None, entry.principal) and self.host in (None, entry.host)
                and self.operation in (Operation.ANY, Operation[entry.operation])
                and self.permission in (Permission.ANY, Permission[entry.permission]))

    def _pattern_matches(self, entry: AclEntry) -> bool:
        if self.pattern_type is PatternType.MATCH:
            return self.resource_name is None or resource_matches(entry, ResourceType[entry.resource_type],
                                                                  self.resource_name)
        return (self.pattern_type in (PatternType.ANY, PatternType[entry.pattern_type])
                and self.resource_name in (None, entry.resource_name))


def acl_entry(resource_type: int, name: str, pattern_type: int, principal: str, host: str, operation: int,
              permission: int) -> AclEntry:
    """A binding from Kafka's codes; raises InvalidAclError for one Kafka would refuse."""
    kinds = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER)
    if resource_type not in {kind.value for kind in kinds}:
        raise InvalidAclError("resource type", resource_type, "TOPIC (2), GROUP (3) or CLUSTER (4)")
    if pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError("pattern type", pattern_type, "LITERAL (3) or PREFIXED (4)")
    if operation not in {item.value for item in Operation} - {Operation.ANY}:
        raise InvalidAclError("operation", operation, "an AclOperation from ALL (2) to IDEMPOTENT_WRITE (12)")
    if permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidAclError("permission type", permission, "ALLOW (3) or DENY (2)")
    if not principal.startswith("User:") or principal == "User:":
        raise InvalidAclError("principal", principal, "User:NAME, or User:* for everyone")
    if not name or (resource_type == ResourceType.CLUSTER and name != CLUSTER_NAME):
        raise InvalidAclError("resource name", name, f"a name; the cluster's is {CLUSTER_NAME}")
    return AclEntry(ResourceType(resource_type).name, name, PatternType(pattern_type).name, principal,
                    host or WILDCARD, Operation(operation).name, Permission(permission).name)


def add_acls(record: SecurityRecord[tuple[AclEntry, ...]], entries: list[AclEntry]) -> None:
    """Store ``entries`` (one already stored is kept once)."""
    record.update(lambda current: current + tuple(entry for entry in dict.fromkeys(entries) if entry not in current))


def remove_acls(record: SecurityRecord[tuple[AclEntry, ...]], filters: list[AclFilter]) -> list[list[AclEntry]]:
    """Remove every binding a filter matches; per filter, the bindings it removed."""
    removed: list[list[AclEntry]] = []

    def change(current: tuple[AclEntry, ...]) -> tuple[AclEntry, ...]:
        removed.clear()
        removed.extend([entry for entry in current if each.matches(entry)] for each in filters)
        return tuple(entry for entry in current if not any(each.matches(entry) for each in filters))

    record.update(change)
    return removed


def _filter(request_filter: Any) -> AclFilter:
    """A filter from a DescribeAcls request or a DeleteAcls filter; raises ValueError for an unknown code."""
    return AclFilter(ResourceType(request_filter.resource_type_filter), request_filter.resource_name_filter,
                     PatternType(request_filter.pattern_type_filter), request_filter.principal_filter,
                     request_filter.host_filter, Operation(request_filter.operation),
                     Permission(request_filter.permission_type))


def _refusal(broker: Broker, operation: Operation) -> tuple[ErrorCode, str] | None:
    if broker.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, "No authorizer is configured (authorizer.class.name)."
    if not broker.allowed(operation, ResourceType.CLUSTER, CLUSTER_NAME):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{operation.name} on the cluster is not allowed."
    return None


def handle_describe_acls(broker: Broker, request: Any, version: int) -> Any:
    def response(error: ErrorCode, message: str | None, resources: list[Any]) -> Any:
        return DescribeAclsResponse(version=version, throttle_time_ms=0, error_code=error.value,
                                    error_message=message, resources=resources)

    refusal = _refusal(broker, Operation.DESCRIBE)
    if refusal is not None:
        return response(*refusal, [])
    try:
        wanted = _filter(request)
    except ValueError as error:
        return response(ErrorCode.INVALID_REQUEST, str(error), [])
    assert broker.authorizer is not None
    grouped: dict[tuple[str, str, str], list[AclEntry]] = {}
    for entry in broker.authorizer.acls.read():
        if wanted.matches(entry):
            grouped.setdefault((entry.resource_type, entry.resource_name, entry.pattern_type), []).append(entry)
    resources = [DescribedResource(resource_type=ResourceType[kind].value, resource_name=name,
                                   pattern_type=PatternType[pattern].value,
                                   acls=[Described(principal=entry.principal, host=entry.host,
                                                   operation=Operation[entry.operation].value,
                                                   permission_type=Permission[entry.permission].value)
                                         for entry in entries])
                 for (kind, name, pattern), entries in grouped.items()]
    return response(ErrorCode.NONE, None, resources)


def handle_create_acls(broker: Broker, request: Any, version: int) -> Any:
    refusal = _refusal(broker, Operation.ALTER)
    results, valid = [], []
    for creation in request.creations:
        if refusal is not None:
            results.append(CreationResult(error_code=refusal[0].value, error_message=refusal[1]))
            continue
        try:
            valid.append(acl_entry(creation.resource_type, creation.resource_name, creation.resource_pattern_type,
                                   creation.principal, creation.host, creation.operation,
                                   creation.permission_type))
            results.append(CreationResult(error_code=0, error_message=None))
        except InvalidAclError as error:
            results.append(CreationResult(error_code=ErrorCode.INVALID_REQUEST.value, error_message=str(error)))
    if valid:
        assert broker.authorizer is not None
        add_acls(broker.authorizer.acls, valid)
    return CreateAclsResponse(version=version, throttle_time_ms=0, results=results)


def handle_delete_acls(broker: Broker, request: Any, version: int) -> Any:
    def result(error: ErrorCode, message: str | None, matching: list[Any]) -> Any:
        return FilterResult(error_code=error.value, error_message=message, matching_acls=matching)

    refusal = _refusal(broker, Operation.ALTER)
    if refusal is not None:
        return DeleteAclsResponse(version=version, throttle_time_ms=0,
                                  filter_results=[result(*refusal, []) for _ in request.filters])
    try:
        filters = [_filter(each) for each in request.filters]
    except ValueError as error:
        return DeleteAclsResponse(version=version, throttle_time_ms=0, filter_results=[
            result(ErrorCode.INVALID_REQUEST, str(error), []) for _ in request.filters])
    assert broker.authorizer is not None
    removed = remove_acls(broker.authorizer.acls, filters)
    results = [result(ErrorCode.NONE, None, [MatchingAcl(
        error_code=0, error_message=None, resource_type=ResourceType[entry.resource_type].value,
        resource_name=entry.resource_name, pattern_type=PatternType[entry.pattern_type].value,
        principal=entry.principal, host=entry.host, operation=Operation[entry.operation].value,
        permission_type=Permission[entry.permission].value) for entry in entries]) for entries in removed]
    return DeleteAclsResponse(version=version, throttle_time_ms=0, filter_results=results)
