"""Opening a partition folder and recovering it after a crash, as Kafka's LogLoader does, in passes.

Runs under the partition's writer lock, so no writer is mid-append and no cleaner mid-swap while it changes files.

1. Remove leftovers: ``*.tmp`` from interrupted atomic writes and ``.deleted`` files whose deletion was scheduled.
2. Finish or roll back an interrupted in-place swap (``complete_interrupted_swaps``; the swap's own steps are in
   ``PartitionLog.replace_segments``):
   a. a ``.cleaned`` file means the swap never reached its commit (the rename of the cleaned log to ``.swap``):
      remove every ``.swap`` file from the lowest ``.cleaned`` base offset up, then every ``.cleaned`` file. The
      old segments are all still in place: rolled back;
   b. a ``.swap`` log is a committed swap: open it, take the range it replaces, ``[its base, its next offset)``
      (the cleaner keeps the offset range of what it replaced, see storage/cleaner.py), remove every other
      segment file in that range (old segments not yet renamed ``.deleted``, or the new segment's own indexes
      already renamed), then rename the ``.swap`` files to their final names: rolled forward.
3. Remove index files whose log is gone.
4. Load every segment below the recovery point without verifying it: its indexes are kept when they look sound
   and rebuilt from batch headers otherwise.
5. Recover every segment from the one holding the recovery point on: verify the CRC of each batch from the
   recovery point on (earlier ones were fsynced) and the order of offsets, and rebuild the indexes. The segment
   holding the recovery point keeps its sound indexes' entries up to the last indexed batch at or before it, and
   is read from that batch (``Segment.rebuild_indexes``), so an open after a clean close reads little. An invalid
   batch in the last segment above the recovery point is a torn tail: cut the log back to the last batch that
   verifies. An invalid batch in an earlier segment, or below the recovery point (its bytes were fsynced), is
   corruption: raise CorruptSegmentError naming the file and position, and change nothing.
6. With no segment at all, create an empty one at the log start offset.

Readers (``read_segments``) change nothing and see a swap in progress the way pass 2 would finish it: a ``.swap``
log stands for the segments in its range, so a listing taken at any step of a swap is either the old segments or
the new one, never a mix with a hole.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from storage.errors import CorruptSegmentError
from storage.fileio import fsync_folder, remove_stray_temporary_files
from storage.files import CLEANED_SUFFIX, DELETED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, parse_segment_file
from storage.segment import Segment

READ_ATTEMPTS = 20
"""A reader lists the folder again when a file it listed was renamed before it opened it (a swap step); each
step leaves a consistent listing, so a few attempts always suffice."""
T = TypeVar("T")


def load_segments(folder: Path, *, recovery_point: int, log_start_offset: int, index_interval_bytes: int) -> (
    list[Segment]
):
    """Return the partition's segments in offset order, the folder recovered as the module docstring says.

    The caller holds the partition's writer lock.
    """
    remove_stray_temporary_files(folder)
    _remove_deleted(folder)
    complete_interrupted_swaps(folder, index_interval_bytes=index_interval_bytes)
    bases = _remove_orphan_indexes_and_list_logs(folder)
    if not bases:
        return [Segment.create(folder, log_start_offset, index_interval_bytes=index_interval_bytes)]
    first_to_recover = max((i for i, base in enumerate(bases) if base <= recovery_point), default=0)
    segments = [
        Segment.load(folder, base, index_interval_bytes=index_interval_bytes, recovering=True)
        for base in bases[:first_to_recover]
    ]
    to_recover = bases[first_to_recover:]
    for i, base in enumerate(to_recover):
        segment = Segment(folder, base, index_interval_bytes=index_interval_bytes)
        segment.inode = segment.log_path.stat().st_ino
        failure = segment.rebuild_indexes(verify_from=0, fsynced_below=recovery_point if i == 0 else None)
        if failure is not None:
            if i < len(to_recover) - 1 or segment.next_offset < recovery_point:
                # A sealed segment, or bytes below the recovery point (fsynced before): damage, not a torn write.
                raise CorruptSegmentError(str(segment.log_path), failure.position, segment.next_offset,
                                          failure.reason)
            segment.truncate(segment.size_bytes)
        segments.append(segment)
    return segments


def _segment_files(folder: Path) -> list[tuple[str, int, str, str | None]]:
    """(name, base offset, suffix, temporary suffix) of every segment file in the folder."""
    return [(name, *parsed) for name in os.listdir(folder) if (parsed := parse_segment_file(name))]


def _remove_deleted(folder: Path) -> None:
    """Pass 1: ``.deleted`` files (their delay does not outlive the process that scheduled them). Another
    process's retention may remove one meanwhile: it takes no writer lock for that."""
    for name, _, _, temporary in _segment_files(folder):
        if temporary == DELETED_SUFFIX:
            (folder / name).unlink(missing_ok=True)


