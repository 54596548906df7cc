"""What both streaming sources share (streaming/source_offsets.py): the split of maxOffsetsPerTrigger over
partitions, and where a read starts when retention deleted offsets it needed."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from streaming.source_offsets import DataLossError, admitted, checked_start

partitions = st.sampled_from([("orders", "0"), ("orders", "1"), ("payments", "0"), ("payments", "3")])
positions = st.dictionaries(partitions, st.tuples(st.integers(0, 1_000), st.integers(0, 5_000)), min_size=1)


@given(positions, st.integers(1, 3_000))
@example({("orders", "0"): (0, 197), ("orders", "1"): (0, 288), ("payments", "0"): (0, 3230),
          ("payments", "3"): (0, 4785)}, 1500)  # a share of exactly 570 must not take a spare message
def test_a_micro_batch_admits_at_most_the_limit_shared_in_proportion(
        offsets: dict[tuple[str, str], tuple[int, int]], max_rows: int) -> None:
    begin = {p: start for p, (start, _) in offsets.items()}
    ends = {p: start + waiting for p, (start, waiting) in offsets.items()}
    total = sum(ends[p] - begin[p] for p in ends)
    stops = admitted(begin, ends, max_rows)
    assert stops.keys() == ends.keys()
    assert all(begin[p] <= stops[p] <= ends[p] for p in ends)
    assert sum(stops[p] - begin[p] for p in ends) == min(total, max_rows)
    for p in ends:  # each partition's share is its exact proportion, rounded one way or the other
        exact = (ends[p] - begin[p]) * min(total, max_rows) / total if total else 0
        assert abs((stops[p] - begin[p]) - exact) < 1


def test_a_partition_the_start_lacks_is_counted_from_offset_0() -> None:
    assert admitted({0: 100}, {0: 200, 1: 100}, 100) == {0: 150, 1: 50}


def test_a_read_starts_where_planned_unless_retention_deleted_that_offset() -> None:
    assert checked_start("t", 0, 120, 100, fail_on_data_loss=True) == 120
    assert checked_start("t", 0, 100, 150, fail_on_data_loss=False) == 150
    with pytest.raises(DataLossError, match=r"Data loss in t-0: .* from 100, .* below 150 \(50 messages lost\)"):
        checked_start("t", 0, 100, 150, fail_on_data_loss=True)
