"""``ledgerview groups list|describe|reset-offsets|delete``: kafka-consumer-groups (and Pulsar's subscriptions,
reset-cursor and unsubscribe) for a ledgerview store; Kafka groups and ledgerview subscriptions alike
(readers/groups.py)."""

from __future__ import annotations

import argparse
import dataclasses

from ledgerview.commands.common import (
    Subparsers,
    add_command,
    iso_time_ms,
    open_existing_store,
    open_store_for_reading,
    print_json,
    print_table,
    require_topic,
    say,
)
from ledgerview.commands.compaction import utc_time
from ledgerview.errors import UsageError
from ledgerview.exit_codes import ExitCode
from readers.groups import ResetTo, delete_group, describe_group, list_groups, reset_offsets


def register(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("groups", help="list, describe, reset and delete consumer groups and "
                                                 "subscriptions",
                                  description="Consumer groups (Kafka clients of the endpoint) and ledgerview "
                                              "subscriptions: one position per partition, the same records.")
    groups = group.add_subparsers(dest="groups_command", required=True, metavar="ACTION")

    listing = add_command(groups, "list", run_list, help="every group or subscription, one per line")
    listing.add_argument("--json", action="store_true", help="one JSON array")

    describe = add_command(groups, "describe", run_describe, help="a group's positions with lag per partition")
    describe.add_argument("group")
    describe.add_argument("--json", action="store_true", help="one JSON object per partition, one per line")

    reset = add_command(groups, "reset-offsets", run_reset, help="move a group's positions on a topic",
                        description="Move a group's positions on a topic (stop its consumers first: a running "
                                    "member commits over the new positions).")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument("--partition", type=int, action="append", dest="partitions", metavar="P",
                       help="only this partition (repeatable; default: all)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log start (0 on the compacted view)")
    target.add_argument("--to-latest", action="store_true", help="the end offset")
    target.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    target.add_argument("--to-datetime", metavar="ISO", help="the first message at or after this time, e.g. "
                                                             "2026-11-24T12:00:00Z (no zone: UTC)")
    target.add_argument("--shift-by", type=int, metavar="N", help="N from the committed offset (negative: back)")
    reset.add_argument("--dry-run", action="store_true", help="print the new positions, change nothing")

    delete = add_command(groups, "delete", run_delete, help="forget a group's positions")
    delete.add_argument("group")
    delete.add_argument("--topic", action="append", dest="topics", metavar="T",
                        help="only on this topic (repeatable; Kafka's --delete-offsets)")


def run_list(args: argparse.Namespace) -> int:
    with open_store_for_reading(args) as store:
        names = list_groups(store)
    if args.json:
        print_json(names)
    else:
        for name in names:
            print(name)
    return 0


def run_describe(args: argparse.Namespace) -> int:
    """Every position, then a line for each partition whose data or position record cannot be read (exit status
    1), as kafka-consumer-groups describes a group with a partition offline."""
    with open_store_for_reading(args) as store:
        positions = describe_group(store, args.group)
    if args.json:
        for position in positions:
            print_json({**dataclasses.asdict(position), "lag": position.lag})
    else:
        print_table(["topic", "partition", "committed", "end", "lag", "view", "compacted lag", "updated (UTC)"],
                    [(p.topic, p.partition, p.committed, p.end_offset, p.lag,
                      _view_name(p.read_compacted), p.compacted_lag, utc_time(p.updated_ms))
                     for p in positions])
    unreadable = [p for p in positions if p.error is not None]
    for position in unreadable:
        unknown = "the group's position is" if position.committed is None else "its end and lag are"
        say(f"ledgerview: error: {position.topic}-{position.partition}: {unknown} unknown: {position.error}")
    return ExitCode.CHECK_FAILED if unreadable else ExitCode.OK


def _view_name(read_compacted: bool | None) -> str | None:
    return None if read_compacted is None else "compacted" if read_compacted else "raw"


def run_reset(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        require_topic(store, args.topic)
        resets = reset_offsets(store, args.group, args.topic, _reset_to(args), partitions=args.partitions,
                               dry_run=args.dry_run)
    print_table(["topic", "partition", "before", "after"], [(r.topic, r.partition, r.before, r.after) for r in resets])
    say(f"{'Would reset' if args.dry_run else 'Reset'} {args.group} on {len(resets)} partition(s) of {args.topic}"
        f"{' (dry run: nothing changed)' if args.dry_run else ''}.")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        for topic in args.topics or []:
            require_topic(store, topic)
        removed = delete_group(store, args.group, args.topics)
    if removed:
        say(f"Deleted the positions of {args.group} on {len(removed)} partition(s).")
    else:
        say(f"{args.group} has no position on {', '.join(args.topics)}: nothing was deleted.")
    return 0


def _reset_to(args: argparse.Namespace) -> ResetTo:
    if args.to_earliest:
        return ResetTo("earliest")
    if args.to_latest:
        return ResetTo("latest")
    if args.to_offset is not None:
        return ResetTo("offset", args.to_offset)
    if args.shift_by is not None:
        return ResetTo("shift-by", args.shift_by)
    try:
        return ResetTo("datetime", iso_time_ms(args.to_datetime))
    except ValueError:
        raise UsageError(f"--to-datetime {args.to_datetime!r} is not an ISO 8601 time; write it as "
                         "2026-11-24T12:00:00Z or 2026-11-24 12:00:00+01:00.") from None
