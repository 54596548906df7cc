"""``ledgerview acls add|remove|list``: the Kafka endpoint's ACLs, spelled as kafka-acls spells them
(``--allow-principal User:alice --operation Read --topic T [--resource-pattern-type prefixed]``, ``--group G``,
``--cluster``). They are enforced when the endpoint runs with authorizer.class.name (docs/security.md); a running
endpoint sees a change at its next request."""

from __future__ import annotations

import argparse
import dataclasses
import re

from ledgerview.commands.common import Subparsers, add_command, existing_data_folder, print_json, print_table, say
from ledgerview.errors import UsageError
from ledgerview.kafka.acl_admin import AclFilter, InvalidAclError, acl_entry, add_acls, remove_acls
from ledgerview.kafka.authorizer import CLUSTER_NAME, Operation, PatternType, Permission, ResourceType
from storage.security_records import AclEntry, acls_record

OPERATIONS = {re.sub(r"(^|_)([a-z])", lambda m: m[2].upper(), item.name.lower()): item
              for item in Operation if item is not Operation.ANY}
"""kafka-acls' operation names (Read, Write, IdempotentWrite, All, ...)."""


def register(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("acls", help="add, remove and list the Kafka endpoint's ACLs (as kafka-acls)",
                                  description="ACLs of the Kafka endpoint, enforced with authorizer.class.name "
                                              "set; see docs/security.md.")
    acls = group.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    add = add_command(acls, "add", run_add, help="allow or deny principals operations on a resource")
    remove = add_command(acls, "remove", run_remove, help="remove the ACLs that match")
    listing = add_command(acls, "list", run_list, help="the ACLs that match (all by default)")
    for parser in (add, remove, listing):
        resource = parser.add_mutually_exclusive_group(required=parser is add)
        resource.add_argument("--topic", metavar="T", help="a topic (or, with prefixed, a prefix; * for all)")
        resource.add_argument("--group", metavar="G", help="a consumer group (or prefix; * for all)")
        resource.add_argument("--cluster", action="store_true", help="the cluster (ACL and cluster operations)")
        choices = ("literal", "prefixed") if parser is add else ("any", "match", "literal", "prefixed")
        parser.add_argument("--resource-pattern-type", choices=choices, default="literal" if parser is add else
                            "any", help="how the resource name matches (default %(default)s)")
    for parser in (add, remove):
        parser.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL",
                            help="User:NAME (a SASL user or a certificate subject) or User:*; repeatable")
        parser.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL")
        parser.add_argument("--allow-host", default="*", help="client address the entry applies to (default *)")
        parser.add_argument("--deny-host", default="*")
        parser.add_argument("--operation", action="append", default=[], choices=tuple(OPERATIONS),
                            help="repeatable" + ("" if parser is remove else "; default All"))
    listing.add_argument("--principal", help="only ACLs of this principal")
    listing.add_argument("--json", action="store_true", help="one JSON object per ACL")


def _resource(args: argparse.Namespace) -> tuple[ResourceType, str | None]:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    return ResourceType.ANY, None


def _bindings(args: argparse.Namespace) -> list[tuple[str, str, Operation | None, Permission]]:
    """(principal, host, operation or None for any, permission) of every --allow/--deny-principal x
    --operation."""
    operations: list[Operation | None] = [OPERATIONS[name] for name in args.operation] or [None]
    return [(principal, host, operation, permission)
            for principals, host, permission in ((args.allow_principal, args.allow_host, Permission.ALLOW),
                                                 (args.deny_principal, args.deny_host, Permission.DENY))
            for principal in principals for operation in operations]


def run_add(args: argparse.Namespace) -> int:
    if not args.allow_principal and not args.deny_principal:
        raise UsageError("Give --allow-principal or --deny-principal (User:NAME, or User:* for everyone).")
    kind, name = _resource(args)
    assert name is not None
    pattern = PatternType[args.resource_pattern_type.upper()]
    try:
        entries = [acl_entry(kind, name, pattern, principal, host, operation or Operation.ALL, permission)
                   for principal, host, operation, permission in _bindings(args)]
    except InvalidAclError as error:
        raise UsageError(str(error)) from None
    add_acls(acls_record(existing_data_folder(args)), entries)
    for entry in entries:
        say(f"Added ACL {_described(entry)}")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    kind, name = _resource(args)
    pattern = PatternType[args.resource_pattern_type.upper()]
    bindings = _bindings(args)
    if kind is ResourceType.ANY and not bindings:
        raise UsageError("Say which ACLs to remove: a --topic, --group or --cluster, and/or principals.")
    filters = [AclFilter(kind, name, pattern, principal, host, operation or Operation.ANY, permission)
               for principal, host, operation, permission in bindings] or [AclFilter(kind, name, pattern)]
    removed = remove_acls(acls_record(existing_data_folder(args)), filters)
    entries = list(dict.fromkeys(entry for matched in removed for entry in matched))
    for entry in entries:
        say(f"Removed ACL {_described(entry)}")
    if not entries:
        say("No ACL matched; nothing removed.")
    return 0


def run_list(args: argparse.Namespace) -> int:
    kind, name = _resource(args)
    wanted = AclFilter(kind, name, PatternType[args.resource_pattern_type.upper()], args.principal)
    entries = [entry for entry in acls_record(existing_data_folder(args)).read() if wanted.matches(entry)]
    if args.json:
        for entry in entries:
            print_json(dataclasses.asdict(entry))
    else:
        print_table(("RESOURCE_TYPE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"),
                    [(entry.resource_type, entry.resource_name, entry.pattern_type, entry.principal, entry.host,
                      entry.operation, entry.permission) for entry in entries])
    return 0


def _described(entry: AclEntry) -> str:
    return (f"ResourcePattern(resourceType={entry.resource_type}, name={entry.resource_name}, "
            f"patternType={entry.pattern_type}): (principal={entry.principal}, host={entry.host}, "
            f"operation={entry.operation}, permissionType={entry.permission})")
