"""``ledgerview verify``: check a store and answer with the exit status whether it is sound."""

from __future__ import annotations

import argparse

from ledgerview.commands.common import (
    Subparsers,
    add_command,
    existing_data_folder,
    open_existing_store,
    print_json,
    require_topic,
    say,
)
from ledgerview.commands.verify_repair import repair_views
from ledgerview.exit_codes import ExitCode
from ledgerview.progress import ByteProgress
from storage import Store
from storage.verification import files_to_check, verify_topics

DESCRIPTION = """Check every batch's CRC-32C, the order of offsets (each segment starting where the one before it
ends), every offset and time index entry, each compaction cursor with its ledger and key index, and the
subscription cursors. Nothing is changed, unless --repair: then each damaged compacted view is rebuilt from the
raw log (a fresh ledger and key index, published as a compaction publishes) where retention has kept the raw
messages it needs, and the store is checked again.

Exit status 0: sound (warnings are repairs the store makes by itself on the next open; with --repair, sound after
the repairs); 1: problems found, each printed as one line naming the file.

examples:
  ledgerview verify --data data && echo sound
  ledgerview verify --data data --repair
"""


def register(subparsers: Subparsers) -> None:
    verify = add_command(subparsers, "verify", run, help="check every CRC and index", description=DESCRIPTION)
    verify.add_argument("topics", nargs="*", metavar="topic", help="topics to check (default: all)")
    verify.add_argument("--json", action="store_true", help="the report as one JSON object")
    verify.add_argument("--repair", action="store_true",
                        help="rebuild damaged compacted views from the raw log, then check again")


def _open(args: argparse.Namespace) -> Store:
    """The store, opened read-only unless it is to be repaired (or tiered now by --remote): a check changes
    nothing (a writer's open would cut a torn tail before it is reported), and works on a read-only folder."""
    if args.repair or args.remote is not None:
        return open_existing_store(args)
    existing_data_folder(args)
    return Store.open(args.data, read_only=True)


def run(args: argparse.Namespace) -> int:
    with _open(args) as store:
        topics = args.topics or store.list_topics()
        for topic in topics:
            require_topic(store, topic)
        total = sum(path.stat().st_size for path in files_to_check(store, topics))
        with ByteProgress(total, "verifying") as bar:
            report = verify_topics(store, topics, bar.advance)
        repaired: list[str] = []
        not_repaired: list[str] = []
        if args.repair and report.damaged_views:
            repaired, not_repaired = repair_views(store, report.damaged_views, report.raw_gaps)
            report = verify_topics(store, topics, lambda _: None)
    if args.json:
        print_json({"sound": report.sound, "problems": report.problems, "warnings": report.warnings,
                    "partitions": report.partitions, "segments": report.segments, "ledgers": report.ledgers,
                    "batches": report.batches, "bytes": report.bytes_checked, "repaired": repaired,
                    "not_repaired": not_repaired})
    else:
        for line in repaired:
            print(f"REPAIRED {line}")
        for line in not_repaired:
            print(f"NOT REPAIRED {line}")
        for problem in report.problems:
            print(f"PROBLEM {problem}")
        for warning in report.warnings:
            print(f"warning {warning}")
    verdict = "sound" if report.sound else f"NOT SOUND ({len(report.problems)} problems)"
    say(f"Verified {len(topics)} topic(s), {report.partitions} partition(s), {report.segments} segment(s), "
        f"{report.ledgers} ledger(s), {report.batches} batches, {report.bytes_checked} bytes: {verdict}.")
    return ExitCode.OK if report.sound else ExitCode.CHECK_FAILED
