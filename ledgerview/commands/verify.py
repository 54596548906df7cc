"""``ledgerview verify``: check a store and answer with the exit status whether it is sound."""

from __future__ import annotations

import argparse

from ledgerview.commands.common import Subparsers, add_command, open_existing_store, print_json, require_topic, say
from ledgerview.exit_codes import ExitCode
from ledgerview.progress import ByteProgress
from storage.verification import files_to_check, verify_topics

DESCRIPTION = """Check every batch's CRC-32C, the order of offsets, every offset and time index entry, each
compaction cursor with its ledger and key index, and the subscription cursors. Nothing is changed.

Exit status 0: sound (warnings are repairs the store makes by itself on the next open); 1: problems found, each
printed as one line naming the file.

example:
  ledgerview verify --data data && echo sound
"""


def register(subparsers: Subparsers) -> None:
    verify = add_command(subparsers, "verify", run, help="check every CRC and index", description=DESCRIPTION)
    verify.add_argument("topics", nargs="*", metavar="topic", help="topics to check (default: all)")
    verify.add_argument("--json", action="store_true", help="the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        topics = args.topics or store.list_topics()
        for topic in topics:
            require_topic(store, topic)
        total = sum(path.stat().st_size for path in files_to_check(store, topics))
        with ByteProgress(total, "verifying") as bar:
            report = verify_topics(store, topics, bar.advance)
    if args.json:
        print_json({"sound": report.sound, "problems": report.problems, "warnings": report.warnings,
                    "partitions": report.partitions, "segments": report.segments, "ledgers": report.ledgers,
                    "batches": report.batches, "bytes": report.bytes_checked})
    else:
        for problem in report.problems:
            print(f"PROBLEM {problem}")
        for warning in report.warnings:
            print(f"warning {warning}")
    verdict = "sound" if report.sound else f"NOT SOUND ({len(report.problems)} problems)"
    say(f"Verified {len(topics)} topic(s), {report.partitions} partition(s), {report.segments} segment(s), "
        f"{report.ledgers} ledger(s), {report.batches} batches, {report.bytes_checked} bytes: {verdict}.")
    return ExitCode.OK if report.sound else ExitCode.CHECK_FAILED
