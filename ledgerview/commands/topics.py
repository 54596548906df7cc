"""``ledgerview topics create|list|describe|alter|delete``: kafka-topics for a ledgerview store."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ledgerview.commands.common import (
    Subparsers,
    add_command,
    open_existing_store,
    open_store,
    open_store_for_reading,
    parse_pairs,
    print_json,
    print_table,
    say,
)
from ledgerview.errors import UsageError
from ledgerview.exit_codes import ExitCode
from storage.config import CONFIG_KEYS, TopicConfig
from storage.errors import CorruptDataError, LedgerviewError
from storage.files import validate_partition_count, validate_topic_name

CONFIG_HELP = "topic config key=value, repeatable; keys: " + ", ".join(key.name for key in CONFIG_KEYS)


def register(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("topics", help="create, list, describe, alter and delete topics",
                                  description="Create, list, describe, alter and delete topics.")
    topics = group.add_subparsers(dest="topics_command", required=True, metavar="ACTION")

    create = add_command(topics, "create", run_create, help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help=CONFIG_HELP)
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")

    listing = add_command(topics, "list", run_list, help="list the topics, one per line")
    listing.add_argument("--json", action="store_true", help="one JSON array")

    describe = add_command(topics, "describe", run_describe,
                           help="partitions (offsets, sizes, segments) and config of topics")
    describe.add_argument("topics", nargs="*", metavar="topic", help="topics to describe (default: all)")
    describe.add_argument("--json", action="store_true", help="one JSON object per topic, one per line")
    describe.add_argument("--all-config", action="store_true", help="show every config key, not only overrides")

    alter = add_command(topics, "alter", run_alter, help="set or remove config overrides of a topic")
    alter.add_argument("topic")
    alter.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help=CONFIG_HELP)
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                       help="remove an override (back to the default), repeatable")

    delete = add_command(topics, "delete", run_delete, help="delete a topic and all its data")
    delete.add_argument("topic")
    delete.add_argument("--if-exists", action="store_true", help="succeed if the topic does not exist")


def run_create(args: argparse.Namespace) -> int:
    config = parse_pairs(args.config, "--config")
    # Checked before the store opens: it would make a data folder for a topic never created.
    try:
        validate_partition_count(args.partitions)
    except LedgerviewError as error:
        raise UsageError(f"--partitions {args.partitions}: {error} Nothing was created.") from None
    validate_topic_name(args.topic)
    TopicConfig.from_overrides(config)
    with open_store(args) as store:
        if args.if_not_exists and args.topic in store.list_topics():
            # Kafka's --if-not-exists changes nothing either; saying what the topic has shows when it differs.
            existing = store.topic_metadata(args.topic).partitions
            say(f"Topic {args.topic} already exists, with {existing} partition(s); nothing was changed.")
            return 0
        store.create_topic(args.topic, partitions=args.partitions, config=config)
    say(f"Created topic {args.topic} with {args.partitions} partition(s).")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with open_store_for_reading(args) as store:
        names = store.list_topics()
    if args.json:
        print_json(names)
    else:
        for name in names:
            print(name)
    return 0


def run_describe(args: argparse.Namespace) -> int:
    damaged = False
    with open_store_for_reading(args) as store:
        for topic in args.topics or store.list_topics():
            try:
                description = store.describe_topic(topic)
            except CorruptDataError as error:  # one damaged topic does not hide the others
                print(f"ledgerview: error: {topic}: {error}", file=sys.stderr)
                damaged = True
                continue
            config = description.config if args.all_config else description.overrides
            if args.json:
                print_json({"topic": topic, "partitions": [dataclasses.asdict(p) for p in description.partitions],
                            "config": config})
            else:
                settings = ",".join(f"{key}={value}" for key, value in sorted(config.items()))
                print(f"Topic: {topic}\tPartitionCount: {len(description.partitions)}\tConfigs: {settings}")
                print_table(["partition", "start_offset", "end_offset", "size_bytes", "segments"],
                            [(p.partition, p.start_offset, p.end_offset, p.size_bytes, p.segments)
                             for p in description.partitions])
            for partition in (p for p in description.partitions if p.error is not None):
                print(f"ledgerview: error: {topic}-{partition.partition}: {partition.error}", file=sys.stderr)
                damaged = True
    return ExitCode.CHECK_FAILED if damaged else 0


def run_alter(args: argparse.Namespace) -> int:
    if not args.config and not args.delete_config:
        raise UsageError("Nothing to alter: give --config KEY=VALUE or --delete-config KEY.")
    both = sorted(set(parse_pairs(args.config, "--config")) & set(args.delete_config or []))
    if both:
        raise UsageError(f"{', '.join(both)}: both set (--config) and deleted (--delete-config); give one of the two.")
    with open_existing_store(args) as store:
        config = store.alter_topic_config(args.topic, set=parse_pairs(args.config, "--config"),
                                          delete=args.delete_config)
    overrides = ",".join(f"{key}={value}" for key, value in sorted(config.to_overrides().items()))
    say(f"Altered topic {args.topic}; its overrides are now: {overrides or 'none'}.")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        if args.if_exists and args.topic not in store.list_topics():
            say(f"Topic {args.topic} does not exist.")
            return 0
        store.delete_topic(args.topic)
    say(f"Deleted topic {args.topic}.")
    return 0
