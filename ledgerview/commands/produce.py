"""``ledgerview produce``: kafka-console-producer for a ledgerview store, from stdin or files."""

from __future__ import annotations

import argparse
import errno
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.commands.common import Subparsers, add_command, open_existing_store, require_topic, say
from ledgerview.errors import MalformedInputError, UsageError
from ledgerview.input_lines import (
    CHUNK_BYTES,
    LineError,
    LineFormat,
    LineTooLongError,
    line_number_in,
    parse_chunk,
    read_chunks,
    split_lines,
)
from ledgerview.refusals import line_too_long, max_line_bytes, partition_lacking, store_refusal
from storage import Store
from storage.errors import KeylessMessageError, MessageTooLargeError, UnknownPartitionError

DESCRIPTION = """Append messages to a topic, one per line, from stdin or files.

Text lines are key<separator>value (a tab by default; --no-key for value-only lines). With --null-marker M, a key
or value equal to M is null, so `user42<TAB>M` is a tombstone for user42. JSON lines (--json) are objects with
"value" (a string, or null for a tombstone) and optional "key", "timestamp" (ms) and "partition", each line for
itself: one without a timestamp gets the time of the append, one without a partition the partitioner's choice.
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
                         help="read this file (or FIFO, or <(command)) instead of stdin (repeatable; '-' is stdin)")
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
    written = 0
    with ExitStack() as files:
        inputs = [_opened(path, files) for path in args.file or [STDIN]]
        with open_existing_store(args) as store:
            require_topic(store, args.topic)
            partitions = store.topic_metadata(args.topic).partitions
            if args.partition is not None and not 0 <= args.partition < partitions:
                raise UnknownPartitionError(args.topic, args.partition, partitions)  # even with nothing to produce
            for name, stream in inputs:
                written += _produce_stream(store, args, name, stream, line_format, already=written)
    if not args.quiet:
        say(f"Produced {written} messages to {args.topic}.")
    return 0


def _opened(path: Path, files: ExitStack) -> tuple[str, BinaryIO]:
    """The input ``path`` names and its name in errors, opened before anything is produced, so that one that
    cannot be read stops the command with nothing written. Whatever opens for reading is read: a file, a FIFO,
    ``/dev/stdin`` or a shell's process substitution (``--file <(...)``, a ``/dev/fd/N``)."""
    if path == STDIN:
        return "stdin", sys.stdin.buffer
    try:
        return str(path), files.enter_context(path.open("rb"))
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "No such file (nothing was produced)", str(path)) from None
    except IsADirectoryError:
        raise UsageError(f"--file {path} is a directory; give a file to read (a pipe or FIFO also does), or '-' "
                         "for stdin. Nothing was produced.") from None


class _Refusal(NamedTuple):
    """The first line of a chunk that is not written, and why."""

    row: int
    """Its index among the chunk's non-blank lines (from 0)."""
    reason: str


def _produce_stream(store: Store, args: argparse.Namespace, name: str, stream: BinaryIO, line_format: LineFormat,
                    *, already: int) -> int:
    """Append the stream chunk by chunk; returns how many messages it added. At the first line refused, by the
    parser or by the store, the lines before it are written and none from it on, so that what was written is
    exactly the input up to the line named, and a resend from that line duplicates nothing."""
    written, lines_before = 0, 0
    max_message_bytes = store.topic_metadata(args.topic).config.max_message_bytes
    bound = max_line_bytes(max_message_bytes, CHUNK_BYTES)
    chunks = read_chunks(stream, max_line_bytes=bound)
    while True:
        try:
            chunk = next(chunks, None)
        except LineTooLongError as error:
            raise MalformedInputError(name, lines_before + 1, error.start, line_too_long(bound, max_message_bytes),
                                      consequence=_consequence(already + written)) from None
        if chunk is None:
            return written
        try:
            table, refusal = parse_chunk(chunk, line_format), None
        except LineError as error:
            table, refusal = error.parsed, _Refusal(error.line_index - 1, error.reason)
        added, refused_by_store = _append_lines(store, args, table)
        written += added
        refusal = refused_by_store or refusal
        if refusal is not None:
            raise _refused(name, lines_before, chunk, refusal.row + 1, refusal.reason, already + written)
        lines_before += chunk.count(b"\n")


def _append_lines(store: Store, args: argparse.Namespace, table: pa.Table) -> tuple[int, _Refusal | None]:
    """Append the messages of a chunk's lines; returns how many were written and the first one the topic refuses,
    if any (those before it are written, none from it on)."""
    refusal = _unknown_partition(store, args, table)
    if refusal is not None:
        table = table.slice(0, refusal.row)
    try:
        return _append(store, args, table), refusal
    except (MessageTooLargeError, KeylessMessageError) as error:
        # The store refuses a whole append: write the messages before the refused one.
        return _append(store, args, table.slice(0, error.row)), _Refusal(error.row, store_refusal(error))


def _unknown_partition(store: Store, args: argparse.Namespace, table: pa.Table) -> _Refusal | None:
    """The first message whose ``partition`` (a JSON line's) the topic does not have: checked here, since the store
    refuses the whole append without saying which line. --partition overrides the field, so then nothing is."""
    if args.partition is not None or "partition" not in table.column_names:
        return None
    count = store.topic_metadata(args.topic).partitions
    row = pc.index(pc.fill_null(pc.greater_equal(table["partition"], count), False), True).as_py()
    if row < 0:
        return None
    return _Refusal(row, partition_lacking(table["partition"][row], args.topic, count))


def _refused(name: str, lines_before: int, chunk: bytes, non_blank_index: int, reason: str,
             written: int) -> MalformedInputError:
    """The error for the ``non_blank_index``-th line of ``chunk``, saying what was written before it."""
    line = split_lines(chunk)[non_blank_index - 1].as_py()
    return MalformedInputError(name, lines_before + line_number_in(chunk, non_blank_index), line, reason,
                               consequence=_consequence(written))


def _consequence(written: int) -> str:
    return (f"{written} messages before it were written, nothing from this line on; fix the line and send the rest "
            "again.")


def _append(store: Store, args: argparse.Namespace, table: pa.Table) -> int:
    if table.num_rows == 0:
        return 0
    compression = None if args.compression in (None, "none") else args.compression
    return len(store.append(args.topic, table, partition=args.partition, compression=compression))
