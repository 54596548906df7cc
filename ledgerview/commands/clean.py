"""``ledgerview clean``: Kafka's in-place log cleaning of compacted topics, run now (``Store.clean``)."""

from __future__ import annotations

import argparse
import dataclasses

from ledgerview.commands.common import (
    Subparsers,
    add_command,
    open_existing_store,
    print_json,
    print_table,
    require_topic,
    say,
)
from ledgerview.errors import UsageError
from ledgerview.exit_codes import ExitCode
from ledgerview.progress import progress
from storage import Store
from storage.cleaner import CleanerStats
from storage.errors import CorruptDataError

DESCRIPTION = """Clean compacted topics in place now, as Kafka's log cleaner does: in every partition whose dirty
ratio is above min.cleanable.dirty.ratio (or whose oldest dirty message passed max.compaction.lag.ms), rewrite
the sealed segments keeping only the latest message of each key; tombstones go after delete.retention.ms.
Offsets never change. Only topics whose cleanup.policy includes compact are cleaned. A partition whose pass
fails is named on stderr and the command exits 5; the other partitions are still cleaned. A topic whose metadata
record cannot be read is named on stderr and the command exits 1 (unless 5); the other topics are still cleaned.

examples:
  ledgerview clean users
  ledgerview clean --json
"""


def register(subparsers: Subparsers) -> None:
    clean = add_command(subparsers, "clean", run, help="clean compacted topics in place now",
                        description=DESCRIPTION)
    clean.add_argument("topics", nargs="*", metavar="topic", help="topics to clean (default: every compact topic)")
    clean.add_argument("--json", action="store_true", help="one JSON object per partition pass")


def run(args: argparse.Namespace) -> int:
    stats: list[CleanerStats] = []
    damaged: dict[str, CorruptDataError] = {}
    with open_existing_store(args) as store:
        for topic in args.topics:
            require_topic(store, topic)
            if _is_compact(store, topic, damaged) or topic in damaged:  # a damaged record is reported below
                continue
            policy = store.topic_metadata(topic).config
            raise UsageError(f"Topic {topic!r} has cleanup.policy={','.join(sorted(policy.cleanup_policy))}; "
                             "cleaning keeps the latest value per key of compact topics: set "
                             "cleanup.policy=compact or compact,delete first.")
        if args.topics:
            topics = [topic for topic in args.topics if topic not in damaged]
        else:
            topics = [topic for topic in store.list_topics() if _is_compact(store, topic, damaged)]
        for topic in progress(topics, unit="topic", description="cleaning"):
            stats += store.clean(topic)
        uncleanable = store.cleaner.uncleanable()
    if args.json:
        for entry in stats:
            print_json(dataclasses.asdict(entry))
    elif stats:
        print_table(["topic", "partition", "first_dirty", "end", "dirty_ratio", "read", "written",
                     "tombstones_removed", "bytes_read", "bytes_written"],
                    [(s.topic, s.partition, s.first_dirty_offset, s.end_offset, f"{s.dirty_ratio:.3f}",
                      s.messages_read, s.messages_written, s.tombstones_removed, s.bytes_read, s.bytes_written)
                     for s in stats])
    for topic, record_error in damaged.items():
        say(f"ledgerview: error: {topic} was not cleaned: {record_error}")
    for (topic, partition), error in sorted(uncleanable.items()):
        say(f"ledgerview: error: {topic}-{partition} could not be cleaned: {error}")
    say(f"Cleaned {len(stats)} partition(s) of {len(topics)} topic(s); "
        f"{sum(s.messages_read - s.messages_written for s in stats)} messages removed.")
    return ExitCode.FAILED if uncleanable else ExitCode.CHECK_FAILED if damaged else ExitCode.OK


def _is_compact(store: Store, topic: str, damaged: dict[str, CorruptDataError]) -> bool:
    """Whether the topic's cleanup.policy includes compact; a topic whose metadata record cannot be read goes
    into ``damaged`` (it is named, and the others are still cleaned)."""
    try:
        return store.topic_metadata(topic).config.is_compact
    except CorruptDataError as error:
        damaged[topic] = error
        return False
