"""``ledgerview consume``: kafka-console-consumer for a ledgerview store, over the raw or the compacted view."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa

from ledgerview.commands.common import (
    Subparsers,
    add_command,
    iso_time_ms,
    open_existing_store,
    open_store_for_reading,
    require_topic,
)
from ledgerview.errors import UsageError
from ledgerview.output_lines import TextFormat, json_lines, text_lines
from readers import Consumer, Reader, Timestamp
from readers.positions import StartPosition
from storage import Store

DESCRIPTION = """Print a topic's messages, from the raw log or (--read-compacted) the compacted view.

Like kafka-console-consumer it starts at the end (only new messages) unless told where: --from-beginning,
--offset N (with --partition), or --timestamp T (ms since the epoch or ISO 8601). It keeps waiting for new messages
until --max-messages are printed, --timeout-ms passes without one, or Ctrl-C; --until-end stops at the end offsets
it saw when it started. With --subscription NAME the position is durable: every printed message is acknowledged,
and the next run with the same name resumes after it (the start options then only place a new subscription).

examples:
  ledgerview consume prices --from-beginning --until-end
  ledgerview consume prices --read-compacted --from-beginning --until-end --format json
  ledgerview consume prices --subscription dashboard --from-beginning --until-end
  ledgerview consume prices --partition 0 --offset 1000 --max-messages 10 --print-offset
"""
POLL_INTERVAL_S = 0.2
LONG_MAX = 2**63 - 1


def register(subparsers: Subparsers) -> None:
    consume = add_command(subparsers, "consume", run, help="print messages of a topic", description=DESCRIPTION)
    consume.add_argument("topic")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest message")
    start.add_argument("--offset", type=int, help="start at this offset (needs --partition)")
    start.add_argument("--timestamp", help="start at the first message at or after this time (ms or ISO 8601)")
    consume.add_argument("--partition", type=int, action="append", help="read only this partition (repeatable)")
    consume.add_argument("--read-compacted", action="store_true", help="read the compacted view")
    consume.add_argument("--subscription", metavar="NAME", help="durable subscription to resume and acknowledge")
    consume.add_argument("--max-messages", type=int, help="stop after this many messages")
    consume.add_argument("--until-end", action="store_true", help="stop at the end offsets seen at the start")
    consume.add_argument("--timeout-ms", type=int, help="stop when no message arrives for this long")
    consume.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or JSON lines")
    consume.add_argument("--separator", default="\t", help="between text fields (default: tab)")
    consume.add_argument("--null-marker", default="null", help="shown for a null key or value (default: null)")
    consume.add_argument("--print-partition", action="store_true")
    consume.add_argument("--print-offset", action="store_true")
    consume.add_argument("--print-timestamp", action="store_true")
    consume.add_argument("--no-key", action="store_true", help="print values only")


def run(args: argparse.Namespace) -> int:
    if args.offset is not None and (not args.partition or len(args.partition) != 1):
        raise UsageError("--offset needs exactly one --partition: offsets are per partition.")
    for option, value in (("--max-messages", args.max_messages), ("--timeout-ms", args.timeout_ms),
                          ("--offset", args.offset)):
        if value is not None and value < 0:
            raise UsageError(f"{option} must be >= 0, got {value}.")
        if value is not None and value > LONG_MAX:
            raise UsageError(f"{option} must be at most {LONG_MAX} (a 64-bit count), got {value}.")
    text_format = TextFormat(args.separator.encode(), args.null_marker.encode(), args.print_partition,
                             args.print_offset, args.print_timestamp, not args.no_key)
    out = sys.stdout.buffer
    # A consume without a subscription only reads: a folder it cannot write is read as it is.
    with (open_existing_store(args) if args.subscription else open_store_for_reading(args)) as store:
        require_topic(store, args.topic)
        for batch in _batches(store, args):
            _write_all(out, json_lines(batch) if args.format == "json" else text_lines(batch, text_format))
    return 0


def _write_all(out: BinaryIO, data: bytes | memoryview) -> None:
    """Write and flush every byte, or raise: a subscription acknowledges a batch once it is printed, and a pipe
    whose reader went away (consume | head) can take part of a write without an error, the next write raising."""
    view = memoryview(data)
    while view:
        view = view[out.write(view):]
    out.flush()


def _start(args: argparse.Namespace) -> StartPosition:
    if args.from_beginning:
        return "earliest"
    if args.offset is not None:
        return {args.partition[0]: args.offset}
    if args.timestamp is not None:
        return Timestamp(_timestamp_ms(args.timestamp))
    return "latest"


def _timestamp_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return iso_time_ms(text)
    except ValueError:
        raise UsageError(f"--timestamp {text!r} is neither milliseconds since the epoch (>= 0) nor an ISO 8601 "
                         "time (2026-11-22T14:00:00+00:00; without a zone it is UTC).") from None


def _batches(store: Store, args: argparse.Namespace) -> Iterator[pa.RecordBatch]:
    """The batches to print, polling for new ones until a stop condition; acknowledges through a subscription."""
    remaining = args.max_messages
    idle_since = time.monotonic()
    if args.subscription is not None:
        source: Consumer | Reader = Consumer(store, args.topic, args.subscription, read_compacted=args.read_compacted,
                                             initial_position=_start(args), partitions=args.partition)
    else:
        source = Reader(store, args.topic, read_compacted=args.read_compacted, start=_start(args),
                        partitions=args.partition)
    with source:
        while remaining is None or remaining > 0:
            read = source.receive_batches(remaining) if isinstance(source, Consumer) else source.batches()
            got = 0
            with read:
                for batch in read:
                    shown = batch if remaining is None else batch.slice(0, remaining)
                    yield shown
                    got += shown.num_rows
                    if isinstance(source, Consumer):
                        last = shown.num_rows - 1
                        source.acknowledge_cumulative(shown.column("partition")[last].as_py(),
                                                      shown.column("offset")[last].as_py())
                    if remaining is not None:
                        remaining -= shown.num_rows
                        if remaining == 0:
                            return
            if args.until_end:
                return
            if got:
                idle_since = time.monotonic()
            elif args.timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= args.timeout_ms:
                return
            else:
                time.sleep(POLL_INTERVAL_S)

