"""ACL decisions as Kafka's StandardAuthorizer makes them, over the data folder's ACL record.

For a principal, a client host, an operation and a resource (type and name):

1. A super user (super.users) is allowed everything.
2. The ACLs that match the resource: same type, and a LITERAL name equal to it or ``*``, or a PREFIXED name it
   starts with. None: allowed only with allow.everyone.if.no.acl.found.
3. Of those, the ones for this principal (or ``User:*``) and host (or ``*``): a DENY of the operation (or of ALL)
   refuses; else an ALLOW of the operation, of ALL, or of an operation that implies it allows (DESCRIBE is implied
   by READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS by ALTER_CONFIGS). Anything else is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from ledgerview.kafka.security_options import SecurityOptions
from storage.security_records import AclEntry, SecurityRecord, acls_record

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
ANONYMOUS = "User:ANONYMOUS"


class ResourceType(enum.IntEnum):
    """Kafka's ResourceType codes (ANY only in filters)."""

    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4


class PatternType(enum.IntEnum):
    """Kafka's PatternType codes (ANY and MATCH only in filters)."""

    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    """Kafka's AclOperation codes (ANY only in filters)."""

    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(enum.IntEnum):
    """Kafka's AclPermissionType codes (ANY only in filters)."""

    ANY = 1
    DENY = 2
    ALLOW = 3


IMPLIED_BY = {
    Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
    Operation.DESCRIBE_CONFIGS: {Operation.ALTER_CONFIGS},
}


@dataclass(frozen=True)
class Session:
    """Who sent a request: the authenticated principal and the client's address."""

    principal: str = ANONYMOUS
    host: str = ""


def resource_matches(entry: AclEntry, resource_type: ResourceType, name: str) -> bool:
    if entry.resource_type != resource_type.name:
        return False
    if entry.pattern_type == PatternType.PREFIXED.name:
        return name.startswith(entry.resource_name)
    return entry.resource_name in (name, WILDCARD)


def _applies(entry: AclEntry, session: Session) -> bool:
    return entry.principal in (session.principal, "User:*") and entry.host in (session.host, WILDCARD)


class Authorizer:
    """Decides requests against the ACLs of the data folder ``root`` (read again whenever they change)."""

    def __init__(self, root: Path, security: SecurityOptions) -> None:
        self.acls: SecurityRecord[tuple[AclEntry, ...]] = acls_record(root)
        self._super_users = frozenset(security.super_users)
        self._allow_everyone = security.allow_everyone_if_no_acl_found

    def authorize(self, session: Session, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if session.principal in self._super_users:
            return True
        matching = [entry for entry in self.acls.read() if resource_matches(entry, resource_type, name)]
        if not matching:
            return self._allow_everyone
        return self._decide([entry for entry in matching if _applies(entry, session)], operation)

    def authorize_any(self, session: Session, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some resource of the type allows ``operation`` (Kafka's authorizeByResourceType: an idempotent
        producer needs WRITE on some topic)."""
        if session.principal in self._super_users:
            return True
        entries = [entry for entry in self.acls.read() if entry.resource_type == resource_type.name
                   and _applies(entry, session)]
        return self._decide(entries, operation) or (self._allow_everyone and not entries)

    @staticmethod
    def _decide(entries: list[AclEntry], operation: Operation) -> bool:
        names = {operation.name, Operation.ALL.name}
        if any(entry.permission == Permission.DENY.name and entry.operation in names for entry in entries):
            return False
        names |= {implying.name for implying in IMPLIED_BY.get(operation, ())}
        return any(entry.permission == Permission.ALLOW.name and entry.operation in names for entry in entries)
