"""In-place cleaning (storage/cleaner.py, storage/cleaner_manager.py): which partitions are cleaned and how far,
grouping, tombstones across passes on an injected clock, the key-map budget, keyless messages, cleaner states,
the checkpoint file, readers during a swap, the two-phase horizon, and the maintenance loop.

Invariants checked (DESIGN.md):

2. Offsets and order never change: every surviving message keeps its offset, the end offset stays, cleaning only
   removes messages (superseded ones, expired tombstones, keyless ones).
4. With two-phase compaction on, cleaning stays below its horizon, so the compacted view is unchanged.
6. A pass that is aborted or fails leaves the segments and the checkpoint as they were.
8. A reader in progress (another store object) finishes its read over the segments it started on.
9. The key map holds at most what the budget allows; past it a pass cleans part and the next one continues.
10. A keyless append to a compact-only topic is refused and nothing is written.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from compactor import Compactor
from readers import Reader
from storage import Store
from storage.cleaner import MAP_ENTRY_BYTES, CleanerStats, CleaningAbortedError, clean_log
from storage.cleaner_manager import CleanerConfig, CleanerStateError, CleaningState
from storage.errors import CorruptSegmentError, KeylessMessageError
from storage.files import CLEANER_OFFSET_CHECKPOINT, WRITER_LOCK, parse_segment_file, partition_folder
from storage.maintenance import MaintenanceLoop
from tests.conftest import ManualClock
from tests.processes.children import Child

HOUR_MS = 3_600_000
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "65536", "index.interval.bytes": "256"}
EAGER = {**COMPACT, "min.cleanable.dirty.ratio": "0"}
"""Any dirty byte makes a partition eligible (the ratio must be strictly above 0)."""
Row = tuple[int, bytes | None, bytes | None]


def changelog(start: int, count: int, *, keys: int = 7, tombstone_every: int = 0, repeat: int = 1) -> (
    list[tuple[bytes, bytes | None]]
):
    return [(f"k{i % keys}".encode(),
             None if tombstone_every and i % tombstone_every == tombstone_every - 1 else f"v{i}".encode() * repeat)
            for i in range(start, start + count)]


def fill(store: Store, topic: str, segments: int, per_segment: int, *, partition: int = 0, start: int = 0,
         **kinds: int) -> list[Row]:
    """``segments`` sealed segments of ``per_segment`` messages; returns every row appended, with offsets."""
    appended: list[Row] = []
    for segment in range(segments):
        messages = changelog(start + segment * per_segment, per_segment, **kinds)
        result = store.append(topic, messages, partition=partition)
        appended += [(offset, key, value) for (_, offset), (key, value) in zip(result, messages, strict=True)]
        store.roll(topic, partition)
    return appended


def rows(store: Store, topic: str = "t", partition: int = 0) -> list[Row]:
    table = store.read(topic, partition)
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def latest_below(appended: list[Row], end: int) -> list[Row]:
    """The model of a cleaned log: below ``end`` each key's latest message (tombstones included), then all."""
    latest = {key: offset for offset, key, _ in appended if offset < end}
    return [row for row in appended if row[0] >= end or latest[row[1]] == row[0]]


def bases(store: Store, topic: str = "t", partition: int = 0) -> list[int]:
    log = store.partition_log(topic, partition)
    log.refresh()
    return [segment.base_offset for segment in log.segments]


# ------------------------------------------------------------------------------------------------- the pass
def test_a_pass_keeps_each_keys_latest_message_at_its_offset(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config=COMPACT)
    appended = fill(store, "t", 3, 50)
    store.append("t", changelog(150, 10), partition=0)  # the active segment: never cleaned
    appended += [(150 + i, key, value) for i, (key, value) in enumerate(changelog(150, 10))]
    [stats] = store.clean("t")
    assert (stats.first_dirty_offset, stats.end_offset, stats.dirty_ratio) == (0, 150, 1.0)
    assert (stats.messages_read, stats.messages_written, stats.map_entries) == (150, 7, 7)
    assert rows(store) == latest_below(appended, 150)
    assert bases(store) == [0, 150]  # the three small segments form one group, named after its first
    assert store.end_offset("t", 0) == 160 and store.start_offset("t", 0) == 0
    offsets = [offset for offset, _, _ in rows(store)]
    assert offsets == sorted(set(offsets))
    with Store.open(data_dir) as reopened:
        assert rows(reopened) == latest_below(appended, 150)
        assert reopened.end_offset("t", 0) == 160


