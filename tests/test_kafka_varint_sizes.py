"""varint_sizes (one compare pass per byte the largest value needs) against the bytes encode_varint writes, for
values of every size, the extremes of int64 and each 7-bit boundary."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ledgerview.kafka.varints import encode_varint, varint_sizes, zigzag

BOUNDARIES = [sign * ((1 << bits) + delta) for bits in range(0, 63, 7) for delta in (-1, 0, 1) for sign in (1, -1)]


@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(BOUNDARIES), st.integers(-200, 200)),
                max_size=50))
def test_sizes_are_the_encoded_lengths(values: list[int]) -> None:
    zigzagged = zigzag(np.array(values, dtype=np.int64))
    assert varint_sizes(zigzagged).tolist() == [len(encode_varint(value)) for value in values]
