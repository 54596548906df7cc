"""Phase one hands the aggregation its input cut into pieces (compactor/passes.py ``cut_pieces``): every keyed
message exactly once and in order, in pieces that are never empty and never much bigger than asked, even when the
size asked for changes between cuts (a watched pass asks for smaller pieces once memory grows)."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from compactor.passes import cut_pieces


@given(st.lists(st.integers(0, 300), max_size=30), st.lists(st.integers(1, 200), min_size=1, max_size=30))
def test_pieces_hold_every_message_once_in_order(input_sizes: list[int], asked: list[int]) -> None:
    numbers = np.arange(sum(input_sizes), dtype=np.int64)
    bounds = np.cumsum([0, *input_sizes])
    inputs = [(pa.array(numbers[start:end]), numbers[start:end]) for start, end in itertools.pairwise(bounds)]
    sizes = itertools.cycle(asked)
    pieces = list(cut_pieces(iter(inputs), lambda: next(sizes)))
    flat = [part for piece in pieces for part in piece]
    assert np.array_equal(np.concatenate([numbers for _, numbers in flat] or [np.empty(0, np.int64)]), numbers)
    assert all(codes.to_numpy().tolist() == part.tolist() for codes, part in flat)
    for piece in pieces:
        assert 0 < sum(len(part) for _, part in piece) <= max(asked) * 3 // 2 + 1
