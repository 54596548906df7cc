"""Opening a partition folder and recovering it after a crash, as Kafka's LogLoader does, in passes.

Runs under the partition's writer lock, so no writer is mid-append while it truncates.

1. Remove leftovers: ``*.tmp`` from interrupted atomic writes, ``.deleted`` files whose deletion was scheduled,
   and index files whose log is gone.
2. Load every segment below the recovery point without verifying it: its indexes are kept when they look sound
   and rebuilt from batch headers otherwise.
3. Recover every segment from the one holding the recovery point on: verify the CRC of each batch from the
   recovery point on (earlier ones were fsynced) and the order of offsets, and rebuild the indexes. An invalid
   batch in the last segment is a torn tail: cut the log back to the last batch that verifies. An invalid batch
   in an earlier segment is corruption of a sealed segment: raise CorruptSegmentError naming the file and
   position, and change nothing.
4. With no segment at all, create an empty one at the log start offset.
"""

from __future__ import annotations

import os
from pathlib import Path

from storage.errors import CorruptSegmentError
from storage.fileio import remove_stray_temporary_files
from storage.files import DELETED_SUFFIX, LOG_SUFFIX, parse_segment_file
from storage.segment import Segment


def load_segments(folder: Path, *, recovery_point: int, log_start_offset: int, index_interval_bytes: int) -> (
    list[Segment]
):
    """Return the partition's segments in offset order, the folder recovered as the module docstring says.

    The caller holds the partition's writer lock.
    """
    remove_stray_temporary_files(folder)
    bases = _remove_leftovers_and_list_logs(folder)
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
        verify_from = _position_before(segment, recovery_point) if i == 0 else 0
        failure = segment.rebuild_indexes(verify_from=verify_from)
        if failure is not None:
            if i < len(to_recover) - 1:
                raise CorruptSegmentError(str(segment.log_path), failure.position, segment.next_offset,
                                          failure.reason)
            segment.truncate(segment.size_bytes)
        segments.append(segment)
    return segments


def _position_before(segment: Segment, recovery_point: int) -> int:
    """A file position at or before the batch holding the recovery point: everything before it was fsynced, so
    only what follows needs its CRC checked. From the segment's own offset index when it looks sound."""
    index = segment.offset_index
    if index.load() and index.is_consistent(segment.log_path.stat().st_size):
        return index.lookup(recovery_point - segment.base_offset)[1]
    return 0


def _remove_leftovers_and_list_logs(folder: Path) -> list[int]:
    names = os.listdir(folder)
    parsed = [(name, result) for name in names if (result := parse_segment_file(name))]
    log_bases = {base for _, (base, suffix, temp) in parsed if suffix == LOG_SUFFIX and temp is None}
    for name, (base, suffix, temp) in parsed:
        if temp == DELETED_SUFFIX or (temp is None and suffix != LOG_SUFFIX and base not in log_bases):
            (folder / name).unlink()
    return sorted(log_bases)




def read_segments(folder: Path, *, index_interval_bytes: int, known: dict[int, Segment] | None = None) -> (
    list[Segment]
):
    """The partition's segments as they are, for a process that does not hold the writer lock: nothing is
    changed on disk, and the last segment ends at its last complete batch (another process may be writing).
    Segments in ``known`` are reused and caught up rather than loaded again."""
    known = known or {}
    bases = sorted(
        parsed[0] for name in os.listdir(folder)
        if (parsed := parse_segment_file(name)) and parsed[1] == LOG_SUFFIX and parsed[2] is None
    )
    segments = []
    for base in bases:
        segment = known.get(base)
        if segment is None:
            segment = Segment.load(folder, base, index_interval_bytes=index_interval_bytes, recovering=False)
        else:
            segment.follow_growth()
        segments.append(segment)
    return segments
