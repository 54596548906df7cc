"""``ledgerview produce``: kafka-console-producer for a ledgerview store, from stdin or files."""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from ledgerview.commands.common import Subparsers, add_command, open_existing_store, require_topic, say
from ledgerview.errors import MalformedInputError
from ledgerview.input_lines import LineError, LineFormat, line_number_in, parse_chunk, read_chunks, split_lines
from storage import Store
from storage.errors import KeylessMessageError, MessageTooLargeError

DESCRIPTION = """Append messages to a topic, one per line, from stdin or files.

Text lines are key<separator>value (a tab by default; --no-key for value-only lines). With --null-marker M, a key
or value equal to M is null, so `user42<TAB>M` is a tombstone for user42. JSON lines (--json) are objects with
"value" (a string, or null for a tombstone) and optional "key", "timestamp" (ms) and "partition".
Blank lines are skipped. At a malformed line, the lines before it are written and the command stops with exit
status 2, naming the line.

examples:
  printf 'AAPL\\t189.20\\nMSFT\\t402.10\\n' | ledgerview produce prices
  printf 'AAPL\\t-\\n' | ledgerview produce prices --null-marker -          # a tombstone for AAPL
  ledgerview produce prices --json --file ticks.jsonl
"""


STDIN = Path("-")


def register(subparsers: Subparsers) -> None:
    produce = add_command(subparsers, "produce", run, help="append messages from stdin or files",
                          description=DESCRIPTION)
    produce.add_argument("topic")
    produce.add_argument("--file", action="append", type=Path, default=[], metavar="PATH",
                         help="read this file instead of stdin (repeatable; '-' is stdin)")
    produce.add_argument("--json", action="store_true", help="JSON lines instead of key<separator>value text")
    produce.add_argument("--separator", default="\t", type=_separator,
                         help="between key and value in text lines (default: tab)")
    produce.add_argument("--no-key", action="store_true", help="text lines are values only; keys are null")
    produce.add_argument("--null-marker", metavar="MARK", help="a text key or value equal to MARK is null")
    produce.add_argument("--partition", type=int, help="append every message to this partition")
    produce.add_argument("--compression", choices=["none", "lz4", "zstd"],
                         help="batch codec when the topic's compression.type is producer")
    produce.add_argument("--quiet", action="store_true", help="print no summary")


def _separator(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the separator must be at least one character (the default is a tab)")
    return text


def run(args: argparse.Namespace) -> int:
    line_format = LineFormat(json=args.json, separator=args.separator.encode(), keyed=not args.no_key,
                             null_marker=None if args.null_marker is None else args.null_marker.encode())
    paths = args.file or [STDIN]
    for path in paths:
        if path != STDIN and not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "No such file (nothing was produced)", str(path))
    written = 0
    with open_existing_store(args) as store:
        require_topic(store, args.topic)
        for path in paths:
            if path == STDIN:
                written += _produce_stream(store, args, "stdin", sys.stdin.buffer, line_format, already=written)
                continue
            with path.open("rb") as stream:
                written += _produce_stream(store, args, str(path), stream, line_format, already=written)
    if not args.quiet:
        say(f"Produced {written} messages to {args.topic}.")
    return 0


def _produce_stream(store: Store, args: argparse.Namespace, name: str, stream: BinaryIO, line_format: LineFormat,
                    *, already: int) -> int:
    """Append the stream chunk by chunk; returns how many messages it added."""
    written, lines_before = 0, 0
    for chunk in read_chunks(stream):
        try:
            table = parse_chunk(chunk, line_format)
        except LineError as error:
            written += _append(store, args, error.parsed)
            raise _refused(name, lines_before, chunk, error.line_index, error.reason, already + written) from None
        try:
            written += _append(store, args, table)
        except (MessageTooLargeError, KeylessMessageError) as error:
            # The store refuses a whole append: write the messages before the refused one, so that what was
            # written is exactly the input up to the line named, and a resend from that line duplicates nothing.
            written += _append(store, args, table.slice(0, error.row))
            reason = (f"the message is {error.size_bytes} bytes, over the topic's max.message.bytes="
                      f"{error.limit_bytes}" if isinstance(error, MessageTooLargeError) else
                      "the message has no key, and the topic is compacted (cleanup.policy=compact)")
            raise _refused(name, lines_before, chunk, error.row + 1, reason, already + written) from None
        lines_before += chunk.count(b"\n")
    return written


def _refused(name: str, lines_before: int, chunk: bytes, non_blank_index: int, reason: str,
             written: int) -> MalformedInputError:
    """The error for the ``non_blank_index``-th line of ``chunk``, saying what was written before it."""
    line = split_lines(chunk)[non_blank_index - 1].as_py()
    consequence = (f"{written} messages before it were written, nothing from this line on; fix the line and send "
                   "the rest again.")
    return MalformedInputError(name, lines_before + line_number_in(chunk, non_blank_index), line, reason,
                               consequence=consequence)


def _append(store: Store, args: argparse.Namespace, table: pa.Table) -> int:
    if table.num_rows == 0:
        return 0
    compression = None if args.compression in (None, "none") else args.compression
    return len(store.append(args.topic, table, partition=args.partition, compression=compression))
