"""In-place cleaning of one partition log: Kafka's ``Cleaner.doClean`` over ledgerview's segments.

The log is a clean section (cleaned before: every key at most once), then a dirty section from the first dirty
offset (the cleaner checkpoint) to the first uncleanable offset (policy: storage/cleaner_manager.py). One pass:

1. Key map (``build_key_map``): read the key and offset columns of the dirty range batch by batch, fingerprint the
   keys (storage/fingerprint.py, 16 bytes a key whatever its length, as Kafka's MD5) and keep the latest offset per
   fingerprint: each window of rows is aggregated with Arrow's hash aggregation (latest and first offset per key),
   then merged into the map, sorted numpy arrays, without hashing the map again. The map is sorted by the
   fingerprints' high 64 bits and keeps their low 64 bits beside; a message counts as an entry's key only when
   both halves match. Two keys of the dirty range that share the high half (about 1 pair in 2**64) make that entry
   ambiguous: no message with those high bits is removed by this pass. Keyless messages do not enter it. The map
   holds at most ``max_entries`` keys (the memory budget): when a window would pass that, the map takes only the
   keys first seen before the first key that does not fit, and the pass ends there: its end offset is that key's
   first offset (Kafka's partial clean, KAFKA-3894). The next pass starts from it.
2. Groups (``group_segments``): the segments from the log's first through the one holding end - 1, in consecutive
   runs whose sizes add up to at most segment.bytes and whose offsets fit 32-bit relative offsets. Each pass
   rewrites the clean section too, so keys there that the dirty range superseded go.
3. Each group is rewritten into one ``.cleaned`` segment named after the group's first base offset (``_clean_group``).
   A message at offset o stays by these rules:
   - o >= end: kept as it is (beyond this pass's map);
   - no key: dropped and counted (such messages reach a compacted log only if its policy changed);
   - o >= first dirty offset: kept when it is its key's latest message in the map (or its entry is ambiguous);
   - o < first dirty offset: kept when its key is not in the map (otherwise a newer message of the key follows);
   - a tombstone that passes these rules stays while its batch carries no delete horizon, or the pass's clock is
     before that horizon; the first pass that keeps a tombstone stamps its output batch with
     now + delete.retention.ms (Kafka's KIP-534), and a later pass at or past it removes the tombstone.
   Surviving messages keep their offsets, order, timestamps and headers. Output batches gather the survivors of
   consecutive input batches up to OUTPUT_BATCH_BYTES; an input batch that keeps every message and needs no new
   stamp is copied byte for byte; tombstones with different horizons never share a batch (a shared, later
   horizon would keep the older ones past their time). The last output batch's offset range is stretched to the
   group's end, and a group left with no message keeps one empty batch over its range, so the cleaned segment
   covers exactly the offsets of the segments it replaces: recovery and readers rely on it (storage/loader.py).
4. Swap the cleaned segment in (``PartitionLog.replace_segments``), one group at a time; readers see each group
   cleaned at once.
5. The caller moves the cleaner checkpoint to the end offset only after the whole pass; an aborted or failed pass
   removes its ``.cleaned`` files and leaves the checkpoint, so the next pass starts over from it.

The caller holds the partition's writer lock for the whole pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from storage.codec import (
    HEADER_BYTES,
    BatchHeader,
    EncodedBatch,
    decode_payload,
    encode_batch,
    payload_of,
    with_checksum,
)
from storage.errors import LedgerviewError
from storage.fingerprint import wide_fingerprints
from storage.partition_log import MAX_BATCH_MESSAGES, MAX_RELATIVE_OFFSET, TARGET_BATCH_BYTES, PartitionLog
from storage.schema import STORED_SCHEMA
from storage.segment import JOINED_READ_BYTES, Segment

OUTPUT_BATCH_BYTES = TARGET_BATCH_BYTES
MAP_ENTRY_BYTES = 48
"""Memory per key-map entry: fingerprint and offset (24 bytes, as Kafka's map takes), twice while a merge builds
the new arrays."""
WINDOW_ROW_BYTES = 128
"""Memory per dirty message waiting in a window: its fingerprint and offset (24 bytes) and, at worst (every key
distinct), what Arrow's hash aggregation of the window allocates for it (104 bytes by its memory pool's peak for
1M distinct 16-byte keys)."""
ShouldAbort = Callable[[], bool]


class CleaningAbortedError(LedgerviewError):
    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(
            f"Cleaning of {topic}-{partition} was aborted; its cleaned files were removed and its checkpoint did "
            "not move. Resume the partition to clean it again."
        )


@dataclass
class CleanerStats:
    """What one pass over one partition did (Kafka's CleanerStats)."""

    topic: str
    partition: int
    first_dirty_offset: int
    """Where the dirty range began (the checkpoint before the pass)."""
    end_offset: int = 0
    """Where this pass's map ended: the checkpoint after it, the first offset the next pass treats as dirty."""
    dirty_ratio: float = 0.0
    """Cleanable bytes / (clean + cleanable bytes) when the partition was chosen."""
    map_entries: int = 0
    map_capacity: int = 0
    map_full: bool = False
    """The map filled before the end of the dirty range: the pass cleaned part of it (continued next pass)."""
    map_bytes_read: int = 0
    map_messages_read: int = 0
    bytes_read: int = 0
    """Bytes of the segments rewritten (the clean section included)."""
    bytes_written: int = 0
    messages_read: int = 0
    messages_written: int = 0
    keyless_dropped: int = 0
    tombstones_removed: int = 0
    """Tombstones removed because their delete horizon had passed (superseded ones count as superseded)."""
    segments_read: int = 0
    segments_written: int = 0
    map_seconds: float = 0.0
    clean_seconds: float = 0.0

    @property
    def map_utilization(self) -> float:
        return self.map_entries / self.map_capacity if self.map_capacity else 0.0

    @property
    def seconds(self) -> float:
        return self.map_seconds + self.clean_seconds


# ----------------------------------------------------------------------------------------------------- key map
@dataclass(frozen=True)
class KeyMap:
    """The latest offset of every key of the dirty range [first_dirty_offset, end_offset)."""

    fingerprints: np.ndarray
    """uint64, sorted, one per key: the high half of its 128-bit fingerprint."""
    low_fingerprints: np.ndarray
    """uint64, the low half of each entry's fingerprint (meaningless for an ambiguous entry)."""
    latest_offsets: np.ndarray
    """int64, sorted: the offset of each key's latest message."""
    ambiguous: np.ndarray
    """uint64, sorted: the high halves that two keys of the dirty range share (almost always none)."""
    first_dirty_offset: int
    end_offset: int
    full: bool

    def holds(self, high: np.ndarray, low: np.ndarray) -> np.ndarray:
        """Whether each key (given by its fingerprint's halves) is certainly a key of the map: both halves match an
        entry that is not ambiguous."""
        positions, found = _locate(self.fingerprints, high)
        found[found] = self.low_fingerprints[positions[found]] == low[found]
        certain: np.ndarray = found & ~self.ambiguous_among(high)
        return certain

    def ambiguous_among(self, high: np.ndarray) -> np.ndarray:
        """Whether each high half is one of the map's ambiguous entries."""
        if not len(self.ambiguous):
            return np.zeros(len(high), dtype=bool)
        return np.isin(high, self.ambiguous)


@dataclass(frozen=True)
class _PerKey:
    """A window aggregated by key, sorted by the fingerprints' high halves, one row per high half."""

    high: np.ndarray
    offsets: np.ndarray
    """The max or min offset of each."""
    low: np.ndarray
    """The low half of each (of one of its keys when ``mixed``)."""
    mixed: np.ndarray
    """Whether two keys share the high half."""


def _sorted_per_key(wide: np.ndarray, offsets: np.ndarray, aggregate: str) -> _PerKey:
    """Arrow's hash aggregation of a window by its keys' 128-bit fingerprints (``wide``: (rows, 2) uint64, high
    half first), with the max or min offset of each key, then one row per high half (sorted)."""
    keys = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(wide), [None, pa.py_buffer(wide)])
    grouped = pa.table({"k": keys, "o": offsets}).group_by("k", use_threads=False).aggregate([("o", aggregate)])
    distinct = grouped.column("k").combine_chunks()
    halves = np.frombuffer(distinct.buffers()[1], np.uint64, 2 * len(distinct), 16 * distinct.offset).reshape(-1, 2)
    order = np.argsort(halves[:, 0])
    high, low = halves[order, 0], halves[order, 1]
    per_key = grouped.column(f"o_{aggregate}").to_numpy()[order]
    starts = np.flatnonzero(np.concatenate([[True], high[1:] != high[:-1]])) if len(high) else np.arange(0)
    if len(starts) == len(high):  # the usual case: no two keys share the high half
        return _PerKey(high, per_key, low, np.zeros(len(high), dtype=bool))
    reduce = np.maximum if aggregate == "max" else np.minimum
    mixed = np.diff(np.append(starts, len(high))) > 1
    return _PerKey(high[starts], reduce.reduceat(per_key, starts), low[starts], mixed)


