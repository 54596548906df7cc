"""``ledgerview dump-log``: kafka-dump-log for segments, indexes and compacted ledgers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from ledgerview.commands.common import Subparsers, add_command
from ledgerview.errors import UsageError
from ledgerview.progress import ByteProgress
from storage.batch_files import BatchFile
from storage.codec import LOG_APPEND_TIME_FLAG, BatchFormatError, BatchHeader
from storage.files import (
    LAYER_RECORD_SUFFIX,
    LEDGER_SUFFIX,
    LEDGERS_FOLDER,
    LOG_SUFFIX,
    OFFSET_INDEX_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_ledger_file,
    parse_partition_folder,
)
from storage.files import parse_segment_file as parse_segment_name
from storage.index import OffsetIndex, TimeIndex
from storage.ledger_layers import read_layer_record

DESCRIPTION = """Print the batches of segment files (.log) and compacted ledgers (.ledger): offsets, counts,
timestamps, positions, sizes, codec, the columns a compressed batch stores as dictionaries, and CRC-32C with
whether it verifies; with --print-data-log, every message too. Offset (.index) and time (.timeindex) indexes
print their entries; a ledger's layer record (.layers), the ledgers beneath it and how many of their rows it
deletes. A folder stands for the files in it: a partition folder (an empty one prints nothing) or its compacted
folder; any other folder without such files, a data folder for one, is refused (exit status 2).

examples:
  ledgerview dump-log data/prices-0/00000000000000000000.log
  ledgerview dump-log data/prices-0 --print-data-log
  ledgerview dump-log data/prices-0/compacted/00000000000000000001.ledger --print-data-log
"""
BATCH_SUFFIXES = (LOG_SUFFIX, LEDGER_SUFFIX)
DUMPABLE_SUFFIXES = (*BATCH_SUFFIXES, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX, LAYER_RECORD_SUFFIX)
TAKES = f"dump-log reads files ending in {', '.join(DUMPABLE_SUFFIXES)}, or a folder of them"


def register(subparsers: Subparsers) -> None:
    dump = add_command(subparsers, "dump-log", run, store=False, help="print the batches of segments and ledgers",
                       description=DESCRIPTION)
    dump.add_argument("files", nargs="+", type=Path, metavar="PATH", help="files or folders to dump")
    dump.add_argument("--print-data-log", action="store_true", help="print every message as well")


def run(args: argparse.Namespace) -> int:
    files = [file for path in args.files for file in _expand(path)]
    with ByteProgress(sum(file.stat().st_size for file in files), "dumping") as bar:
        for file in files:
            print(f"Dumping {file}")
            if file.suffix in BATCH_SUFFIXES:
                _dump_batches(file, print_data=args.print_data_log)
            elif file.suffix == OFFSET_INDEX_SUFFIX:
                _dump_offset_index(file)
            elif file.suffix == LAYER_RECORD_SUFFIX:
                _dump_layer_record(file)
            else:
                _dump_time_index(file)
            bar.advance(file.stat().st_size)
    return 0


def _expand(path: Path) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(2, "No such file or folder", str(path))
    if not path.is_dir():
        if path.suffix not in DUMPABLE_SUFFIXES:
            raise UsageError(f"{path} is not a segment, index, ledger or layer record file; {TAKES}.")
        return [path]
    files = [entry for entry in sorted(path.iterdir()) if _dumpable(entry.name)]
    if not files and not _holds_dumpable_files(path.resolve().name):
        # Not an empty partition (a topic nothing was produced to), so a wrong folder: a data folder most likely.
        partitions = sorted(entry for entry in path.iterdir() if entry.is_dir() and parse_partition_folder(entry.name))
        example = f" (in this data folder: {partitions[0]})" if partitions else ""
        raise UsageError(f"{path} holds no segment, index, ledger or layer record file; {TAKES}, such as a "
                         f"partition folder{example} or its {LEDGERS_FOLDER} folder.")
    return files


def _dumpable(name: str) -> bool:
    parsed = parse_segment_name(name) or parse_ledger_file(name)
    return parsed is not None and parsed[2] is None and Path(name).suffix in DUMPABLE_SUFFIXES


def _holds_dumpable_files(folder_name: str) -> bool:
    """Whether a folder of this name is one whose files dump-log reads: a partition folder or its ledgers' folder."""
    return parse_partition_folder(folder_name) is not None or folder_name == LEDGERS_FOLDER


