"""Where the deletions a compacted view cannot show lie (storage/dropped_tombstones.py), and the compactor that
records them in the compaction cursor: the ranges always cover every tombstone a compaction left out, stay few,
and are exact while there are few."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from compactor import Compactor, latest_offsets
from compactor.run import compact_partition
from readers import Reader
from storage import Store
from storage.compacted import CURSOR_RECORD, CompactedLedgers
from storage.dropped_tombstones import Ranges, meeting, merged, with_offsets
from storage.records import encode_record
from storage.remote_ledger import RemoteCompactedView

offsets = st.lists(st.integers(0, 500), max_size=200)


def covered(ranges: Ranges, offset: int) -> bool:
    return any(first <= offset <= last for first, last in ranges)


def assert_well_formed(ranges: Ranges, limit: int) -> None:
    assert len(ranges) <= limit
    assert all(first <= last for first, last in ranges)
    assert all(ranges[i][1] + 1 < ranges[i + 1][0] for i in range(len(ranges) - 1))  # sorted, apart


@given(first=offsets, second=offsets, limit=st.integers(1, 8))
def test_ranges_cover_every_offset_in_at_most_the_limit(first: list[int], second: list[int], limit: int) -> None:
    grown = with_offsets(with_offsets((), np.array(first, np.int64), limit=limit), np.array(second, np.int64),
                         limit=limit)
    assert_well_formed(grown, limit)
    assert all(covered(grown, offset) for offset in first + second)
    assert all(first_ in first + second and last in first + second for first_, last in grown)  # ends are offsets
    together = merged(with_offsets((), np.array(first, np.int64)), with_offsets((), np.array(second, np.int64)),
                      limit=limit)
    assert_well_formed(together, limit)
    assert all(covered(together, offset) for offset in first + second)


@given(points=offsets)
def test_ranges_are_exact_while_they_fit(points: list[int]) -> None:
    """Within the limit, a range covers only runs of the offsets given: nothing between them."""
    ranges = with_offsets((), np.array(points, np.int64), limit=1000)
    assert {offset for first, last in ranges for offset in range(first, last + 1)} == set(points)


def test_the_smallest_gaps_are_closed_first() -> None:
    assert with_offsets((), np.array([1, 2, 10, 11, 13, 40, 100]), limit=3) == ((1, 13), (40, 40), (100, 100))
    assert with_offsets(((5, 9),), np.array([7, 20]), limit=1) == ((5, 20),)


def test_meeting_names_the_part_of_the_first_range_within_the_offsets() -> None:
    ranges = ((3, 5), (10, 20))
    assert meeting(ranges, 6, 9) is None
    assert meeting(ranges, 4, 12) == (4, 5)
    assert meeting(ranges, 12, 30) == (12, 20)
    assert meeting(ranges, 4, 3) is None  # no offsets at all


def dropped_now(log: list[tuple[bytes | None, bytes | None]]) -> set[int]:
    """Offsets of the tombstones that are their key's latest message: a compaction to the log's end leaves them
    out."""
    latest = {key: offset for offset, (key, _) in enumerate(log) if key is not None}
    return {offset for offset in latest.values() if log[offset][1] is None}


@pytest.mark.parametrize("held", [latest_offsets.MAX_DROPPED_HELD, 7])
def test_each_run_records_the_tombstones_it_leaves_out_and_carries_the_earlier_ones(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, held: int) -> None:
    """Rounds of appends, each compacted: layered runs and whole rewrites (and, with ``held`` 7, many folds of
    the offsets into ranges within one run). After each, the cursor's ranges cover every
    tombstone any run left out, the ones whose keys came back since included, in at most 32 ranges whose ends
    are such tombstones."""
    monkeypatch.setattr(latest_offsets, "MAX_DROPPED_HELD", held)
    rng = random.Random(5)
    log: list[tuple[bytes | None, bytes | None]] = []
    left_out: set[int] = set()
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "65536", "compaction.max.layers": "3"})
        for round_number in range(6):
            keys = 3_000 if round_number % 3 == 0 else 40
            batch = [(b"k%05d" % rng.randrange(keys), None if rng.random() < 0.2 else b"v") for _ in range(4_000)]
            store.append("t", batch, partition=0)
            log += batch
            Compactor(store).compact("t")
            left_out |= dropped_now(log)
            cursor = CompactedLedgers(store.partition_log("t", 0).folder).read_cursor()
            assert cursor is not None
            assert_well_formed(cursor.dropped_tombstones, 32)
            assert all(covered(cursor.dropped_tombstones, offset) for offset in left_out)
            assert all(first in left_out and last in left_out for first, last in cursor.dropped_tombstones)


def test_a_topic_without_deletions_records_none(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", [(b"a", b"1"), (b"a", b"2"), (None, b"keyless")])
        Compactor(store).compact("t")
        cursor = CompactedLedgers(store.partition_log("t", 0).folder).read_cursor()
        assert cursor is not None and cursor.dropped_tombstones == ()
        store.append("t", [(b"b", None), (b"b", b"back")])  # a tombstone that is not its key's latest
        Compactor(store).compact("t")
        cursor = CompactedLedgers(store.partition_log("t", 0).folder).read_cursor()
        assert cursor is not None and cursor.dropped_tombstones == ()


def test_a_rebuild_counts_the_offsets_retention_removed_as_holding_deletions(data_dir: Path) -> None:
    """Found in review: a rebuild (``verify --repair``) reads the raw log from its start, so it cannot see the
    tombstones earlier runs left out below it; its cursor covers every removed offset instead of forgetting them."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        store.append("t", [(b"a", b"A"), (b"x", b"X"), (b"a", None)] + [(b"k%02d" % n, b"v" * 30) for n in range(60)])
        Compactor(store).compact("t")
        store.delete_records("t", 0, 10)
        compact_partition(store.partition_log("t", 0), clock=store.clock, rebuild=True)
        cursor = CompactedLedgers(store.partition_log("t", 0).folder).read_cursor()
        assert cursor is not None and cursor.dropped_tombstones == ((0, 9),)


