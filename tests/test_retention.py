"""Retention and delete_records (storage/retention.py): by time, size and log start offset, the all-expired roll,
the two-phase compaction hold, asynchronous deletion through ``.deleted`` files, readers in progress, other
processes, and bad input.

Invariants checked (DESIGN.md):

2. Offsets and order never change: retention removes only a prefix of whole segments, the end offset never
   moves back (the all-expired roll), and what remains reads back with its offsets.
3. and 4. Raw data at or above the two-phase compaction hold is never deleted, so the compacted view stays whole.
6. A crash at each step of a deletion recovers to a readable log whose start offset is the checkpoint's, with no
   ``.deleted`` file left after reopening.
8. Another process's store sees the new log start offset and segment list after a refresh, and a reader in
   progress (in this or another store) finishes what it started.
10. Bad input to delete_records gets a clear error and changes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor import Compactor
from readers import Reader
from storage import Store
from storage.checkpoints import read_checkpoint
from storage.errors import OffsetOutOfRangeError, SegmentDeletedError
from storage.files import DELETED_SUFFIX, LOG_START_OFFSET_CHECKPOINT, parse_segment_file
from storage.retention import (
    DeleteRecordsOutOfRangeError,
    RecordDeletionNotAllowedError,
    RetentionHoldError,
    RetentionLoop,
    RetentionReason,
)
from tests.cli_runner import run_main
from tests.conftest import ManualClock

HOUR_MS = 3_600_000
DELAY_MS = 60_000  # file.delete.delay.ms, Kafka's default
REPO = Path(__file__).resolve().parent.parent


def rows(start: int, count: int, timestamp_ms: int) -> pa.Table:
    return pa.table({
        "key": [f"k{i % 5}".encode() for i in range(start, start + count)],
        "value": [f"v{i}".encode() for i in range(start, start + count)],
        "timestamp": [timestamp_ms] * count,
    })


def fill(store: Store, topic: str, timestamps_ms: list[int], *, per_segment: int = 10) -> None:
    """One sealed segment of ``per_segment`` messages per timestamp, except the last, which stays active."""
    for i, timestamp in enumerate(timestamps_ms):
        store.append(topic, rows(i * per_segment, per_segment, timestamp), partition=0)
        if i < len(timestamps_ms) - 1:
            store.roll(topic, 0)


def bases(store: Store, topic: str = "t") -> list[int]:
    log = store.partition_log(topic, 0)
    log.refresh()
    return [segment.base_offset for segment in log.segments]


def offsets(store: Store, topic: str = "t", start: int | None = None) -> list[int]:
    found: list[int] = store.read(topic, 0, start_offset=start)["offset"].to_pylist()
    return found


def segment_names(folder: Path) -> tuple[list[str], list[str]]:
    """(live segment files, .deleted segment files) of a partition folder."""
    parsed = [(name, parse_segment_file(name)) for name in sorted(os.listdir(folder))]
    live = [name for name, p in parsed if p is not None and p[2] is None]
    deleted = [name for name, p in parsed if p is not None and p[2] == DELETED_SUFFIX]
    return live, deleted


def snapshot(store: Store, data_dir: Path) -> tuple[int, int, list[int], tuple[list[str], list[str]], str]:
    """Everything delete_records could change."""
    checkpoint = data_dir / LOG_START_OFFSET_CHECKPOINT
    return (store.start_offset("t", 0), store.end_offset("t", 0), bases(store), segment_names(data_dir / "t-0"),
            checkpoint.read_text() if checkpoint.exists() else "")


# -------------------------------------------------------------------------------------------------------- time
def test_time_retention_deletes_the_expired_prefix_and_moves_the_log_start(store: Store, clock: ManualClock) -> None:
    now = clock.now_ms
    store.create_topic("t", config={"retention.ms": str(HOUR_MS)})
    fill(store, "t", [now - 3 * HOUR_MS, now - 2 * HOUR_MS, now - HOUR_MS, now])
    deleted = store.enforce_retention("t")
    # Kafka's rule is strict: the third segment is exactly retention.ms old and stays.
    assert [(d.partition, d.base_offset, d.next_offset, d.reason) for d in deleted] == [
        (0, 0, 10, RetentionReason.RETENTION_MS), (0, 10, 20, RetentionReason.RETENTION_MS)]
    assert bases(store) == [20, 30]
    assert store.start_offset("t", 0) == 20 and store.end_offset("t", 0) == 40
    assert offsets(store) == list(range(20, 40))
    with pytest.raises(OffsetOutOfRangeError, match="holds offsets 20 to 40"):
        store.read("t", 0, start_offset=19)
    assert store.enforce_retention("t") == []
    clock.advance(1)
    assert [d.base_offset for d in store.enforce_retention("t")] == [20]


def test_a_segment_with_a_future_timestamp_holds_back_the_later_ones(store: Store, clock: ManualClock) -> None:
    now = clock.now_ms
    store.create_topic("t", config={"retention.ms": str(HOUR_MS)})
    fill(store, "t", [now - 3 * HOUR_MS, now + HOUR_MS, now - 3 * HOUR_MS, now])
    assert [d.base_offset for d in store.enforce_retention("t")] == [0]  # only a prefix is ever deleted
    assert bases(store) == [10, 20, 30]


def test_when_every_segment_expired_a_roll_keeps_the_end_offset(store: Store, clock: ManualClock,
                                                                 data_dir: Path) -> None:
    store.create_topic("t", config={"retention.ms": str(HOUR_MS)})
    fill(store, "t", [clock.now_ms] * 3)
    clock.advance(HOUR_MS + 1)
    deleted = store.enforce_retention("t")
    assert [d.base_offset for d in deleted] == [0, 10, 20]  # the active segment too, after the roll
    assert bases(store) == [30]
    assert store.start_offset("t", 0) == store.end_offset("t", 0) == 30
    assert store.read("t", 0).num_rows == 0
    assert store.enforce_retention("t") == []  # the new active segment is empty: never deleted
    assert list(store.append("t", rows(30, 5, clock.now_ms), partition=0)) == [(0, o) for o in range(30, 35)]
    assert offsets(store) == list(range(30, 35))
    store.close()
    with Store.open(data_dir, clock=clock) as reopened:
        assert reopened.start_offset("t", 0) == 30 and offsets(reopened) == list(range(30, 35))


def test_retention_ms_minus_one_means_no_time_limit(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={"retention.ms": "-1"})
    fill(store, "t", [0, 0, 0])
    assert store.enforce_retention("t") == []
    assert offsets(store) == list(range(30))


# -------------------------------------------------------------------------------------------------------- size
def test_size_retention_follows_kafkas_rule(store: Store, clock: ManualClock) -> None:
    """diff = size - retention.bytes; a segment goes while diff - its size >= 0: the log stays >= the limit."""
    store.create_topic("t")
    fill(store, "t", [clock.now_ms] * 5)
    sizes = [segment.size_bytes for segment in store.partition_log("t", 0).segments]
    total = sum(sizes)
    store.alter_topic_config("t", set={"retention.bytes": str(total + 1)})
    assert store.enforce_retention("t") == []  # under the limit
    store.alter_topic_config("t", set={"retention.bytes": str(total - sizes[0] - sizes[1] + 1)})
    assert [(d.base_offset, d.reason) for d in store.enforce_retention("t")] == [(0, RetentionReason.RETENTION_BYTES)]
    store.alter_topic_config("t", set={"retention.bytes": str(total - sizes[0] - sizes[1] - sizes[2])})
    assert [d.base_offset for d in store.enforce_retention("t")] == [10, 20]
    assert store.size_bytes("t", 0) == sizes[3] + sizes[4] == total - sizes[0] - sizes[1] - sizes[2]
    assert offsets(store) == list(range(30, 50))


def test_retention_bytes_zero_deletes_everything_through_a_roll(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={"retention.bytes": "0"})
    fill(store, "t", [clock.now_ms] * 3)
    assert [d.base_offset for d in store.enforce_retention("t")] == [0, 10, 20]
    assert store.start_offset("t", 0) == store.end_offset("t", 0) == 30 and store.size_bytes("t", 0) == 0


def test_compact_only_topics_have_no_retention_nor_delete_records(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={"cleanup.policy": "compact", "retention.ms": "0", "retention.bytes": "0"})
    fill(store, "t", [0, 0, 0])
    clock.advance(HOUR_MS)
    assert store.enforce_retention("t") == []
    with pytest.raises(RecordDeletionNotAllowedError, match=r"cleanup.policy is compact.*compact,delete"):
        store.delete_records("t", 0, before_offset=10)
    assert store.start_offset("t", 0) == 0 and offsets(store) == list(range(30))
    store.alter_topic_config("t", set={"cleanup.policy": "compact,delete"})
    assert [d.base_offset for d in store.enforce_retention("t")] == [0, 10, 20]


# ------------------------------------------------------------------------------------------- log start offset
def test_delete_records_moves_the_log_start_into_a_segment(store: Store, clock: ManualClock, data_dir: Path) -> None:
    store.create_topic("t")
    fill(store, "t", [clock.now_ms] * 4)
    result = store.delete_records("t", 0, before_offset=25)
    assert result.log_start_offset == 25
    assert [(d.base_offset, d.reason) for d in result.deleted] == [
        (0, RetentionReason.LOG_START_OFFSET), (10, RetentionReason.LOG_START_OFFSET)]
    assert bases(store) == [20, 30]  # the segment holding offset 25 stays, read from 25
    assert store.start_offset("t", 0) == 25 and offsets(store) == list(range(25, 40))
    assert offsets(store, start=25) == list(range(25, 40)) and offsets(store, start=37) == [37, 38, 39]
    for below in (0, 20, 24):
        with pytest.raises(OffsetOutOfRangeError, match="holds offsets 25 to 40"):
            store.read("t", 0, start_offset=below)
    assert read_checkpoint(data_dir / LOG_START_OFFSET_CHECKPOINT)[("t", 0)] == 25  # Kafka's checkpoint file
    assert store.offset_for_timestamp("t", 0, 0) == 25
    assert store.describe_topic("t").partitions[0].start_offset == 25
    store.close()
    with Store.open(data_dir, clock=clock) as reopened:
        assert reopened.start_offset("t", 0) == 25 and offsets(reopened) == list(range(25, 40))
        with pytest.raises(OffsetOutOfRangeError):
            reopened.read("t", 0, start_offset=24)
        # Time retention later moves the start to the next segment's base, never back below 25.
        reopened.alter_topic_config("t", set={"retention.ms": "1"})
        clock.advance(HOUR_MS)
        assert [d.base_offset for d in reopened.enforce_retention("t")] == [20, 30]
        assert reopened.start_offset("t", 0) == reopened.end_offset("t", 0) == 40


def test_delete_records_up_to_the_end_keeps_the_active_segment(store: Store, clock: ManualClock) -> None:
    store.create_topic("t")
    fill(store, "t", [clock.now_ms] * 3)
    assert [d.base_offset for d in store.delete_records("t", 0, before_offset=30).deleted] == [0, 10]
    assert bases(store) == [20]  # Kafka never deletes the last segment for the log start offset
    assert store.start_offset("t", 0) == store.end_offset("t", 0) == 30 and store.read("t", 0).num_rows == 0
    store.append("t", rows(30, 3, clock.now_ms), partition=0)
    assert offsets(store) == [30, 31, 32]


def test_delete_records_at_the_log_start_changes_nothing(store: Store, clock: ManualClock) -> None:
    store.create_topic("t")
    fill(store, "t", [clock.now_ms] * 2)
    assert store.delete_records("t", 0, before_offset=0).deleted == []
    assert store.start_offset("t", 0) == 0 and bases(store) == [0, 10]


@pytest.mark.parametrize("before_offset", [-1, 4, 31, 10**12, 5.0, True])
def test_delete_records_outside_the_log_is_refused_and_changes_nothing(store: Store, clock: ManualClock,
                                                                       data_dir: Path, before_offset: int) -> None:
    store.create_topic("t")
    fill(store, "t", [clock.now_ms] * 3)
    store.delete_records("t", 0, before_offset=5)
    before = snapshot(store, data_dir)
    with pytest.raises(DeleteRecordsOutOfRangeError, match=r"from the log start offset 5 to the end offset 30\. "
                                                           r"Nothing was changed"):
        store.delete_records("t", 0, before_offset=before_offset)
    assert snapshot(store, data_dir) == before


# --------------------------------------------------------------------------------------------- compaction hold
def test_the_two_phase_compaction_hold_keeps_raw_data_the_compactor_needs(store: Store, clock: ManualClock,
                                                                         data_dir: Path) -> None:
    store.create_topic("t", config={"compaction.threshold.bytes": "1000000000", "retention.ms": str(HOUR_MS),
                                    "file.delete.delay.ms": "0"})
    fill(store, "t", [clock.now_ms] * 3)
    clock.advance(2 * HOUR_MS)
    assert store.retention_hold("t", 0) == 0
    assert store.enforce_retention("t") == []  # nothing compacted yet: everything is held
    before = snapshot(store, data_dir)
    with pytest.raises(RetentionHoldError, match=r"from offset 0 on .*Nothing was changed. Compact the partition "
                                                 r"first.*compaction.threshold.bytes=0"):
        store.delete_records("t", 0, before_offset=5)
    assert snapshot(store, data_dir) == before

    Compactor(store).compact("t")  # horizon 29: the hold moves to 30
    store.roll("t", 0)
    store.append("t", rows(30, 10, clock.now_ms), partition=0)
    store.roll("t", 0)
    store.append("t", rows(40, 10, clock.now_ms), partition=0)
    assert store.retention_hold("t", 0) == 30
    clock.advance(2 * HOUR_MS)  # every segment is now expired
    assert [d.base_offset for d in store.enforce_retention("t")] == [0, 10, 20]
    assert bases(store) == [30, 40] and store.start_offset("t", 0) == 30
    with pytest.raises(RetentionHoldError, match="from offset 30 on"):
        store.delete_records("t", 0, before_offset=31)
    assert store.delete_records("t", 0, before_offset=30).log_start_offset == 30

    Compactor(store).compact("t")  # horizon 49, but the replaced ledger (horizon 29) may still have readers
    assert store.retention_hold("t", 0) == 30
    # Retention removes the replaced ledger once its file.delete.delay.ms (0) is over, so the raw data it held goes
    # at once, without waiting for a compaction that a topic receiving nothing new would never run.
    assert [d.base_offset for d in store.enforce_retention("t")] == [30, 40]  # everything, through the roll
    assert store.retention_hold("t", 0) == 50
    assert store.start_offset("t", 0) == store.end_offset("t", 0) == 50


# ------------------------------------------------------------------------------------------- async deletion
def test_deleted_files_stay_until_the_delay_passes(store: Store, clock: ManualClock, data_dir: Path) -> None:
    folder = data_dir / "t-0"
    store.create_topic("t", config={"retention.ms": str(HOUR_MS), "file.delete.delay.ms": str(DELAY_MS)})
    fill(store, "t", [clock.now_ms - 2 * HOUR_MS, clock.now_ms])
    live_before, _ = segment_names(folder)
    store.enforce_retention("t")
    live, deleted = segment_names(folder)
    first = [f"{0:020d}{suffix}" for suffix in (".index", ".log", ".timeindex")]
    assert deleted == [name + DELETED_SUFFIX for name in first]
    assert live == [name for name in live_before if name not in first]
    clock.advance(DELAY_MS - 1)
    store.enforce_retention("t")
    assert segment_names(folder)[1] == deleted
    clock.advance(1)
    store.enforce_retention("t")
    assert segment_names(folder) == (live, [])


def test_deleted_files_are_removed_on_reopen(data_dir: Path, clock: ManualClock) -> None:
    with Store.open(data_dir, clock=clock) as store:
        store.create_topic("t", config={"retention.ms": str(HOUR_MS)})
        fill(store, "t", [clock.now_ms - 2 * HOUR_MS, clock.now_ms - 2 * HOUR_MS, clock.now_ms])
        store.enforce_retention("t")
        assert len(segment_names(data_dir / "t-0")[1]) == 6
    with Store.open(data_dir, clock=clock) as store:
        assert offsets(store) == list(range(20, 30))
        assert segment_names(data_dir / "t-0")[1] == []


def test_a_reader_in_progress_finishes_what_it_started(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", config={"retention.ms": str(HOUR_MS)})
    fill(store, "t", [clock.now_ms] * 4)
    batches = store.read_batches("t", 0)
    seen = next(batches)["offset"].to_pylist()
    clock.advance(2 * HOUR_MS)
    assert len(store.enforce_retention("t")) == 4  # every segment, the one being read included
    seen += [offset for batch in batches for offset in batch["offset"].to_pylist()]
    assert seen == list(range(40))
    with pytest.raises(OffsetOutOfRangeError):
        store.read("t", 0, start_offset=0)


def test_a_reader_of_another_store_finishes_even_after_the_files_are_gone(data_dir: Path, clock: ManualClock) -> None:
    """The other store stands for another process: it has its own segment objects and memory maps."""
    with Store.open(data_dir, clock=clock) as store, Store.open(data_dir, clock=clock) as other:
        store.create_topic("t", config={"retention.ms": str(HOUR_MS), "file.delete.delay.ms": "0"})
        fill(store, "t", [clock.now_ms] * 4)
        batches = other.read_batches("t", 0)
        seen = next(batches)["offset"].to_pylist()
        clock.advance(2 * HOUR_MS)
        store.enforce_retention("t")
        assert segment_names(data_dir / "t-0")[1] == []  # no delay: unlinked at once
        assert other.start_offset("t", 0) == 40 and bases(other) == [40]  # a refresh drops the segments
        seen += [offset for batch in batches for offset in batch["offset"].to_pylist()]
        assert seen == list(range(40))


def test_another_store_sees_the_new_log_start_after_a_refresh(data_dir: Path, clock: ManualClock) -> None:
    with Store.open(data_dir, clock=clock) as store, Store.open(data_dir, clock=clock) as other:
        store.create_topic("t")
        fill(store, "t", [clock.now_ms] * 3)
        assert other.start_offset("t", 0) == 0 and bases(other) == [0, 10, 20]
        store.delete_records("t", 0, before_offset=15)
        assert other.start_offset("t", 0) == 15 and bases(other) == [10, 20]
        assert offsets(other) == list(range(15, 30))
        with pytest.raises(OffsetOutOfRangeError, match="holds offsets 15 to 30"):
            other.read("t", 0, start_offset=14)
        # The other store deletes in turn, from what it sees: its own retention and delete_records agree.
        assert other.delete_records("t", 0, before_offset=20).deleted[0].base_offset == 10
        assert store.start_offset("t", 0) == 20 and bases(store) == [20]


def test_a_roll_does_not_seal_the_torn_tail_of_a_dead_writer(data_dir: Path, clock: ManualClock) -> None:
    """Retention rolls when every segment expired; a roll must cut what a dead writer left, or the sealed segment
    would hold an invalid batch below the recovery point, which the next open reports as corruption."""
    with Store.open(data_dir, clock=clock) as store:
        store.create_topic("t")
        store.append("t", rows(0, 5, clock.now_ms), partition=0)
    with Store.open(data_dir, clock=clock) as store:
        store.partition_log("t", 0)
        with open(data_dir / "t-0" / f"{0:020d}.log", "ab") as log:
            log.write(b"\x01" * 30)  # what a writer in another process left when it died mid-append
        store.roll("t", 0)
        store.append("t", rows(5, 5, clock.now_ms), partition=0)
    with Store.open(data_dir, clock=clock) as store:
        assert offsets(store) == list(range(10))


# -------------------------------------------------------------------------------------------------------- loop
def test_the_retention_loop_runs_every_topic(store: Store, clock: ManualClock) -> None:
    store.create_topic("a", config={"retention.ms": str(HOUR_MS)})
    store.create_topic("b", config={"retention.bytes": "0"})
    store.create_topic("c")
    for topic in ("a", "b", "c"):
        fill(store, topic, [clock.now_ms] * 2)
    clock.advance(2 * HOUR_MS)
    loop = RetentionLoop(store, interval_s=3600)
    try:
        deleted = loop.run_once()
        assert sorted((d.topic, d.base_offset) for d in deleted) == [("a", 0), ("a", 10), ("b", 0), ("b", 10)]
        assert loop.failures == {}
        loop.start()
    finally:
        loop.stop()
    assert store.start_offset("a", 0) == store.start_offset("b", 0) == 20 and store.start_offset("c", 0) == 0


# ---------------------------------------------------------------------------------------------------- property
@given(st.lists(st.tuples(st.sampled_from(["append", "roll", "retain", "delete", "reopen"]),
                          st.integers(0, 40)), max_size=25))
def test_retention_keeps_a_readable_suffix_of_the_log(tmp_path_factory: pytest.TempPathFactory,
                                                      steps: list[tuple[str, int]]) -> None:
    """Random appends, rolls, retention runs at an advancing clock, delete_records and reopens: what reads back
    is always a suffix of what was appended, with its offsets; the end offset never moves back; the log start
    offset never moves back and never passes the end."""
    data_dir = tmp_path_factory.mktemp("data")
    clock = ManualClock()
    config = {"segment.bytes": "2048", "index.interval.bytes": "256", "retention.ms": str(HOUR_MS),
              "retention.bytes": "3000", "file.delete.delay.ms": "1000"}
    store = Store.open(data_dir, clock=clock)
    store.create_topic("t", config=config)
    appended = start = 0
    try:
        for action, number in steps:
            if action == "append" and number:
                store.append("t", rows(appended, number, clock.now_ms), partition=0)
                appended += number
            elif action == "roll":
                store.roll("t", 0)
            elif action == "retain":
                clock.advance(number * HOUR_MS // 10)
                deleted = store.enforce_retention("t")
                assert [d.base_offset for d in deleted] == sorted(d.base_offset for d in deleted)
            elif action == "delete":
                target = min(max(start, number * 2), appended)
                store.delete_records("t", 0, before_offset=target)
            else:
                store.close()
                store = Store.open(data_dir, clock=clock)
            new_start, end = store.start_offset("t", 0), store.end_offset("t", 0)
            assert end == appended and start <= new_start <= end
            start = new_start
            assert offsets(store) == list(range(start, appended))
            assert bases(store)[0] <= start
    finally:
        store.close()


# ------------------------------------------------------------------------------------------------------ faults
DELETE_IN_CHILD = """
import sys
from storage import Store
with Store.open(sys.argv[1]) as store:
    store.delete_records("t", 0, before_offset=25)
