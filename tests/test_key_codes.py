"""Phase one's key codes (compactor/key_codes.py) are exact: two keys share a code only if they are the same bytes,
codes decode back to their keys, and sorting codes sorts keys bytewise, as the key index's runs need (invariant 4
rests on grouping by exact keys)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor.key_codes import MAX_CODED_KEY_BYTES, KeyCoding, KeysRefused

short_keys = st.lists(st.binary(max_size=12), min_size=1, max_size=60)
"""Keys of several lengths, trailing and leading zero bytes and the empty key included: they stay binary."""
fixed_keys = st.integers(1, 11).flatmap(lambda width: st.lists(st.binary(min_size=width, max_size=width),
                                                               min_size=1, max_size=60))
prefixed_keys = st.tuples(st.binary(min_size=1, max_size=10), fixed_keys).map(
    lambda drawn: [drawn[0] + key for key in drawn[1]])
"""Fixed-width keys sharing a prefix, as ids do: the sort looks only past it."""
long_keys = st.lists(st.binary(max_size=MAX_CODED_KEY_BYTES + 8), min_size=1, max_size=20)


def coded(keys: list[bytes], *, words: bool) -> tuple[KeyCoding, pa.Array]:
    """``words``: the coding the keys choose (words where they fit); else the fixed coding where it fits."""
    array = pa.array(keys, pa.binary())
    coding = KeyCoding.for_keys(array)
    if not words and coding.prefix is not None:
        coding = KeyCoding(coding.width)
    return coding, coding.encode(array)


@given(st.one_of(short_keys, fixed_keys, prefixed_keys, long_keys), st.booleans())
def test_codes_are_exact_decode_back_and_sort_as_the_keys_do(keys: list[bytes], words: bool) -> None:
    coding, codes = coded(keys, words=words)
    assert coding.decode(codes).to_pylist() == keys
    assert len(set(codes.to_pylist())) == len(set(keys))
    assert [keys[row] for row in coding.sort_order(codes)] == sorted(keys)
    hashes = coding.hashes(codes)
    by_key: dict[bytes, set[int]] = {}
    for key, hashed in zip(keys, hashes.tolist(), strict=True):
        by_key.setdefault(key, set()).add(hashed)
    assert all(len(found) == 1 for found in by_key.values())


def test_the_coding_follows_the_key_lengths_and_shared_prefix() -> None:
    def coding(*keys: bytes) -> KeyCoding:
        return KeyCoding.for_keys(pa.array(keys, pa.binary()))

    assert coding(b"abc", b"xyz") == KeyCoding(3, b"")  # at most 8 bytes: a word
    assert coding(b"user-00000001", b"user-00000002") == KeyCoding(13, b"user-")  # the last 8 bytes differ
    assert coding(b"user-00000001", b"usEr-00000002") == KeyCoding(13)  # the shared part is not shared
    assert coding(b"abc", b"xy") == coding(b"", b"") == coding(b"x" * (MAX_CODED_KEY_BYTES + 1)) == KeyCoding(0)
    with pytest.raises(KeysRefused):
        KeyCoding(3, b"").encode(pa.array([b"abc", b"ab"], pa.binary()))
    assert KeyCoding(0).encode(pa.array([b"abc", b"ab"], pa.binary())).to_pylist() == [b"abc", b"ab"]


def test_a_refused_batch_widens_the_coding_to_one_that_takes_every_key_so_far() -> None:
    word = KeyCoding(13, b"user-")
    other_prefix = pa.array([b"item-00000001"], pa.binary())
    with pytest.raises(KeysRefused):
        word.encode(other_prefix)
    fixed = word.widened(other_prefix)
    assert fixed == KeyCoding(13)
    for keys in (other_prefix, pa.array([b"user-00000001"], pa.binary())):
        assert fixed.decode(fixed.encode(keys)) == keys
    other_length = pa.array([b"user-1"], pa.binary())
    assert word.widened(other_length) == fixed.widened(other_length) == KeyCoding(0)


def test_a_slice_of_fixed_width_keys_codes_only_its_own_keys() -> None:
    keys = pa.array([b"k%03d" % i for i in range(100)], pa.binary()).slice(40, 10)
    for coding in (KeyCoding(4), KeyCoding(4, b"")):
        assert coding.decode(coding.encode(keys)).to_pylist() == [b"k%03d" % i for i in range(40, 50)]


def test_hashes_spread_keys_that_differ_only_in_their_last_bytes() -> None:
    keys = pa.array([b"key%07d" % i for i in range(20_000)], pa.binary())
    for coding in (KeyCoding(10), KeyCoding(10, b"ke")):
        counts = np.bincount((coding.hashes(coding.encode(keys)) % np.uint64(16)).astype(np.int64), minlength=16)
        assert counts.min() > 20_000 / 16 * 0.8


@given(st.binary(min_size=1, max_size=MAX_CODED_KEY_BYTES - 8), st.integers(0, 1 << 16), st.integers(1, 40),
       st.integers(0, 1 << 16))
def test_a_key_that_differs_anywhere_in_the_shared_prefix_is_refused(prefix: bytes, position: int, rows: int,
                                                                      changed: int) -> None:
    """The prefix is compared several bytes at a time: a difference at any byte of it, in any row (of a slice, so
    that the keys start inside their buffer), must be seen."""
    keys = [prefix + b"%08d" % row for row in range(rows)]
    coding = KeyCoding.for_keys(pa.array(keys, pa.binary()))
    assert coding == KeyCoding(len(prefix) + 8, prefix)
    altered = bytearray(keys[changed % rows])
    altered[position % len(prefix)] ^= 0xFF
    keys[changed % rows] = bytes(altered)
    with pytest.raises(KeysRefused):
        coding.encode(pa.array([prefix + b"99999999", *keys], pa.binary()).slice(1))


@pytest.mark.parametrize(("keys", "coding_kind"), [
    ([b"key-%d" % i for i in range(65536)], KeyCoding(0)),
    ([b"%05d-%05d" % (i, i) for i in range(65536)], KeyCoding(11)),
    ([b"%012d" % i for i in range(65536)], KeyCoding(12, b"0000")),
], ids=["binary", "fixed", "word"])
def test_keys_spread_evenly_over_phase_ones_buckets(keys: list[bytes], coding_kind: KeyCoding) -> None:
    """Phase one cuts its pairs into buckets by these ids: uneven buckets hold more than their share of memory.
    The raw fingerprints' top bits were uneven for about 1 draw of the multipliers in 60 (flaky here before)."""
    array = pa.array(keys, pa.binary())
    coding = KeyCoding.for_keys(array)
    assert coding == coding_kind
    counts = np.bincount(coding.bucket_ids(coding.encode(array), 8), minlength=256)
    assert counts.min() > 256 * 0.6 and counts.max() < 256 * 1.4  # 256 a bucket on average; 6 sigma is +-96
