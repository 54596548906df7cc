"""The Kafka APIs and versions the endpoint speaks, the error codes it answers with, and request framing.

Only pre-flexible versions are advertised: every client still implements them, and each is tested (see
docs/kafka.md). Produce is advertised from version 0 although only 3 and up are handled, because librdkafka
before 2.11.1 (Debian's kcat) turns compression off when the range does not contain 0 (KAFKA-18659); older
requests are refused by closing the connection, as Kafka 4 does. The requests and responses themselves are
kafka-python's ``kafka.protocol`` classes, except Produce requests, read without copying their records
(produce_request.py).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import (
    CreateAclsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DescribeAclsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ledgerview.kafka.produce_request import ProduceRequest


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    SASL_AUTHENTICATE = 36
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47


@dataclass(frozen=True)
class VersionRange:
    advertised_min: int
    maximum: int
    handled_min: int


VERSIONS: Final = {
    ApiKey.PRODUCE: VersionRange(0, 8, 3),
    ApiKey.FETCH: VersionRange(4, 11, 4),
    ApiKey.LIST_OFFSETS: VersionRange(1, 5, 1),
    ApiKey.METADATA: VersionRange(0, 8, 0),
    ApiKey.OFFSET_COMMIT: VersionRange(2, 7, 2),
    ApiKey.OFFSET_FETCH: VersionRange(1, 5, 1),
    ApiKey.FIND_COORDINATOR: VersionRange(0, 2, 0),
    ApiKey.JOIN_GROUP: VersionRange(0, 5, 0),
    ApiKey.HEARTBEAT: VersionRange(0, 3, 0),
    ApiKey.LEAVE_GROUP: VersionRange(0, 3, 0),
    ApiKey.SYNC_GROUP: VersionRange(0, 3, 0),
    ApiKey.DESCRIBE_GROUPS: VersionRange(0, 4, 0),
    ApiKey.LIST_GROUPS: VersionRange(0, 2, 0),
    ApiKey.API_VERSIONS: VersionRange(0, 2, 0),
    ApiKey.INIT_PRODUCER_ID: VersionRange(0, 1, 0),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: VersionRange(2, 3, 2),
    ApiKey.DELETE_GROUPS: VersionRange(0, 1, 0),
    ApiKey.OFFSET_DELETE: VersionRange(0, 0, 0),
    ApiKey.SASL_HANDSHAKE: VersionRange(0, 1, 0),
    ApiKey.SASL_AUTHENTICATE: VersionRange(0, 1, 0),
    ApiKey.DESCRIBE_ACLS: VersionRange(1, 1, 1),
    ApiKey.CREATE_ACLS: VersionRange(1, 1, 1),
    ApiKey.DELETE_ACLS: VersionRange(1, 1, 1),
}
"""Per API: the range advertised in ApiVersions and the lowest version actually handled."""

REQUEST_CLASSES: Final[dict[ApiKey, Any]] = {
    ApiKey.PRODUCE: ProduceRequest,
    ApiKey.FETCH: FetchRequest,
    ApiKey.LIST_OFFSETS: ListOffsetsRequest,
    ApiKey.METADATA: MetadataRequest,
    ApiKey.OFFSET_COMMIT: OffsetCommitRequest,
    ApiKey.OFFSET_FETCH: OffsetFetchRequest,
    ApiKey.FIND_COORDINATOR: FindCoordinatorRequest,
    ApiKey.JOIN_GROUP: JoinGroupRequest,
    ApiKey.HEARTBEAT: HeartbeatRequest,
    ApiKey.LEAVE_GROUP: LeaveGroupRequest,
    ApiKey.SYNC_GROUP: SyncGroupRequest,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsRequest,
    ApiKey.LIST_GROUPS: ListGroupsRequest,
    ApiKey.API_VERSIONS: ApiVersionsRequest,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdRequest,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: OffsetForLeaderEpochRequest,
    ApiKey.DELETE_GROUPS: DeleteGroupsRequest,
    ApiKey.OFFSET_DELETE: OffsetDeleteRequest,
    ApiKey.SASL_HANDSHAKE: SaslHandshakeRequest,
    ApiKey.SASL_AUTHENTICATE: SaslAuthenticateRequest,
    ApiKey.DESCRIBE_ACLS: DescribeAclsRequest,
    ApiKey.CREATE_ACLS: CreateAclsRequest,
    ApiKey.DELETE_ACLS: DeleteAclsRequest,
}


class ErrorCode(enum.IntEnum):
    """Kafka's error codes (org.apache.kafka.common.protocol.Errors) that the endpoint answers with."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_NOT_AVAILABLE = 15
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    SECURITY_DISABLED = 54
    SASL_AUTHENTICATION_FAILED = 58
    KAFKA_STORAGE_ERROR = 56
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    UNSUPPORTED_COMPRESSION_TYPE = 76
    INVALID_RECORD = 87
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    UNKNOWN_SERVER_ERROR = -1


REQUEST_HEADER: Final = struct.Struct(">hhih")


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body_start: int
    """Where the request body starts in the frame."""


class MalformedRequestError(ValueError):
    """A frame too short for a request header."""


def read_request_header(frame: bytes | memoryview) -> RequestHeader:
    """The non-flexible request header (v1) at the start of ``frame``; parsed here so the body is never copied.

    A flexible ApiVersions probe (v3+) has a v2 header, but it is answered from the key, version and correlation
    id alone."""
    if len(frame) < REQUEST_HEADER.size:
        raise MalformedRequestError(f"a {len(frame)}-byte frame has no request header")
    api_key, version, correlation_id, client_id_length = REQUEST_HEADER.unpack_from(frame)
    start = REQUEST_HEADER.size + max(client_id_length, 0)
    client_id = str(frame[REQUEST_HEADER.size : start], "utf-8", "replace")
    return RequestHeader(api_key, version, correlation_id, client_id, start)


def supported(api_key: int, version: int) -> bool:
    """Whether a request of this key and version is handled (anything else closes the connection)."""
    if api_key not in VERSIONS:
        return False
    versions = VERSIONS[ApiKey(api_key)]
    return versions.handled_min <= version <= versions.maximum


def encode_response(response: Any, correlation_id: int) -> bytes:
    """A response object framed for the wire (size, header v0, body)."""
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))