def test_a_kept_batch_stretched_over_its_removed_neighbour_reads_back(store: Store, data_dir: Path) -> None:
    """A group whose last batch is removed whole: the batch before it, kept byte for byte with its offsets left
    out of the payload (an append's), is stretched to the group's end and must still read at its offsets."""
    store.create_topic("t", config={**EAGER, "segment.bytes": "2048"})
    store.append("t", [(b"a", b"x" * 300), (b"b", b"x" * 300)], partition=0)  # offsets 0-1, kept
    store.append("t", [(b"c", b"x" * 300)], partition=0)  # offset 2, superseded by 3
    store.roll("t", 0)
    store.append("t", [(b"c", b"y" * 900)], partition=0)
    store.roll("t", 0)
    store.append("t", [(b"z", b"1")], partition=0)  # the active segment
    store.clean("t")
    assert [offset for offset, _, _ in rows(store)] == [0, 1, 3, 4]
    with Store.open(data_dir) as reopened:
        assert [offset for offset, _, _ in rows(reopened)] == [0, 1, 3, 4]


def test_the_active_segment_is_never_cleaned(store: Store) -> None:
    store.create_topic("t", config=EAGER)
    store.append("t", changelog(0, 30), partition=0)
    assert store.clean("t") == []
    assert len(rows(store)) == 30


def test_keys_the_dirty_range_supersedes_leave_the_clean_section(store: Store) -> None:
    store.create_topic("t", config=EAGER)
    appended = fill(store, "t", 2, 40)
    store.clean("t")
    appended += fill(store, "t", 1, 3, start=80)  # k3, k4, k5 again
    [stats] = store.clean("t")
    assert stats.first_dirty_offset == 80 and stats.end_offset == 83
    assert rows(store) == latest_below(appended, 83)
    assert sorted(key for _, key, _ in rows(store)) == sorted(f"k{i}".encode() for i in range(7))


# ------------------------------------------------------------------------------------------------ choosing
def test_the_dirty_ratio_decides_and_the_filthiest_partition_goes_first(store: Store) -> None:
    store.create_topic("t", partitions=3, config={**COMPACT, "min.cleanable.dirty.ratio": "0.5"})
    fill(store, "t", 2, 40, partition=0)
    fill(store, "t", 2, 40, partition=1, keys=1000)  # distinct keys: cleaning keeps all 80
    fill(store, "t", 2, 40, partition=2)
    assert [stats.partition for stats in store.clean("t")] == [0, 1, 2]  # every ratio 1.0
    fill(store, "t", 4, 40, partition=0, start=100)  # 4 dirty segments over a clean section of 7 messages
    fill(store, "t", 1, 40, partition=1, start=100)  # 1 dirty segment over a clean section twice its size
    fill(store, "t", 2, 40, partition=2, start=100)
    ratios = {stats.partition: stats.dirty_ratio for stats in store.clean("t")}
    assert list(ratios) == [0, 2] and ratios[0] > ratios[2] > 0.5
    assert store.clean("t") == []  # nothing dirty left in 0 and 2; 1 still below the ratio


def test_min_compaction_lag_keeps_recent_segments_dirty(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={**EAGER, "min.compaction.lag.ms": str(HOUR_MS)})
    old = [{"key": key, "value": value, "timestamp": clock.now_ms - 2 * HOUR_MS} for key, value in changelog(0, 20)]
    new = [{"key": key, "value": value, "timestamp": clock.now_ms} for key, value in changelog(20, 20)]
    store.append("t", old, partition=0)
    store.roll("t", 0)
    store.append("t", new, partition=0)
    store.roll("t", 0)
    [stats] = store.clean("t")
    assert stats.end_offset == 20  # the second segment is younger than the lag
    assert [offset for offset, _, _ in rows(store)][-20:] == list(range(20, 40))
    assert store.clean("t") == []
    clock.advance(HOUR_MS + 1)
    [stats] = store.clean("t")
    assert stats.end_offset == 40 and len(rows(store)) == 7