def complete_interrupted_swaps(folder: Path, *, index_interval_bytes: int) -> bool:
    """Pass 2 of the module docstring: roll back an uncommitted swap, roll forward a committed one. Returns
    whether anything was changed. The caller holds the partition's writer lock."""
    files = _segment_files(folder)
    cleaned = [base for _, base, _, temporary in files if temporary == CLEANED_SUFFIX]
    lowest_cleaned = min(cleaned, default=None)
    changed = False
    for name, base, _, temporary in files:  # 2a
        if temporary == CLEANED_SUFFIX or (
                temporary == SWAP_SUFFIX and lowest_cleaned is not None and base >= lowest_cleaned):
            (folder / name).unlink()
            changed = True
    swapped = sorted(base for _, base, suffix, temporary in _segment_files(folder)
                     if suffix == LOG_SUFFIX and temporary == SWAP_SUFFIX)
    for base in swapped:  # 2b
        new = Segment.load(folder, base, index_interval_bytes=index_interval_bytes, recovering=False,
                           temporary_suffix=SWAP_SUFFIX)
        for name, other, _, temporary in _segment_files(folder):
            if temporary is None and base <= other < new.next_offset:
                (folder / name).unlink()
        new.close()
        new.rename_files(None)
        changed = True
    if changed:
        fsync_folder(folder)
    return changed


def _remove_orphan_indexes_and_list_logs(folder: Path) -> list[int]:
    """Pass 3: index files without a log; returns the base offsets of the logs."""
    files = _segment_files(folder)
    log_bases = {base for _, base, suffix, temporary in files if suffix == LOG_SUFFIX and temporary is None}
    for name, base, suffix, temporary in files:
        if temporary is None and suffix != LOG_SUFFIX and base not in log_bases:
            (folder / name).unlink()
    return sorted(log_bases)


def read_segments(folder: Path, *, index_interval_bytes: int, known: dict[int, Segment] | None = None) -> (
    list[Segment]
):
    """The partition's segments as they are, for a process that does not hold the writer lock: nothing is
    changed on disk, and the last segment ends at its last complete batch (another process may be writing).
    A ``.swap`` log replaces the segments in its range (see the module docstring). Segments in ``known`` whose
    log is still the same file are reused and caught up rather than loaded again."""
    return listed_again_while_files_go(lambda: _read_segments_once(folder, index_interval_bytes, known or {}))


def listed_again_while_files_go(read: Callable[[], T]) -> T:
    """``read()`` of a partition's files, done again (at most READ_ATTEMPTS times) when a file it listed went before
    it was opened: renamed by a swap step, or removed by retention or delete-records in another process."""
    for attempt in range(READ_ATTEMPTS):
        try:
            return read()
        except FileNotFoundError:
            if attempt == READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _read_segments_once(folder: Path, index_interval_bytes: int, known: dict[int, Segment]) -> list[Segment]:
    logs = {(base, temporary) for _, base, suffix, temporary in _segment_files(folder)
            if suffix == LOG_SUFFIX and temporary in (None, SWAP_SUFFIX)}
    swapped = sorted(base for base, temporary in logs if temporary == SWAP_SUFFIX)
    segments: dict[int, Segment] = {}
    bases = sorted(base for base, temporary in logs if temporary is None)
    for base in bases:  # only the last, the active segment, may have a batch still being written
        segments[base] = _open_for_reading(folder, base, None, index_interval_bytes, known, sealed=base != bases[-1])
    for base in swapped:  # the cleaner never cleans the active segment
        new = _open_for_reading(folder, base, SWAP_SUFFIX, index_interval_bytes, known, sealed=True)
        for replaced in [other for other in segments if base <= other < new.next_offset]:
            del segments[replaced]
        segments[base] = new
    return [segments[base] for base in sorted(segments)]


def _open_for_reading(folder: Path, base: int, temporary_suffix: str | None, index_interval_bytes: int,
                      known: dict[int, Segment], *, sealed: bool) -> Segment:
    segment = known.get(base)
    path = Segment(folder, base, index_interval_bytes=index_interval_bytes,
                   temporary_suffix=temporary_suffix).log_path
    if segment is not None and segment.inode == path.stat().st_ino:
        if segment.temporary_suffix != temporary_suffix:
            segment.follow_rename(temporary_suffix)
        if segment.follow_growth() > segment.size_bytes and sealed:
            segment.raise_unparsed_tail()
        return segment
    return Segment.load(folder, base, index_interval_bytes=index_interval_bytes, recovering=False, sealed=sealed,
                        temporary_suffix=temporary_suffix)
