"""Phase one's key codes (compactor/key_codes.py) are exact: two keys share a code only if they are the same bytes,
codes decode back to their keys, and sorting codes sorts keys bytewise, as the key index's runs need (invariant 4
rests on grouping by exact keys)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from compactor.key_codes import MAX_CODED_KEY_BYTES, KeyCoding

short_keys = st.lists(st.binary(max_size=12), min_size=1, max_size=60)
"""Keys of several lengths, trailing and leading zero bytes and the empty key included: they stay binary."""
fixed_keys = st.integers(1, 11).flatmap(lambda width: st.lists(st.binary(min_size=width, max_size=width),
                                                               min_size=1, max_size=60))
prefixed_keys = st.tuples(st.binary(min_size=1, max_size=10), fixed_keys).map(
    lambda drawn: [drawn[0] + key for key in drawn[1]])
"""Fixed-width keys sharing a prefix, as ids do: the sort looks only past it."""
long_keys = st.lists(st.binary(max_size=MAX_CODED_KEY_BYTES + 8), min_size=1, max_size=20)


def coded(keys: list[bytes]) -> tuple[KeyCoding, pa.Array]:
    array = pa.array(keys, pa.binary())
    coding = KeyCoding.for_keys(array)
    assert coding.accepts(array)
    return coding, coding.encode(array)


@given(st.one_of(short_keys, fixed_keys, prefixed_keys, long_keys))
def test_codes_are_exact_decode_back_and_sort_as_the_keys_do(keys: list[bytes]) -> None:
    coding, codes = coded(keys)
    assert coding.decode(codes).to_pylist() == keys
    assert len(set(codes.to_pylist())) == len(set(keys))
    assert [keys[row] for row in coding.sort_order(codes)] == sorted(keys)
    hashes = coding.hashes(codes)
    by_key: dict[bytes, set[int]] = {}
    for key, hashed in zip(keys, hashes.tolist(), strict=True):
        by_key.setdefault(key, set()).add(hashed)
    assert all(len(found) == 1 for found in by_key.values())


def test_the_coding_follows_the_key_lengths() -> None:
    def coding(*keys: bytes) -> KeyCoding:
        return KeyCoding.for_keys(pa.array(keys, pa.binary()))

    assert coding(b"abc", b"xyz") == KeyCoding(3)  # zero-copy: the keys' own bytes
    assert coding(b"abc", b"xy") == coding(b"", b"") == coding(b"x" * (MAX_CODED_KEY_BYTES + 1)) == KeyCoding(0)
    assert not KeyCoding(3).accepts(pa.array([b"abc", b"ab"], pa.binary()))
    assert KeyCoding(0).accepts(pa.array([b"abc", b"ab"], pa.binary()))


def test_a_slice_of_fixed_width_keys_codes_only_its_own_keys() -> None:
    keys = pa.array([b"k%03d" % i for i in range(100)], pa.binary()).slice(40, 10)
    coding = KeyCoding(4)
    assert coding.decode(coding.encode(keys)).to_pylist() == [b"k%03d" % i for i in range(40, 50)]


def test_hashes_spread_keys_that_differ_only_in_their_last_bytes() -> None:
    keys = pa.array([b"key%07d" % i for i in range(20_000)], pa.binary())
    coding = KeyCoding(10)
    counts = np.bincount((coding.hashes(coding.encode(keys)) % np.uint64(16)).astype(np.int64), minlength=16)
    assert counts.min() > 20_000 / 16 * 0.8