def test_max_compaction_lag_cleans_a_log_below_the_ratio(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={**COMPACT, "min.cleanable.dirty.ratio": "1",
                                    "max.compaction.lag.ms": str(HOUR_MS)})
    messages = [{"key": key, "value": value, "timestamp": clock.now_ms} for key, value in changelog(0, 40)]
    store.append("t", messages, partition=0)
    store.roll("t", 0)
    assert store.clean("t") == []  # a ratio of 1.0 is never strictly above 1
    clock.advance(HOUR_MS + 1)
    [stats] = store.clean("t")
    assert stats.end_offset == 40


# ------------------------------------------------------------------------------------------------- grouping
def test_groups_join_consecutive_segments_up_to_segment_bytes(store: Store) -> None:
    store.create_topic("t", config={**EAGER, "segment.bytes": "4096"})
    appended = fill(store, "t", 6, 40, repeat=12)  # each segment over 2 KiB: one group each on the first pass
    assert all(2048 < segment.size_bytes <= 4096 for segment in store.partition_log("t", 0).segments[:-1])
    first = store.clean("t")[0]
    assert first.segments_read == 6 and first.segments_written == 6
    assert bases(store) == [0, 40, 80, 120, 160, 200, 240]
    appended += fill(store, "t", 1, 5, start=240)
    second = store.clean("t")[0]
    assert bases(store)[0] == 0 and len(bases(store)) < 8  # the small cleaned segments now share groups
    assert second.segments_written < second.segments_read
    log = store.partition_log("t", 0)
    assert all(segment.size_bytes <= 4096 for segment in log.segments)
    assert rows(store) == latest_below(appended, 245)
    assert store.end_offset("t", 0) == 245


# ----------------------------------------------------------------------------------------------- tombstones
def test_a_tombstone_outlives_its_key_by_delete_retention_ms_then_goes(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={**EAGER, "delete.retention.ms": "1000"})
    store.append("t", [(b"gone", b"v1"), (b"gone", b"v2"), (b"stays", b"s1"), (b"gone", None)], partition=0)
    store.roll("t", 0)
    [first] = store.clean("t")
    assert rows(store) == [(2, b"stays", b"s1"), (3, b"gone", None)]  # the older values go at once
    assert first.tombstones_removed == 0

    def dirty_and_clean(value: bytes) -> CleanerStats:
        store.append("t", [(b"other", value)], partition=0)
        store.roll("t", 0)
        [stats] = store.clean("t")
        return stats

    clock.advance(999)
    assert dirty_and_clean(b"o1").tombstones_removed == 0
    assert (3, b"gone", None) in rows(store)  # kept for delete.retention.ms after the pass that first kept it
    clock.advance(1)
    assert dirty_and_clean(b"o2").tombstones_removed == 1
    assert rows(store) == [(2, b"stays", b"s1"), (5, b"other", b"o2")]


def test_a_tombstone_first_kept_later_gets_its_own_horizon(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={**EAGER, "delete.retention.ms": "1000"})
    store.append("t", [(b"a", None)], partition=0)
    store.roll("t", 0)
    store.clean("t")
    clock.advance(600)
    store.append("t", [(b"b", None)], partition=0)
    store.roll("t", 0)
    store.clean("t")  # a's horizon is 1000, b's 1600: never stamped together
    clock.advance(400)
    store.append("t", [(b"c", b"c")], partition=0)
    store.roll("t", 0)
    [stats] = store.clean("t")
    assert stats.tombstones_removed == 1
    assert rows(store) == [(1, b"b", None), (2, b"c", b"c")]


# --------------------------------------------------------------------------------------------- the key map
def test_a_full_key_map_cleans_part_and_the_next_pass_continues(data_dir: Path, clock: ManualClock) -> None:
    budget = CleanerConfig(dedupe_buffer_bytes=2 * MAP_ENTRY_BYTES * 10)  # a map of 10 keys
    assert budget.max_map_entries == 10
    with Store.open(data_dir, clock=clock, cleaner_config=budget) as store:
        store.create_topic("t", config=EAGER)
        appended = fill(store, "t", 3, 40, keys=25)
        ends = []
        while True:
            passes = store.clean("t")
            if not passes:
                break
            [stats] = passes
            assert stats.map_entries <= 10
            ends.append(stats.end_offset)
            assert rows(store) == latest_below(appended, stats.end_offset)
            checkpoint = (data_dir / CLEANER_OFFSET_CHECKPOINT).read_text().splitlines()
            assert checkpoint == ["0", "1", f"t 0 {stats.end_offset}"]
        assert ends == sorted(ends) and len(ends) >= 3 and ends[-1] == 120
        assert ends[0] == 10  # the eleventh distinct key is the message at offset 10


