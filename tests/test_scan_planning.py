"""How a Spark batch read is cut into tasks (streaming/scan.py, ``segment_runs``): the runs cover the offsets
asked for exactly once, in order, and a segment larger than a task's share is cut into offset ranges, so that one
large partition spreads over many tasks; the table view's pieces all read the ledger they were planned on."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given

from compactor import Compactor
from storage import Store
from streaming.scan import ScanOptions, TopicScan, segment_runs
from streaming.source_offsets import DataLossError


@dataclass(frozen=True)
class Segment:
    base_offset: int
    size_bytes: int


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[Segment], int]:
    lengths = draw(st.lists(st.integers(1, 5_000), min_size=1, max_size=8))
    bases = [sum(lengths[:index]) for index in range(len(lengths))]
    segments = [Segment(base, length * draw(st.integers(1, 300))) for base, length in zip(bases, lengths,
                                                                                            strict=True)]
    return segments, sum(lengths)


@given(logs(), st.data(), st.integers(1_000, 2_000_000))
def test_runs_cover_the_range_once_in_order(log: tuple[list[Segment], int], data: st.DataObject,
                                            max_bytes: int) -> None:
    segments, end_offset = log
    start = data.draw(st.integers(0, end_offset))
    end = data.draw(st.integers(start, end_offset))
    runs = segment_runs(segments, start, end, max_bytes)
    if start == end:
        assert runs == []
        return
    assert runs[0][0] == start and runs[-1][1] == end
    assert all(low < high for low, high in runs)
    assert all(previous[1] == following[0] for previous, following in itertools.pairwise(runs))


def test_one_large_segment_is_cut_into_offset_ranges() -> None:
    runs = segment_runs([Segment(0, 100 * 1024 * 1024)], 0, 1_000_000, 25 * 1024 * 1024)
    assert runs == [(0, 250_000), (250_000, 500_000), (500_000, 750_000), (750_000, 1_000_000)]


def table_rows(scan: TopicScan, pieces: list[object]) -> list[tuple[int, int, bytes, bytes]]:
    return sorted((row["partition"], row["offset"], row["key"], row["value"]) for piece in pieces
                  for batch in scan.read(piece) for row in batch.to_pylist())  # type: ignore[arg-type]


def test_a_split_table_read_is_one_row_per_live_key_on_the_ledger_it_was_planned_on(tmp_path: Path) -> None:
    """The table view split into pieces over tasks: each piece reads the planned ledger, so a compaction
    published between planning and reading changes nothing in the answer (the retiring ledger is still read)."""
    with Store.open(tmp_path) as store:
        store.create_topic("t", config={"segment.bytes": "4096"})
        store.append("t", [(f"k{i % 50}", f"v{i}") for i in range(2_000)] + [("k7", None)])
        Compactor(store).compact("t")
        store.append("t", [("k1", "new"), ("k2", None)])
    scan = TopicScan(ScanOptions.parse({"path": str(tmp_path), "topic": "t", "maxPartitionBytes": "512"}))
    pieces = list(scan.partitions())
    assert len(pieces) > 3
    expected = sorted([(0, 1950 + i, f"k{i}".encode(), f"v{1950 + i}".encode()) for i in range(50)
                       if i not in (1, 2, 7)] + [(0, 2001, b"k1", b"new")])
    with Store.open(tmp_path) as store:
        store.append("t", [("k3", "later")])
        Compactor(store).compact("t")
    assert table_rows(scan, pieces) == expected


def test_a_split_table_read_of_a_layered_view_reads_each_ledger_once(tmp_path: Path) -> None:
    """The view planned on is layered (a ledger of what changed over the first); the pieces split its ledgers' rows
    by offset, leave out the rows the top ledger replaced, and keep reading it after a third compaction."""
    with Store.open(tmp_path) as store:
        store.create_topic("t", config={"segment.bytes": "4096"})
        store.append("t", [(f"k{i % 50}", f"v{i}") for i in range(2_000)])
        Compactor(store).compact("t")
        store.append("t", [("k1", "new"), ("k2", None), ("k60", "added")])
        [result] = Compactor(store).compact("t")
        assert result.layers == 2
    scan = TopicScan(ScanOptions.parse({"path": str(tmp_path), "topic": "t", "maxPartitionBytes": "512"}))
    pieces = list(scan.partitions())
    assert len(pieces) > 3
    expected = sorted([(0, 1950 + i, f"k{i}".encode(), f"v{1950 + i}".encode()) for i in range(50) if i not in (1, 2)]
                      + [(0, 2000, b"k1", b"new"), (0, 2002, b"k60", b"added")])
    with Store.open(tmp_path) as store:
        store.append("t", [("k3", "later")])
        Compactor(store).compact("t")
    assert table_rows(scan, pieces) == expected


def offsets_read(folder: Path, **options: str) -> list[int]:
    scan = TopicScan(ScanOptions.parse({"path": str(folder), "topic": "t", **options}))
    return sorted(row["offset"] for piece in scan.partitions() for batch in scan.read(piece)
                  for row in batch.to_pylist())


def test_batch_reads_take_kafkas_starting_and_ending_offsets(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        store.append("t", [(f"k{i % 5}", f"v{i}") for i in range(40)])
        Compactor(store).compact("t")  # horizon 39: the ledger holds 35..39
        store.append("t", [(f"k{i % 5}", f"v{i}") for i in range(40, 50)])
    assert offsets_read(tmp_path, view="raw", startingOffsets='{"t": {"0": 10}}',
                        endingOffsets='{"t": {"0": 20}}') == list(range(10, 20))
    assert offsets_read(tmp_path, view="read_compacted") == [*range(35, 50)]
    assert offsets_read(tmp_path, view="read_compacted", startingOffsets='{"t": {"0": 37}}',
                        endingOffsets='{"t": {"0": 45}}') == [37, 38, 39, *range(40, 45)]
    with Store.open(tmp_path) as store:
        store.alter_topic_config("t", {"cleanup.policy": "delete"})
        store.delete_records("t", 0, 30)
    with pytest.raises(DataLossError, match=r"Data loss in t-0: the query needs offsets from 10"):
        offsets_read(tmp_path, view="raw", startingOffsets='{"t": {"0": 10}}')
    assert offsets_read(tmp_path, view="raw", startingOffsets='{"t": {"0": 10}}', failOnDataLoss="false",
                        endingOffsets='{"t": {"0": 32}}') == [30, 31]
