"""Where the deletions a compacted view cannot show lie.

A compaction leaves a key out of its view when the key's latest message is a tombstone, as Pulsar's does, so the
view holds no trace of the deletion. A reader that read the key raw, and must now take the view in place of raw
offsets retention deleted, can learn of the deletion only from the tombstone itself. The compaction cursor
therefore keeps ranges of offsets, ``(first, last)`` inclusive, that hold every tombstone any compaction of the
partition left out; a reader that needs deleted raw offsets meeting one of them may have lost a deletion.

Where nothing is known, the ranges say so by covering it: the raw offsets a compaction never read (retention had
removed them before the first compaction, or before a rebuild), and everything below the horizon of a view an
earlier release published. The ranges are kept few (at most MAX_RANGES): where there would be more, the ones
nearest each other are merged. So a range may also cover offsets that hold no tombstone left out; the answer errs
only that way. Ranges never shrink: a tombstone whose key came back later is still covered, and on a topic that
deletes keys all the time they come to cover most of its history.
"""

from __future__ import annotations

from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

MAX_RANGES: Final = 32
"""Enough to be exact for a topic whose deletions are rare; bounded so the cursor stays a small record."""

Ranges: TypeAlias = tuple[tuple[int, int], ...]


def with_offsets(ranges: Ranges, offsets: npt.NDArray[np.int64], *, limit: int = MAX_RANGES) -> Ranges:
    """``ranges`` grown to cover ``offsets`` too (in any order), at most ``limit`` ranges."""
    offsets = np.asarray(offsets, np.int64)
    return _bounded(np.concatenate([np.array([first for first, _ in ranges], np.int64), offsets]),
                    np.concatenate([np.array([last for _, last in ranges], np.int64), offsets]), limit)


def merged(*parts: Ranges, limit: int = MAX_RANGES) -> Ranges:
    """The ranges of ``parts`` together, at most ``limit`` ranges."""
    every = [pair for part in parts for pair in part]
    if not every:
        return ()
    return _bounded(np.array([first for first, _ in every], np.int64), np.array([last for _, last in every], np.int64),
                    limit)


def after_run(carried: Ranges, horizon: int, raw_start: int, found: Ranges) -> Ranges:
    """What a compaction run records: the ranges of the view it replaces (``carried``, with ``horizon``; earlier
    runs' tombstones are not in its input), the raw offsets it never read (between that horizon and the
    ``raw_start`` it read from: retention removed them first), and the tombstones it left out (``found``)."""
    never_read = ((horizon + 1, raw_start - 1),) if raw_start > horizon + 1 else ()
    return merged(carried, never_read, found)


def of_record(value: list[list[int]] | None, horizon: int) -> Ranges:
    """The ranges a record's field holds, checked; None (the record of an earlier release, which keeps none) is
    anything up to the view's ``horizon``."""
    if value is None:
        return ((0, horizon),) if horizon >= 0 else ()
    ranges = tuple((first, last) for first, last in value)
    check(ranges, horizon)
    return ranges


def check(ranges: Ranges, horizon: int) -> None:
    """ValueError unless ``ranges`` are sorted and lie within offsets 0 to ``horizon``."""
    bounds = [offset for pair in ranges for offset in pair]
    if bounds != sorted(bounds) or any(not 0 <= offset <= horizon for offset in bounds):
        raise ValueError(f"dropped_tombstones {list(ranges)} are not sorted ranges within the horizon {horizon}")


def meeting(ranges: Ranges, first: int, last: int) -> tuple[int, int] | None:
    """The part of the first range that meets offsets ``first`` to ``last`` (inclusive) within them, or None."""
    if first > last:
        return None
    for low, high in ranges:
        if low <= last and high >= first:
            return max(low, first), min(high, last)
    return None


def _bounded(lows: npt.NDArray[np.int64], highs: npt.NDArray[np.int64], limit: int) -> Ranges:
    """Sorted, touching ranges joined, then the smallest gaps closed until ``limit`` ranges remain."""
    if not len(lows):
        return ()
    order = np.argsort(lows, kind="stable")
    lows, reach = lows[order], np.maximum.accumulate(highs[order])
    starts = np.concatenate(([0], np.flatnonzero(lows[1:] > reach[:-1] + 1) + 1))
    ends = np.concatenate((starts[1:] - 1, [len(lows) - 1]))
    firsts, lasts = lows[starts], reach[ends]
    if len(firsts) > limit:
        gaps = firsts[1:] - lasts[:-1]
        kept = np.sort(np.argsort(gaps, kind="stable")[len(gaps) - (limit - 1):]) if limit > 1 else np.empty(0, int)
        firsts, lasts = firsts[np.concatenate(([0], kept + 1))], lasts[np.concatenate((kept, [len(lasts) - 1]))]
    return tuple(zip(firsts.tolist(), lasts.tolist(), strict=True))
