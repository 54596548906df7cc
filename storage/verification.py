"""Checking a whole store: every batch's CRC, the order of offsets, both indexes of every segment, the compaction
cursor and its ledger (CRCs, horizon, counts, key index), and subscription cursors; for a tiered topic also its
remote log: the manifest's checksum and shape, every object it names there at its size, every segment's index
objects (whole entries within the segment), every flat key index's directory and groups (their CRC-32Cs), and for
the remote segments whose local copies are gone, the CRC of every batch and every index entry against the batches.
Read-only: nothing is fixed, every finding is reported.

A **problem** is damage to what is on disk (a CRC mismatch, offsets out of order, an index entry pointing at the
wrong batch, a corrupt cursor): the store is not sound, even where reads work around it (a wrong index entry only
makes them slower). A **warning** is something the store repairs by itself when
a writer next opens the partition (an incomplete batch at the end of the last segment, which is what a writer
killed mid-append leaves or what a live writer is appending now; a missing index).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage.batch_files import BatchFile, ScannedBatch
from storage.checkpoints import read_checkpoint
from storage.codec import BatchFormatError, BatchHeader
from storage.compacted import CompactedLedgers, LostCursorError
from storage.cursors import read_subscription_cursor
from storage.errors import CorruptDataError, CorruptSegmentError, LedgerviewError
from storage.files import (
    LOG_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    SUBSCRIPTIONS_FOLDER,
    SWAP_SUFFIX,
    key_index_folder,
    ledger_file,
    parse_segment_file,
    partition_folder,
    partitions_on_disk,
)
from storage.index import OffsetIndex, TimeIndex
from storage.key_index import CorruptKeyIndexError, KeyIndex, UnreadableKeyIndexError
from storage.ledger_layers import LowerLayer, read_layer_record
from storage.loader import listed_again_while_files_go
from storage.object_store import RemoteObjectMissingError
from storage.partition_log import PartitionLog
from storage.remote_key_index import FlatKeyIndex
from storage.remote_segment import RemoteSegmentInfo
from storage.remote_tier import RemoteTier
from storage.segment import SegmentReads
from storage.store import Store

Advance = Callable[[int], None]


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    partitions: int = 0
    segments: int = 0
    ledgers: int = 0
    batches: int = 0
    bytes_checked: int = 0
    damaged_views: dict[tuple[str, int], int] = field(default_factory=dict)
    """(topic, partition) of each compacted view found damaged, with the lowest raw offset a rebuild of it reads
    (the ledger's first offset when its first batch header reads, else 0)."""
    raw_gaps: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    """(topic, partition) of each raw log with offsets in no segment, with the first such range (first, last): a
    rebuild of its view would read over them without a word."""

    @property
    def sound(self) -> bool:
        return not self.problems


def files_to_check(store: Store, topics: list[str]) -> list[Path]:
    """The segment files a verify of ``topics`` reads, for sizing a progress bar (ledgers are small and are not
    counted)."""
    files = []
    for topic in topics:
        for partition in _partitions_of(store, topic)[0]:
            folder = partition_folder(store.root, topic, partition)
            files += [folder / name for name, _ in _segment_names(folder)]
    return files


def _partitions_of(store: Store, topic: str) -> tuple[list[int], str | None]:
    """The topic's partitions, and why its metadata record cannot be read, if so: then the partitions are those
    with a folder, still checked."""
    try:
        return list(range(store.topic_metadata(topic).partitions)), None
    except CorruptDataError as error:
        return partitions_on_disk(store.root, topic), str(error)


def verify_topics(store: Store, topics: list[str], advance: Advance) -> Report:
    report = Report()
    try:
        recovery_points = read_checkpoint(store.root / RECOVERY_POINT_CHECKPOINT)
    except CorruptDataError as error:  # a finding like any other: every topic is still checked
        report.problems.append(str(error))
        recovery_points = {}
    for topic in topics:
        partitions, damaged_record = _partitions_of(store, topic)
        if damaged_record is not None:
            report.problems.append(damaged_record)
        for partition in partitions:
            folder = partition_folder(store.root, topic, partition)
            report.partitions += 1
            before_raw = len(report.problems)
            gaps = _verify_segments(folder, report, advance, recorded_end=recovery_points.get((topic, partition), 0))
            if gaps:
                report.raw_gaps[(topic, partition)] = gaps[0]
            raw_sound = len(report.problems) == before_raw
            try:
                log: PartitionLog | None = store.partition_log(topic, partition)
            except CorruptSegmentError as error:  # a raw log its open refuses: the scan above named the damage
                log = None
                if not any(error.path in problem for problem in report.problems):
                    report.problems.append(str(error))
            except LedgerviewError as error:  # as a damaged topic record, named once
                log = None
                if str(error) not in report.problems:
                    report.problems.append(str(error))
            before = len(report.problems)
            # the raw log's end is known only when it is sound (a read-only open ends it at the damage)
            _verify_compacted(folder, report, end_offset=log.end_offset if log is not None and raw_sound else None)
            if len(report.problems) > before:
                report.damaged_views[(topic, partition)] = _first_ledger_offset(folder)
            _verify_subscriptions(folder, partition, report)
            if log is not None and store.remote is not None and log.config.remote_storage_enable:
                _verify_remote(store.remote, log, report)
    return report


def _verify_remote(tier: RemoteTier, log: PartitionLog, report: Report) -> None:
    """The remote log of a tiered partition: its newest manifest, every object it names at its size, every index
    object whole and within its segment, every group of the flat key indexes with its directory; and for the
    segments whose local copies are gone, every batch's CRC and every index entry against the batches."""
    try:
        remote_log = tier.remote_log(log.topic, log.partition)
        manifest = remote_log.latest()
        if manifest is None:
            return
        sizes = {info.key: info.size for info in remote_log.data_objects()}
        expected = [(segment.log_key, segment.size_bytes) for segment in manifest.segments]
        if manifest.compacted is not None:
            expected += manifest.compacted.object_sizes
        for key, size in expected:
            if sizes.get(key) != size:
                report.problems.append(f"{tier.objects.url(key)}: the remote log names it with {size} bytes, the "
                                       f"tier holds {sizes.get(key, 'none')}")
        local_start = log.segments[0].base_offset
        if manifest.segments and local_start > manifest.end_offset:
            report.problems.append(f"{log.topic}-{log.partition}: the remote log ends at {manifest.end_offset} and "
                                   f"the local one starts at {local_start}: the offsets between are on neither tier")
        remote_only = {segment.base_offset: segment for segment in log.remote_segments}
        for info in manifest.segments:
            _verify_remote_segment(tier, info, remote_only.get(info.base_offset), report)
        for piece in manifest.compacted.key_indexes if manifest.compacted is not None else ():
            if sizes.get(piece.key) == piece.size_bytes:  # else named above
                _verify_remote_key_index(tier, piece.key, piece.size_bytes, report)
    except LedgerviewError as error:
        report.problems.append(str(error))


def _verify_remote_segment(tier: RemoteTier, info: RemoteSegmentInfo, segment: SegmentReads | None,
                           report: Report) -> None:
    """One segment of the remote log: its index objects; with ``segment`` (its local copy is gone), its batches'
    CRCs and the index entries against them."""
    offset_index, time_index = OffsetIndex(Path(info.offset_index_key)), TimeIndex(Path(info.time_index_key))
    offset_whole = _load_remote_index(tier, info.offset_index_key, offset_index, info.size_bytes, report)
    time_whole = _load_remote_index(tier, info.time_index_key, time_index, info.next_offset - info.base_offset,
                                    report)
    if segment is None:
        return
    report.segments += 1
    try:
        headers = list(segment.scan(0, verify=True))
    except BatchFormatError as error:
        report.problems.append(f"{segment.source}: at position {error.position}: {error}")
        return
    except LedgerviewError as error:
        report.problems.append(str(error))
        return
    if offset_whole:
        _check_offset_entries(tier.objects.url(info.offset_index_key), offset_index, info.base_offset, headers,
                              report)
    if time_whole:
        _check_time_entries(tier.objects.url(info.time_index_key), time_index, info.base_offset, headers, report,
                            sealed=True)


def _load_remote_index(tier: RemoteTier, key: str, index: OffsetIndex | TimeIndex, bound: int,
                       report: Report) -> bool:
    """Load the index object ``key``; a problem if the tier holds none, or if it is not whole entries within
    ``bound`` (the segment's bytes for an offset index, its offsets for a time index). Reads of its segment then
    scan from the first batch: slower, never wrong; but nothing repairs it, as opening a partition repairs a local
    index."""
    url = tier.objects.url(key)
    try:
        data = tier.objects.read(key).to_pybytes()
    except RemoteObjectMissingError:
        report.problems.append(f"{url}: the remote log names it, the tier holds none")
        return False
    if not (index.load_bytes(data) and index.is_consistent(bound)):
        report.problems.append(f"{url}: not whole index entries within its segment (reads of the segment scan it "
                               "from its first batch)")
        return False
    return True


def _verify_remote_key_index(tier: RemoteTier, key: str, size: int, report: Report) -> None:
    try:
        FlatKeyIndex(tier.objects.url(key), size, functools.partial(tier.objects.read_range, key)).check()
    except CorruptKeyIndexError as error:
        report.problems.append(str(error))


def _segment_names(folder: Path) -> list[tuple[str, int]]:
    return [(name, base) for name, base, temp in _segment_logs(folder) if temp is None]


def _segment_logs(folder: Path) -> list[tuple[str, int, str | None]]:
    """(name, base offset, temporary suffix) of the folder's segment logs, in offset order."""
    parsed = [(name, result) for name in _names(folder) if (result := parse_segment_file(name))]
    return sorted(((name, base, temp) for name, (base, suffix, temp) in parsed if suffix == LOG_SUFFIX),
                  key=lambda item: item[1])


def _verify_segments(folder: Path, report: Report, advance: Advance, *, recorded_end: int) -> list[tuple[int, int]]:
    """The partition's segments; listed again when one of them goes before it is read (retention, delete-records
    or a cleaner's swap in another process renamed it), what the changed listing found dropped. Returns the ranges
    of offsets in no segment."""
    advanced = 0  # bytes the progress bar moved for this partition: a listing checked again moves it past them only

    def verify_listing() -> tuple[Report, list[tuple[int, int]]]:
        checked = 0

        def advance_past_earlier_attempts(count: int) -> None:
            nonlocal advanced, checked
            checked += count
            if checked > advanced:
                advance(checked - advanced)
                advanced = checked

        found = Report()
        return found, _verify_listed_segments(folder, found, advance_past_earlier_attempts, recorded_end=recorded_end)

    found, gaps = listed_again_while_files_go(verify_listing)
    report.problems += found.problems
    report.warnings += found.warnings
    report.segments += found.segments
    report.batches += found.batches
    report.bytes_checked += found.bytes_checked
    return gaps


def _verify_listed_segments(folder: Path, report: Report, advance: Advance, *, recorded_end: int) -> (
    list[tuple[int, int]]
):
    """A partition no one has appended to yet has no segment file (its first open creates it): that is sound,
    unless the recovery-point checkpoint says it once held messages. Each segment starts where the one before it
    ends (a cleaner's output keeps the offset range of what it replaces), so a gap between two is a segment lost;
    not judged while a cleaner's swap is under way (a ``.swap`` log), as the listing may lack what it replaces."""
    logs = _segment_logs(folder)
    segments = [(name, base) for name, base, temp in logs if temp is None]
    swapping = any(temp == SWAP_SUFFIX for _, _, temp in logs)
    if not segments and recorded_end > 0:
        report.problems.append(f"{folder}: no segment files, though the recovery-point checkpoint records "
                               f"messages up to offset {recorded_end}")
    next_offset: int | None = None
    gaps = []
    for index, (name, base_offset) in enumerate(segments):
        path = folder / name
        is_last = index == len(segments) - 1
        report.segments += 1
        if next_offset is not None and base_offset < next_offset:
            report.problems.append(f"{path}: starts at offset {base_offset}, below the previous segment's end "
                                   f"{next_offset}")
        elif next_offset is not None and base_offset > next_offset and not swapping:
            report.problems.append(f"{path}: starts at offset {base_offset}, but the segment before it ends at "
                                   f"{next_offset}: offsets {next_offset} to {base_offset - 1} are in no segment (a "
                                   "segment file lost or emptied)")
            gaps.append((next_offset, base_offset - 1))
        scanned = _check_batches(path, report, first_allowed=base_offset,
                                 torn_tail_from=recorded_end if is_last else None)
        size_bytes = path.stat().st_size
        if (scanned[-1].header.end_position if scanned else 0) < size_bytes:
            next_offset = None  # it ends in bytes that do not parse (named above): where is not known
        else:
            next_offset = scanned[-1].header.next_offset if scanned else max(next_offset or 0, base_offset)
        headers = [batch.header for batch in scanned]
        _check_offset_index(path.with_suffix(".index"), base_offset, headers, report)
        _check_time_index(path.with_suffix(".timeindex"), base_offset, headers, report, sealed=not is_last)
        advance(size_bytes)
    return gaps


def _check_batches(path: Path, report: Report, *, first_allowed: int, torn_tail_from: int | None) -> (
    list[ScannedBatch]
):
    """Every batch of the file: CRC and increasing offsets; the scanned batches, in file order. Bytes after the
    last complete batch are a write in progress or a torn tail (a warning) only where one can be: in the active
    segment (``torn_tail_from`` given), above the recovery point ``torn_tail_from``."""
    file = BatchFile(path)
    scanned = list(file.scan())
    expected = first_allowed
    for batch in scanned:
        header = batch.header
        report.batches += 1
        if not batch.crc_valid:
            report.problems.append(f"{path}: batch at position {header.position} (offsets {header.base_offset} to "
                                   f"{header.last_offset}): {batch.crc_problem}")
        if header.base_offset < expected:
            report.problems.append(f"{path}: batch at position {header.position} starts at offset "
                                   f"{header.base_offset}, below {expected}")
        expected = header.next_offset
    report.bytes_checked += file.size_bytes
    if file.tail is not None:
        finding = (f"{path}: {file.tail.remaining_bytes} bytes at position {file.tail.position} are not a complete "
                   f"batch ({file.tail.reason})")
        if torn_tail_from is not None and expected >= torn_tail_from:
            report.warnings.append(finding + "; a write in progress, or a torn tail the next writer cuts")
        elif torn_tail_from is not None:
            report.problems.append(finding + f"; offset {expected} on was fsynced (the recovery point is "
                                   f"{torn_tail_from}), so this is damage, not a torn write")
        else:
            report.problems.append(finding)
    return scanned


def _check_offset_index(path: Path, base_offset: int, headers: list[BatchHeader], report: Report) -> None:
    index = OffsetIndex(path)
    if not index.load():
        report.warnings.append(f"{path}: missing or not whole entries; rebuilt when the partition is opened")
        return
    _check_offset_entries(str(path), index, base_offset, headers, report)


def _check_offset_entries(path: str, index: OffsetIndex, base_offset: int, headers: list[BatchHeader],
                          report: Report) -> None:
    starts = {header.position: header.base_offset - base_offset for header in headers}
    previous = (-1, -1)
    for number, (relative, position) in enumerate(zip(index.keys, index.values, strict=True)):
        if starts.get(position) != relative:
            report.problems.append(f"{path}: entry {number} (offset {base_offset + relative}, position {position}) "
                                   "does not point at the batch holding that offset")
        if (relative, position) <= previous:
            report.problems.append(f"{path}: entry {number} is not above the one before it")
        previous = (relative, position)


def _check_time_index(path: Path, base_offset: int, headers: list[BatchHeader], report: Report, *,
                      sealed: bool) -> None:
    index = TimeIndex(path)
    if not index.load():
        report.warnings.append(f"{path}: missing or not whole entries; rebuilt when the partition is opened")
        return
    _check_time_entries(str(path), index, base_offset, headers, report, sealed=sealed)


def _check_time_entries(path: str, index: TimeIndex, base_offset: int, headers: list[BatchHeader],
                        report: Report, *, sealed: bool) -> None:
    """Each entry (T, o) says every message of the batches before offset o has a timestamp at most T."""
    bases = [header.base_offset - base_offset for header in headers]
    running_max, maxima = -1, []
    for header in headers:
        running_max = max(running_max, header.max_timestamp)
        maxima.append(running_max)
    end = headers[-1].next_offset - base_offset if headers else 0
    previous_timestamp = None
    for number, (timestamp, relative) in enumerate(zip(index.keys, index.values, strict=True)):
        before = bisect.bisect_left(bases, relative)
        if relative != end and (before == len(bases) or bases[before] != relative):
            report.problems.append(f"{path}: entry {number} names offset {base_offset + relative}, where no batch "
                                   "starts")
        elif before and maxima[before - 1] > timestamp:
            report.problems.append(f"{path}: entry {number} says timestamps before offset {base_offset + relative} "
                                   f"are at most {timestamp}, but one is {maxima[before - 1]}")
        if previous_timestamp is not None and timestamp <= previous_timestamp:
            report.problems.append(f"{path}: entry {number} is not above the one before it")
        previous_timestamp = timestamp
    if sealed and headers and (not index.keys or index.keys[-1] < maxima[-1]):
        report.warnings.append(f"{path}: a sealed segment's time index does not end with its largest timestamp")


def _verify_compacted(folder: Path, report: Report, *, end_offset: int | None) -> None:
    """``end_offset``: the raw log's (None when its open failed: the horizon is then not checked against it)."""
    ledgers = CompactedLedgers(folder)
    try:
        cursor = ledgers.read_cursor()
    except LedgerviewError as error:
        report.problems.append(str(error))
        return
    if cursor is None:
        try:
            ledgers.check_cursor_not_lost()
        except LostCursorError as error:
            report.problems.append(str(error))
        return
    if end_offset is not None and cursor.horizon >= end_offset:
        report.problems.append(f"{ledgers.cursor_path}: names horizon {cursor.horizon}, at or above the partition's "
                               f"end offset {end_offset}: it would serve a view of messages the log does not hold")
    lower: list[LowerLayer] = []
    try:
        lower = read_layer_record(ledgers.layer_record_path(cursor.ledger_id))
    except FileNotFoundError:
        if cursor.lower_layers or cursor.recorded(cursor.ledger_id):  # an earlier release's view has none
            report.problems.append(f"{ledgers.cursor_path}: names ledger {cursor.ledger_id}, published with a layer "
                                   f"record, but {ledgers.layer_record_path(cursor.ledger_id)} is missing")
            return
    except LedgerviewError as error:
        report.problems.append(str(error))
        return
    if tuple(layer.ledger_id for layer in lower) != cursor.lower_layers:
        report.problems.append(f"{ledgers.cursor_path}: names ledgers {cursor.lower_layers} beneath ledger "
                               f"{cursor.ledger_id}, its layer record {[layer.ledger_id for layer in lower]}")
        return
    live = 0
    for ledger_id, horizon, deleted in [*((layer.ledger_id, layer.horizon, layer.deleted) for layer in lower),
                                        (cursor.ledger_id, cursor.horizon, None)]:
        messages = _verify_ledger(folder, ledger_id, horizon, report, cursor_path=ledgers.cursor_path)
        if messages is None:
            return
        if deleted is not None and len(deleted) != messages:
            report.problems.append(f"{ledger_file(folder, ledger_id)}: holds {messages} messages, its layer record "
                                   f"counts {len(deleted)}")
            return
        live += messages - (int(deleted.sum()) if deleted is not None else 0)
    if live != cursor.messages_kept:
        report.problems.append(f"{ledgers.cursor_path}: says its view serves {cursor.messages_kept} messages, its "
                               f"ledgers hold {live} live ones")


def _verify_ledger(folder: Path, ledger_id: int, horizon: int, report: Report, *, cursor_path: Path) -> int | None:
    """Check one ledger of the view and its key index; returns the messages it holds (None: it is missing)."""
    path = ledger_file(folder, ledger_id)
    if not path.exists():
        report.problems.append(f"{cursor_path}: names ledger {ledger_id}, but {path} is missing")
        return None
    report.ledgers += 1
    scanned = _check_batches(path, report, first_allowed=0, torn_tail_from=None)
    keyed = _keyed_messages(path, scanned, report)
    messages = sum(batch.header.record_count for batch in scanned)
    if scanned and scanned[-1].header.last_offset > horizon:
        report.problems.append(f"{path}: holds offset {scanned[-1].header.last_offset}, above the horizon "
                               f"{horizon}")
    try:
        keys = KeyIndex(key_index_folder(folder, ledger_id))
    except FileNotFoundError:
        report.problems.append(f"{key_index_folder(folder, ledger_id)}: is missing")
        return messages
    if not keys.indexed:  # written without one (compaction.key.index false): lookups read the ledger's keys
        keys.close()
        return messages
    try:
        indexed = sum(1 for _ in keys.keys())  # noqa: SIM118  # KeyIndex is no dict
    except UnreadableKeyIndexError as error:
        report.warnings.append(f"{error} Not checked.")
        return messages
    except CorruptKeyIndexError as error:
        report.problems.append(str(error))
        return messages
    finally:
        keys.close()
    if keyed is not None and indexed != keyed:
        report.problems.append(f"{key_index_folder(folder, ledger_id)}: indexes {indexed} keys, the ledger "
                               f"holds {keyed} keyed messages")
    return messages


def _first_ledger_offset(folder: Path) -> int:
    """The first offset a damaged view holds, from which a rebuild needs the raw log: its bottom ledger's first
    batch, trusted only when its CRC checks (a damaged header could name any offset); 0 when unknown."""
    try:
        cursor = CompactedLedgers(folder).read_cursor()
        first = next(BatchFile(ledger_file(folder, cursor.ledger_ids[0])).scan(), None) if cursor else None
    except (LedgerviewError, OSError):
        return 0
    return first.header.base_offset if first is not None and first.crc_valid else 0


def _keyed_messages(path: Path, scanned: list[ScannedBatch], report: Report) -> int | None:
    file = BatchFile(path)
    keyed = 0
    for batch in scanned:
        if not batch.crc_valid:  # named already; what its payload decodes to means nothing
            return None
        try:
            keys = file.decode(batch.header).column(2)
        except BatchFormatError as error:
            report.problems.append(f"{path}: batch at position {batch.header.position}: {error.reason}")
            return None
        keyed += len(keys) - keys.null_count
    return keyed


def _verify_subscriptions(folder: Path, partition: int, report: Report) -> None:
    for name in _names(folder / SUBSCRIPTIONS_FOLDER):
        if name.endswith(".json"):
            try:
                read_subscription_cursor(folder, name.removesuffix(".json"), partition)
            except LedgerviewError as error:
                report.problems.append(str(error))


def _names(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in folder.iterdir())
    except FileNotFoundError:
        return []