# ------------------------------------------------------------------------------------------------ keyless
def test_keyless_messages_are_dropped_and_counted(store: Store) -> None:
    store.create_topic("t", config={**EAGER, "cleanup.policy": "compact,delete"})
    store.append("t", [(None, b"x"), (b"k", b"v"), (None, b"y")], partition=0)
    store.roll("t", 0)
    [stats] = store.clean("t")
    assert stats.keyless_dropped == 2
    assert rows(store) == [(1, b"k", b"v")]


def test_a_keyless_append_to_a_compact_only_topic_is_refused(store: Store) -> None:
    store.create_topic("t", config=COMPACT)
    with pytest.raises(KeylessMessageError, match=r"row 1 has no key.*cleanup\.policy=compact"):
        store.append("t", [(b"k", b"v"), (None, b"lost")])
    assert store.end_offset("t", 0) == 0


# ------------------------------------------------------------------------------------------------ checkpoint
def test_the_checkpoint_is_kafkas_file_and_a_bad_entry_is_reset_at_once(store: Store, data_dir: Path) -> None:
    store.create_topic("t", partitions=2, config=COMPACT)
    fill(store, "t", 2, 40, partition=1)
    store.clean("t")
    path = data_dir / CLEANER_OFFSET_CHECKPOINT
    assert path.read_text() == "0\n1\nt 1 80\n"
    path.write_text("0\n1\nt 1 999\n")  # past the end offset
    store.alter_topic_config("t", {"min.cleanable.dirty.ratio": "1"})  # and no longer eligible
    assert store.clean("t") == []
    assert path.read_text() == "0\n1\nt 1 0\n"  # rewritten to the log start though nothing was cleaned
    store.delete_topic("t")
    assert path.read_text() == "0\n0\n"


# ----------------------------------------------------------------------------------------------- states
def test_pauses_nest_and_resume_undoes_one(store: Store) -> None:
    store.create_topic("t", config=EAGER)
    fill(store, "t", 1, 20)
    key = ("t", 0)
    store.cleaner.pause(key)
    store.cleaner.pause(key)
    assert (store.cleaner.state(key), store.cleaner.pause_depth(key)) == (CleaningState.PAUSED, 2)
    assert store.clean("t") == []
    store.cleaner.resume(key)
    assert store.clean("t") == []
    store.cleaner.resume(key)
    assert store.cleaner.state(key) is CleaningState.IDLE
    assert len(store.clean("t")) == 1
    with pytest.raises(CleanerStateError, match="Cannot resume cleaning of t-0: it is idle"):
        store.cleaner.resume(key)


def test_abort_and_pause_stops_a_pass_and_leaves_the_checkpoint(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config=EAGER)
    appended = fill(store, "t", 2, 40)
    key = ("t", 0)
    manager = store.cleaner
    assert manager.begin(key)
    aborter = threading.Thread(target=manager.abort_and_pause, args=(key,), kwargs={"timeout_s": 60})
    aborter.start()
    deadline = time.monotonic() + 60
    while not manager.is_aborted(key):
        assert time.monotonic() < deadline, "abort_and_pause never marked the pass aborted"
        time.sleep(0.001)
    log = store.partition_log("t", 0)
    with pytest.raises(CleaningAbortedError, match="aborted"), log.writer_lock:
        clean_log(log, 0, 80, now_ms=0, max_map_entries=100, window_rows=100,
                  stats=CleanerStats("t", 0, 0), should_abort=lambda: manager.is_aborted(key))
    manager.done(key, 80)
    aborter.join()
    assert (manager.state(key), manager.pause_depth(key)) == (CleaningState.PAUSED, 1)
    assert not (data_dir / CLEANER_OFFSET_CHECKPOINT).exists()
    assert rows(store) == appended
    assert not [name for name in os.listdir(log.folder) if (p := parse_segment_file(name)) and p[2]]
    manager.resume(key)
    assert len(store.clean("t")) == 1