def _dump_batches(path: Path, *, print_data: bool) -> None:
    file = BatchFile(path)
    out = sys.stdout
    for scanned in file.scan():
        header = scanned.header
        out.write(f"{_batch_line(header)}{_dictionaries(file, header)} crc: {header.crc:#010x} "
                  f"isValid: {str(scanned.crc_valid).lower()}\n")
        if print_data:
            out.write(_messages(file, header, trusted=scanned.crc_valid))
    if file.tail is not None:
        out.write(f"Unreadable bytes at position {file.tail.position} ({file.tail.remaining_bytes} bytes to the "
                  f"end): {file.tail.reason}\n")


def _dump_layer_record(path: Path) -> None:
    lower = read_layer_record(path)
    if not lower:
        sys.stdout.write("no ledger beneath: a view of one ledger\n")
    for layer in lower:
        sys.stdout.write(f"ledger: {layer.ledger_id} horizon: {layer.horizon} rows: {len(layer.deleted)} "
                         f"deleted: {int(layer.deleted.sum())}\n")


def _batch_line(header: BatchHeader) -> str:
    time_type = "LogAppendTime" if header.attributes & LOG_APPEND_TIME_FLAG else "CreateTime"
    return (f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.record_count} "
            f"position: {header.position} {time_type}: {header.first_timestamp} maxTimestamp: "
            f"{header.max_timestamp} size: {header.batch_length} compression: {header.compression or 'none'}")


def _dictionaries(file: BatchFile, header: BatchHeader) -> str:
    """`` dictionaries: key,value`` for a batch storing those columns as dictionaries (docs/FORMAT.md); nothing
    for the plain layout, or when the payload does not parse (its messages' line says so)."""
    try:
        columns = file.dictionary_columns(header)
    except BatchFormatError:
        return ""
    return f" dictionaries: {','.join(columns)}" if columns else ""


def _messages(file: BatchFile, header: BatchHeader, *, trusted: bool) -> str:
    """One line per message of the batch: a display, so one Python step per message is fine. A batch whose CRC
    fails is checked whole first (``trusted`` False): Arrow takes a payload's offsets and lengths as they are, and
    damaged ones would have it read outside the file (the process died of a segmentation fault)."""
    try:
        batch = file.decode(header)
        if not trusted:
            batch.validate(full=True)
        rows = batch.to_pylist()
    except BatchFormatError as error:
        return f"| payload does not decode: {error.reason}\n"
    except pa.ArrowException as error:
        return f"| payload does not decode: {error}\n"
    lines = []
    for row in rows:
        key, value = row["key"], row["value"]
        headers = [(pair["key"], _shown(pair["value"])) for pair in row["headers"] or []]
        lines.append(f"| offset: {row['offset']} timestamp: {row['timestamp']} "
                     f"keySize: {-1 if key is None else len(key)} valueSize: {-1 if value is None else len(value)} "
                     f"key: {_shown(key)} payload: {_shown(value)} headers: {headers}\n")
    return "".join(lines)


def _shown(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", "backslashreplace")


def _dump_offset_index(path: Path) -> None:
    _dump_index(path, OffsetIndex(path), 8, lambda base, relative, position: f"offset: {base + relative} "
                                                                             f"position: {position}")


def _dump_time_index(path: Path) -> None:
    _dump_index(path, TimeIndex(path), 12, lambda base, timestamp, relative: f"timestamp: {timestamp} "
                                                                              f"offset: {base + relative}")


def _dump_index(path: Path, index: OffsetIndex | TimeIndex, entry_bytes: int,
                line: Callable[[int, int, int], str]) -> None:
    """Every whole entry; bytes after the last one (a torn write, damage) are named after them."""
    data = path.read_bytes()
    left_over = len(data) % entry_bytes
    index.load_bytes(data[: len(data) - left_over])
    parsed = parse_segment_name(path.name)
    base_offset = parsed[0] if parsed else 0
    for key, value in zip(index.keys, index.values, strict=True):
        print(line(base_offset, key, value))
    if left_over:
        print(f"Not a whole number of {entry_bytes}-byte entries: {len(data)} bytes, the {left_over} after the "
              f"{len(index.keys)} whole entries ignored")