"""


@pytest.mark.fault
@pytest.mark.parametrize("point", ["retention.after_log_start_offset", "retention.after_rename:1",
                                   "retention.after_rename:2"])
def test_a_deletion_killed_at_each_step_recovers(data_dir: Path, point: str) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"retention.ms": "-1"})
        fill(store, "t", [1_000] * 4)
    child = subprocess.run([sys.executable, "-c", DELETE_IN_CHILD, str(data_dir)], capture_output=True,
                           timeout=120, cwd=REPO, env={**os.environ, "LEDGERVIEW_CRASH_AT": point})
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    with Store.open(data_dir) as store:
        assert store.start_offset("t", 0) == 25  # the checkpoint was saved before any file was renamed
        assert offsets(store) == list(range(25, 40)) and store.end_offset("t", 0) == 40
        assert segment_names(data_dir / "t-0")[1] == []
        store.enforce_retention("t")  # finishes the deletion: segments wholly below the log start go
        assert bases(store) == [20, 30]


def test_a_damaged_partition_keeps_retention_from_no_other_partition_or_topic(
        capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    """``ledgerview retention`` (and Store.enforce_retention under it) stopped at the first partition that failed:
    a damaged partition kept retention from every later partition and topic, whose disks filled."""
    config = {"segment.bytes": "1024", "retention.bytes": "3000"}
    with Store.open(data_dir) as store:
        store.create_topic("a", partitions=2, config=config)
        store.create_topic("b", config=config)
        for topic, partition in (("a", 0), ("a", 1), ("b", 0)):
            for _ in range(10):
                store.append(topic, [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=partition)
    damaged = sorted((data_dir / "a-0").glob("*.log"))[-1]
    flipped = bytearray(damaged.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    result = run_main(capsys, data_dir, "retention")
    assert result.code == 1
    assert f"Corrupt batch in {damaged}" in result.err
    assert "Retention failed on a-0; the rest was done." in result.err
    deleted = [line.split()[:2] for line in result.out.splitlines()[1:]]
    assert {tuple(row) for row in deleted} == {("a", "1"), ("b", "0")}
    assert f"Retention deleted {len(deleted)} segment(s)" in result.err
    with Store.open(data_dir) as store:
        assert store.start_offset("a", 1) > 0 and store.start_offset("b", 0) > 0


def test_a_segment_deleted_before_a_read_in_progress_reached_it_is_an_error_saying_so(data_dir: Path) -> None:
    """With file.delete.delay.ms=0, retention may remove a segment a read has planned on but not opened yet: that
    was a bare FileNotFoundError naming a '.deleted' file."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "1024", "retention.bytes": "1", "file.delete.delay.ms": "0"})
        for _ in range(6):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=0)
        batches = Reader(store, "t").batches()
        assert next(batches).num_rows == 10  # the first segment is open, the next ones are not
        assert store.enforce_retention("t")
        with pytest.raises(SegmentDeletedError, match=r"was deleted while this read was in progress"):
            list(batches)