def test_a_failing_partition_is_marked_uncleanable_and_the_others_are_cleaned(store: Store, data_dir: Path) -> None:
    store.create_topic("t", partitions=2, config=EAGER)
    fill(store, "t", 2, 40, partition=0)
    fill(store, "t", 2, 40, partition=1)
    first = store.partition_log("t", 0).segments[0]
    with open(first.log_path, "r+b") as file:  # scribble on a payload of a sealed segment
        file.seek(first.size_bytes - 16)
        file.write(bytes([0xFF]) * 8)
    with Store.open(data_dir) as fresh:  # a process that has not checked these batches' CRCs yet
        assert [stats.partition for stats in fresh.clean("t")] == [1]
        [(key, error)] = fresh.cleaner.uncleanable().items()
        assert key == ("t", 0) and CorruptSegmentError.__name__ in error and str(first.log_path) in error
        fill(fresh, "t", 1, 40, partition=1, start=80)
        assert [stats.partition for stats in fresh.clean("t")] == [1]  # 0 is skipped until cleared
        fresh.cleaner.clear_uncleanable(key)
        assert fresh.clean("t") == [] and ("t", 0) in fresh.cleaner.uncleanable()


def test_a_partition_busy_under_another_writer_is_left_for_the_next_pass(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config=EAGER)
    appended = fill(store, "t", 2, 40)
    with Store.open(data_dir, lock_wait=False) as impatient:
        impatient.end_offset("t", 0)
        with Child("holder.py", partition_folder(data_dir, "t", 0) / WRITER_LOCK) as holder:
            holder.expect_line("locked")
            assert impatient.clean("t") == []
            assert impatient.cleaner.uncleanable() == {}
            holder.send_line("release")
            assert holder.finish()[0] == 0
        assert rows(impatient) == appended
        assert [stats.end_offset for stats in impatient.clean("t")] == [80]


# ----------------------------------------------------------------------------------------------- readers
def test_a_read_in_progress_finishes_over_the_segments_it_started_on(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config={**EAGER, "segment.bytes": "4096"})
    appended = fill(store, "t", 6, 40)
    with Store.open(data_dir) as other:
        batches = other.read_batches("t", 0)
        first = next(batches)
        store.clean("t")
        rest = [row for batch in batches for row in batch.to_pylist()]
        seen = [(row["offset"], row["key"], row["value"]) for row in first.to_pylist() + rest]
        assert seen == appended  # the old segments, read to their end through their memory maps
        assert rows(other) == latest_below(appended, 240)  # a new read sees the cleaned log


# ------------------------------------------------------------------------------------------------ two-phase
def test_cleaning_stays_below_the_two_phase_horizon(store: Store, data_dir: Path) -> None:
    store.create_topic("t", config={**EAGER, "compaction.threshold.bytes": "1000000"})
    appended = fill(store, "t", 2, 40)
    assert store.clean("t") == []  # two-phase compaction on and never run: every raw message is held
    Compactor(store).compact("t")  # horizon 79
    appended += fill(store, "t", 2, 40, start=80)
    compacted_before = [(m.offset, m.key, m.value) for m in Reader(store, "t", read_compacted=True)]
    [stats] = store.clean("t")
    assert stats.end_offset == 80
    assert rows(store) == latest_below(appended, 80)
    assert [(m.offset, m.key, m.value) for m in Reader(store, "t", read_compacted=True)] == compacted_before


# ------------------------------------------------------------------------------------------------ the loop
def test_the_maintenance_loop_cleans_and_retains_on_the_injected_clock(store: Store, clock: ManualClock) -> None:
    store.create_topic("compacted", config=EAGER)
    store.create_topic("logs", config={"retention.ms": str(HOUR_MS)})
    fill(store, "compacted", 2, 40)
    store.append("logs", [{"key": b"k", "value": b"v", "timestamp": clock.now_ms}], partition=0)
    store.roll("logs", 0)
    loop = MaintenanceLoop(store, interval_s=3600)
    try:
        first = loop.run_once()
        assert [(stats.topic, stats.end_offset) for stats in first.cleaned] == [("compacted", 80)]
        assert first.deleted == []
        second = loop.run_once(clock.now_ms + HOUR_MS + 1)
        assert second.cleaned == [] and [(d.topic, d.base_offset) for d in second.deleted] == [("logs", 0)]
        assert loop.failures == {}
    finally:
        loop.stop()
    assert len(rows(store, "compacted")) == 7 and store.start_offset("logs", 0) == 1