def test_a_cursor_of_an_earlier_release_reads_as_knowing_nothing_below_its_horizon(data_dir: Path) -> None:
    """Its views never recorded the tombstones they left out: any offset up to the horizon may hold one."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", [(b"a", b"1"), (b"b", b"2")])
        Compactor(store).compact("t")
        ledgers = CompactedLedgers(store.partition_log("t", 0).folder)
        cursor = ledgers.read_cursor()
        assert cursor is not None and cursor.dropped_tombstones == ()
        body = {name: value for name, value in asdict(cursor).items() if name != "dropped_tombstones"}
        ledgers.cursor_path.write_bytes(encode_record(CURSOR_RECORD, 3, body))
        earlier = ledgers.read_cursor()
        assert earlier is not None and earlier.dropped_tombstones == ((0, 1),)
        store.append("t", [(b"c", b"3")])
        Compactor(store).compact("t")  # the next run carries the unknown on
        assert (ledgers.read_cursor() or cursor).dropped_tombstones == ((0, 1),)


def test_the_remote_tier_reads_a_view_of_an_earlier_release_as_unknown_and_refuses_bad_ranges() -> None:
    view = RemoteCompactedView(3, 99, 120, 7, ("t-0/compacted/3.ledger",), 0, (), 0, (), ((5, 5), (40, 60)))
    record = view.to_record()
    assert RemoteCompactedView.from_record(json.loads(json.dumps(record))) == view
    del record["dropped_tombstones"]
    assert RemoteCompactedView.from_record(record).dropped_tombstones == ((0, 99),)
    for bad in ([[40, 60], [5, 5]], [[90, 120]], [[-1, 3]]):
        with pytest.raises(ValueError, match="not sorted ranges within the horizon 99"):
            RemoteCompactedView.from_record({**record, "dropped_tombstones": bad})


def test_a_reader_behind_the_log_start_is_warned_of_deletions_it_cannot_be_shown(
        data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Reader (and a Consumer) has no failOnDataLoss: it goes on from the ledger, as Pulsar's compacted reads
    do, and the log says which deletions it may have missed."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        store.append("t", [(b"a", b"A"), (b"x", b"X")])
        with Reader(store, "t", read_compacted=True) as reader:
            assert [m.key for m in reader] == [b"a", b"x"]  # raw: never compacted yet
            store.append("t", [(b"a", None)] + [(b"k%02d" % n, b"v" * 30) for n in range(60)])
            Compactor(store).compact("t")
            store.delete_records("t", 0, 10)
            with caplog.at_level(logging.WARNING, logger="readers.partition_read"):
                keys = [m.key for m in reader]
        assert b"a" not in keys and keys[-1] == b"k59"
        assert "t-0: a compacted read goes on from offset 2, below the raw log start 10" in caplog.text
        assert "deletions may lie at offsets 2 to 2" in caplog.text
