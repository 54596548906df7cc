"""``ledgerview retention`` and ``delete-records``: Kafka's retention pass and kafka-delete-records."""

from __future__ import annotations

import argparse

from ledgerview.commands.common import Subparsers, add_command, open_existing_store, print_json, print_table, say
from storage.errors import LedgerviewError
from storage.retention import LOCAL_REASONS, DeletedSegment

RETENTION_DESCRIPTION = """Run retention now: delete the oldest segments past retention.ms or retention.bytes (topics
whose cleanup.policy includes delete) or below the log start offset, never raw data that two-phase compaction still
has to read. Deleted files are renamed .deleted and removed after file.delete.delay.ms.

For topics with remote.storage.enable=true, retention.ms and retention.bytes expire the whole log on both tiers
(remote segments first), and local.retention.ms and local.retention.bytes drop the local copies of segments already
uploaded: they stay readable from the remote tier, and the summary counts them apart.

example:
  ledgerview retention prices
"""
DELETE_RECORDS_DESCRIPTION = """Kafka's DeleteRecords: make OFFSET the partition's log start offset, so reads below
it are out of range, and delete the segments wholly below it. The topic's cleanup.policy must include delete.

example:
  ledgerview delete-records prices --partition 0 --before-offset 1000
"""


def register(subparsers: Subparsers) -> None:
    retention = add_command(subparsers, "retention", run_retention, help="apply retention now",
                            description=RETENTION_DESCRIPTION)
    retention.add_argument("topics", nargs="*", metavar="topic", help="topics (default: all)")
    retention.add_argument("--json", action="store_true", help="one JSON object per deleted segment")

    delete = add_command(subparsers, "delete-records", run_delete_records,
                         help="delete a partition's records below an offset", description=DELETE_RECORDS_DESCRIPTION)
    delete.add_argument("topic")
    delete.add_argument("--partition", type=int, required=True)
    delete.add_argument("--before-offset", type=int, required=True, metavar="OFFSET",
                        help="the new log start offset")
    delete.add_argument("--json", action="store_true", help="the result as one JSON object")


def run_retention(args: argparse.Namespace) -> int:
    """A partition or topic that fails does not keep retention from the others: what was deleted is printed, then
    the first failure is raised, naming every partition that failed."""
    deleted: list[DeletedSegment] = []
    failures: list[tuple[str, LedgerviewError | OSError]] = []
    with open_existing_store(args) as store:
        for topic in args.topics or store.list_topics():
            try:
                topic_deleted, topic_failures = store.retention_pass(topic)
            except (LedgerviewError, OSError) as error:  # its metadata cannot be read
                failures.append((topic, error))
                continue
            deleted += topic_deleted
            failures += [(f"{topic}-{partition}", error) for partition, error in topic_failures]
    _print_deleted(deleted, as_json=args.json)
    gone = [segment for segment in deleted if segment.reason not in LOCAL_REASONS.values()]
    dropped = [segment for segment in deleted if segment.reason in LOCAL_REASONS.values()]
    dropped_text = (f"; local copies of {len(dropped)} uploaded segment(s), {sum(s.size_bytes for s in dropped)} "
                    "bytes, dropped (read from the remote tier now)" if dropped else "")
    say(f"Retention deleted {len(gone)} segment(s), {sum(s.size_bytes for s in gone)} bytes{dropped_text}.")
    if failures:
        first = failures[0][1]
        first.add_note(f"Retention failed on {', '.join(where for where, _ in failures)}; the rest was done.")
        raise first
    return 0


def run_delete_records(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        result = store.delete_records(args.topic, args.partition, args.before_offset)
    if args.json:
        print_json({"topic": result.topic, "partition": result.partition,
                    "log_start_offset": result.log_start_offset, "deleted_segments": len(result.deleted)})
    else:
        _print_deleted(result.deleted, as_json=False)
    say(f"{result.topic}-{result.partition} now starts at offset {result.log_start_offset}; "
        f"{len(result.deleted)} segment(s) deleted.")
    return 0


def _print_deleted(deleted: list[DeletedSegment], *, as_json: bool) -> None:
    if as_json:
        for segment in deleted:
            print_json({"topic": segment.topic, "partition": segment.partition, "base_offset": segment.base_offset,
                        "next_offset": segment.next_offset, "size_bytes": segment.size_bytes,
                        "reason": segment.reason.value})
    elif deleted:
        print_table(["topic", "partition", "base_offset", "next_offset", "size_bytes", "reason"],
                    [(s.topic, s.partition, s.base_offset, s.next_offset, s.size_bytes, s.reason.value)
                     for s in deleted])
