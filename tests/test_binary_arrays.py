"""The shared zero-copy view of a binary array's offsets, which sizing, fingerprinting, key coding and the Kafka
record encoder all read values through."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.binary_arrays import value_lengths, value_offsets


def test_a_slice_sees_its_own_values() -> None:
    whole = pa.array([b"a", None, b"ccc", b"", b"eeeee", b"ff"], pa.binary())
    part = whole.slice(2, 3)
    offsets = value_offsets(part)
    data = part.buffers()[2].to_pybytes()
    assert [data[start:end] for start, end in itertools.pairwise(offsets)] == [b"ccc", b"", b"eeeee"]
    assert value_lengths(part).tolist() == pc.binary_length(part).to_pylist() == [3, 0, 5]


def test_a_null_spans_no_bytes_and_an_empty_array_has_one_offset() -> None:
    assert value_lengths(pa.array([b"xy", None], pa.binary())).tolist() == [2, 0]
    empty = pa.array([], pa.binary())
    assert value_offsets(empty).tolist() == [0] and value_lengths(empty).dtype == np.int32