def _inserted_slots(positions: np.ndarray, existing: int) -> np.ndarray:
    """Which slots of the merged array the new values take, given their (non-decreasing) insert positions."""
    slots = np.zeros(existing + len(positions), dtype=bool)
    slots[positions + np.arange(len(positions))] = True
    return slots


def _fill(inserted: np.ndarray, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    merged = np.empty(len(inserted), dtype=old.dtype)
    merged[inserted] = new
    merged[~inserted] = old
    return merged


def _locate(sorted_set: np.ndarray, sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each value goes in the set, and whether it is there already (sorted values make the search one
    cache-friendly sweep rather than a random binary search each)."""
    positions = np.searchsorted(sorted_set, sorted_values)
    inside = positions < len(sorted_set)
    found = np.zeros(len(sorted_values), dtype=bool)
    found[inside] = sorted_set[positions[inside]] == sorted_values[inside]
    return positions, found


@dataclass
class _MapBuilder:
    """The key map being built: fingerprints (sorted by their high halves) and the latest offset of each."""

    max_entries: int
    window_rows: int
    fingerprints: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    low_fingerprints: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    latest: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ambiguous: set[int] = field(default_factory=set)
    window: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    window_size: int = 0
    full_at: int | None = None
    """The offset of the first message whose key did not fit, once the map is full."""

    def add(self, wide: np.ndarray, offsets: np.ndarray) -> None:
        """``wide``: the keys' fingerprints, (rows, 2) uint64, high half first."""
        self.window.append((wide, offsets))
        self.window_size += len(offsets)
        if self.window_size >= self.window_rows:
            self.merge()

    def merge(self) -> None:
        """Fold the window into the map (window offsets are all newer, so a key's largest offset there is its
        latest); on overflow, take only the messages before the first key that does not fit."""
        if not self.window:
            return
        wide, offsets = (np.concatenate([part[column] for part in self.window]) for column in range(2))
        self.window, self.window_size = [], 0
        latest = _sorted_per_key(wide, offsets, "max")
        positions, known = _locate(self.fingerprints, latest.high)
        room = self.max_entries - len(self.fingerprints)
        if len(known) - int(known.sum()) > room:
            first_seen = _sorted_per_key(wide, offsets, "min").offsets  # the same keys, in the same order
            self.full_at = int(np.sort(first_seen[~known])[room])
            before = offsets < self.full_at
            latest = _sorted_per_key(wide[before], offsets[before], "max")
            positions, known = _locate(self.fingerprints, latest.high)
        del wide, offsets
        known_at = positions[known]
        differs = latest.mixed[known] | (self.low_fingerprints[known_at] != latest.low[known])
        self.ambiguous.update(latest.high[~known][latest.mixed[~known]].tolist())
        self.ambiguous.update(latest.high[known][differs].tolist())
        self.latest[known_at] = latest.offsets[known]
        inserted = _inserted_slots(positions[~known], len(self.fingerprints))
        self.fingerprints = _fill(inserted, self.fingerprints, latest.high[~known])
        self.low_fingerprints = _fill(inserted, self.low_fingerprints, latest.low[~known])
        self.latest = _fill(inserted, self.latest, latest.offsets[~known])

    def finish(self, first_dirty_offset: int, end_offset: int) -> KeyMap:
        if self.full_at is None:
            self.merge()
        end = end_offset if self.full_at is None else self.full_at
        return KeyMap(self.fingerprints, self.low_fingerprints, np.sort(self.latest),
                      np.array(sorted(self.ambiguous), dtype=np.uint64), first_dirty_offset, end, end < end_offset)


def build_key_map(log: PartitionLog, first_dirty_offset: int, end_offset: int, *, max_entries: int,
                  window_rows: int, stats: CleanerStats, should_abort: ShouldAbort) -> KeyMap:
    """Step 1 of the module docstring over [first_dirty_offset, end_offset)."""
    builder = _MapBuilder(max_entries=max_entries, window_rows=window_rows)
    for segment in _segments_between(log, first_dirty_offset, end_offset):
        for batch in segment.read_batches(first_dirty_offset, end_offset, verify=True, join_bytes=JOINED_READ_BYTES):
            if should_abort():
                raise CleaningAbortedError(log.topic, log.partition)
            keys = batch.column(2)
            offsets = batch.column(0).to_numpy()
            wide = wide_fingerprints(keys)
            if keys.null_count:
                keyed = keys.is_valid().to_numpy(zero_copy_only=False)
                wide, offsets = wide[keyed], offsets[keyed]
            builder.add(wide, offsets)
            stats.map_messages_read += batch.num_rows
            stats.map_bytes_read += batch.nbytes
            if builder.full_at is not None:
                break
        if builder.full_at is not None:
            break
    key_map = builder.finish(first_dirty_offset, end_offset)
    stats.map_entries, stats.map_capacity, stats.map_full = len(key_map.fingerprints), max_entries, key_map.full
    return key_map


def _segments_between(log: PartitionLog, start: int, end: int) -> list[Segment]:
    return [segment for segment in log.segments
            if segment.base_offset < end and segment.next_offset > start and segment is not log.active]


# ------------------------------------------------------------------------------------------------------ groups
def group_segments(log: PartitionLog, end_offset: int, *, max_bytes: int) -> list[list[Segment]]:
    """Step 2: consecutive runs of the segments before the one holding ``end_offset`` (or before the active)."""
    segments = [segment for segment in log.segments[:-1] if segment.base_offset < end_offset]
    groups: list[list[Segment]] = []
    for i, segment in enumerate(segments):
        if groups and _fits(groups[-1], segment, log.segments[i + 1].base_offset, max_bytes):
            groups[-1].append(segment)
        else:
            groups.append([segment])
    return groups


def _fits(group: list[Segment], segment: Segment, segment_end: int, max_bytes: int) -> bool:
    size = sum(member.size_bytes for member in group) + segment.size_bytes
    return size <= max_bytes and segment_end - 1 - group[0].base_offset <= MAX_RELATIVE_OFFSET


# ----------------------------------------------------------------------------------------------------- rewrite
@dataclass
class _Pending:
    """Survivors of consecutive input batches waiting to become one output batch."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    size_bytes: int = 0
    rows: int = 0
    base_offset: int = 0
    last_offset: int = 0
    attributes: BatchHeader | None = None
    """The header whose compression and timestamp type the output batch keeps (the first input's)."""
    horizon_ms: int | None = None
    """The delete horizon of the tombstones gathered so far (None: none gathered)."""


class _GroupWriter:
    """Writes one group's output batches into the cleaned segment; holds back the last one, whose offset range is
    stretched to the group's end when the group is finished."""

    def __init__(self, cleaned: Segment, group_end: int, stats: CleanerStats) -> None:
        self.cleaned = cleaned
        self.group_end = group_end
        self.stats = stats
        self.pending = _Pending()
        self.held: EncodedBatch | None = None

    def add(self, header: BatchHeader, batch: pa.RecordBatch, horizon_ms: int | None,
            offset_range: tuple[int, int]) -> None:
        """Survivors of (part of) the input batch ``header`` covering ``offset_range``; ``horizon_ms``: their
        tombstones' horizon (None: they hold none to stamp)."""
        pending = self.pending
        if pending.attributes is not None and (
                pending.attributes.attributes & 0b111 != header.attributes & 0b111
                or (horizon_ms is not None and pending.horizon_ms not in (None, horizon_ms))
                or pending.size_bytes + batch.nbytes > OUTPUT_BATCH_BYTES
                or pending.rows + batch.num_rows > MAX_BATCH_MESSAGES):
            self.flush()
            pending = self.pending
        if pending.attributes is None:
            pending.attributes, pending.base_offset = header, offset_range[0]
        pending.batches.append(batch)
        pending.size_bytes += batch.nbytes
        pending.rows += batch.num_rows
        pending.last_offset = offset_range[1]
        pending.horizon_ms = horizon_ms if horizon_ms is not None else pending.horizon_ms

    def copy(self, encoded: EncodedBatch) -> None:
        """An input batch kept whole, byte for byte."""
        self.flush()
        self._write(encoded)

    def flush(self) -> None:
        pending = self.pending
        if pending.attributes is None:
            return
        batch = pending.batches[0] if len(pending.batches) == 1 else pa.concat_batches(pending.batches)
        source = pending.attributes
        self._write(encode_batch(batch, compression=source.compression, log_append_time=bool(source.attributes & 0b100),
                                 offset_range=(pending.base_offset, pending.last_offset),
                                 delete_horizon_ms=pending.horizon_ms))
        self.pending = _Pending()

    def _write(self, encoded: EncodedBatch) -> None:
        if self.held is not None:
            self.cleaned.append(self.held)
            self.stats.bytes_written += self.held.header.batch_length
        self.held = encoded

    def finish(self, group_start: int, max_timestamp: int) -> None:
        """Write the held batch with its range stretched to the group's end (or one empty batch over the
        group when nothing survived)."""
        self.flush()
        held = self.held
        if held is None:
            empty = pa.RecordBatch.from_pylist([], schema=STORED_SCHEMA)
            held = encode_batch(empty, offset_range=(group_start, self.group_end - 1),
                                timestamp_range=(max_timestamp, max_timestamp))
        elif held.header.next_offset != self.group_end:
            stretched = BatchHeader(**{**_fields(held.header), "last_offset_delta":
                                       self.group_end - 1 - held.header.base_offset})
            held = with_checksum(stretched, held.payload)
        self.cleaned.append(held)
        self.stats.bytes_written += held.header.batch_length
        self.held = None


def _fields(header: BatchHeader) -> dict[str, int]:
    return {name: getattr(header, name) for name in BatchHeader.__slots__}


def _stored_batches(segment: Segment) -> Iterator[tuple[BatchHeader, pa.Buffer]]:
    taken = segment.take_bytes()
    for header in segment.scan(0, verify=True, taken=taken):
        yield header, taken.buffer


def _clean_group(log: PartitionLog, group: list[Segment], group_end: int, key_map: KeyMap, *, now_ms: int,
                 stats: CleanerStats, should_abort: ShouldAbort) -> Segment:
    """Step 3 for one group: the ``.cleaned`` segment, written but not yet sealed."""
    cleaned = log.create_cleaned_segment(group[0].base_offset)
    writer = _GroupWriter(cleaned, group_end, stats)
    new_horizon_ms = now_ms + log.config.delete_retention_ms
    try:
        for segment in group:
            stats.bytes_read += segment.size_bytes
            stats.segments_read += 1
            for header, buffer in _stored_batches(segment):
                if should_abort():
                    raise CleaningAbortedError(log.topic, log.partition)
                _clean_batch(header, buffer, key_map, writer, now_ms=now_ms, new_horizon_ms=new_horizon_ms,
                             stats=stats)
        writer.finish(group[0].base_offset, max(segment.max_timestamp for segment in group))
    except BaseException:
        cleaned.close()
        for path in (cleaned.log_path, cleaned.offset_index.path, cleaned.time_index.path):
            path.unlink(missing_ok=True)
        raise
    return cleaned


def _clean_batch(header: BatchHeader, buffer: pa.Buffer, key_map: KeyMap, writer: _GroupWriter, *, now_ms: int,
                 new_horizon_ms: int, stats: CleanerStats) -> None:
    """Apply step 3's rules to one input batch and hand its survivors to the writer."""
    stats.messages_read += header.record_count
    if header.base_offset >= key_map.end_offset or header.record_count == 0:
        if header.record_count:
            stats.messages_written += header.record_count
            writer.copy(_raw(header, buffer))
        return
    batch = decode_payload(buffer, header)
    keep, end_row = _survivors(batch, key_map, stats)
    values = batch.column(3)
    tombstones = keep & values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    horizon_ms = None
    if tombstones is not None:
        tombstones[end_row:] = False  # beyond the map: copied as they are, neither stamped nor removed
        if tombstones.any():
            horizon_ms = header.delete_horizon_ms
            if horizon_ms is not None and now_ms >= horizon_ms:
                stats.tombstones_removed += int(tombstones.sum())
                keep &= ~tombstones
                horizon_ms = None
            elif horizon_ms is None:
                horizon_ms = new_horizon_ms
    kept = int(keep.sum())
    stats.messages_written += kept
    if kept == batch.num_rows and horizon_ms == header.delete_horizon_ms:
        writer.copy(_raw(header, buffer))
        return
    offsets = batch.column(0).to_numpy()
    if end_row == batch.num_rows:
        if kept:
            writer.add(header, batch.filter(pa.array(keep)), horizon_ms, (header.base_offset, header.last_offset))
        return
    # The batch where the map ended: what lies beyond is a batch of its own, never stamped with this horizon.
    if keep[:end_row].any():
        writer.add(header, batch.slice(0, end_row).filter(pa.array(keep[:end_row])), horizon_ms,
                   (header.base_offset, int(offsets[end_row - 1])))
    writer.flush()
    writer.add(header, batch.slice(end_row).filter(pa.array(keep[end_row:])), None,
               (int(offsets[end_row]), header.last_offset))
    writer.flush()


def _survivors(batch: pa.RecordBatch, key_map: KeyMap, stats: CleanerStats) -> tuple[np.ndarray, int]:
    """Which messages of a batch pass the key rules of step 3 (tombstone horizons aside), and the row where the
    map's range ends."""
    offsets = batch.column(0).to_numpy()
    keys = batch.column(2)
    dirty_start, end = (int(row) for row in np.searchsorted(offsets, [key_map.first_dirty_offset,
                                                                       key_map.end_offset]))
    keep = np.ones(len(offsets), dtype=bool)
    if dirty_start < end:  # dirty messages: only each key's latest
        latest = key_map.latest_offsets
        low, high = np.searchsorted(latest, [offsets[dirty_start], offsets[end - 1] + 1])
        keep[dirty_start:end] = False
        keep[dirty_start + np.searchsorted(offsets[dirty_start:end], latest[low:high])] = True
        if len(key_map.ambiguous):
            dirty = wide_fingerprints(keys.slice(dirty_start, end - dirty_start))
            keep[dirty_start:end] |= key_map.ambiguous_among(dirty[:, 0])
    if dirty_start > 0:  # the clean section: keys the dirty range did not supersede
        clean = wide_fingerprints(keys.slice(0, dirty_start))
        keep[:dirty_start] = ~key_map.holds(clean[:, 0], clean[:, 1])
    if keys.null_count:
        keyless = keys.is_null().to_numpy(zero_copy_only=False)
        keyless[end:] = False
        stats.keyless_dropped += int(keyless.sum())
        keep &= ~keyless
    return keep, end


def _raw(header: BatchHeader, buffer: pa.Buffer) -> EncodedBatch:
    """An input batch as it is stored, ready to append elsewhere."""
    header_bytes = buffer.slice(header.position, HEADER_BYTES).to_pybytes()
    return EncodedBatch(BatchHeader(**{**_fields(header), "position": 0}), header_bytes, (payload_of(buffer, header),))


# -------------------------------------------------------------------------------------------------------- pass
def clean_log(log: PartitionLog, first_dirty_offset: int, first_uncleanable_offset: int, *, now_ms: int,
              max_map_entries: int, window_rows: int, stats: CleanerStats, should_abort: ShouldAbort) -> CleanerStats:
    """One pass (steps 1 to 4 of the module docstring); the caller holds the writer lock and moves the
    checkpoint to ``stats.end_offset`` afterwards."""
    started = time.perf_counter()
    key_map = build_key_map(log, first_dirty_offset, first_uncleanable_offset, max_entries=max_map_entries,
                            window_rows=window_rows, stats=stats, should_abort=should_abort)
    stats.end_offset = key_map.end_offset
    mapped = time.perf_counter()
    stats.map_seconds = mapped - started
    for group in group_segments(log, key_map.end_offset, max_bytes=log.config.segment_bytes):
        following = log.segments[log.segments.index(group[-1]) + 1]
        cleaned = _clean_group(log, group, following.base_offset, key_map, now_ms=now_ms, stats=stats,
                               should_abort=should_abort)
        log.replace_segments(cleaned, group, now_ms=now_ms)
        stats.segments_written += 1
    stats.clean_seconds = time.perf_counter() - mapped
    return stats
