"""storage.partitioner against kafka-python's pure-Python murmur2 and Kafka's own UtilsTest values."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest

from storage.partitioner import murmur2, partition_for_keys

with warnings.catch_warnings():  # kafka-python 3.0 imports call the deprecated importlib.resources.read_text
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_murmur2


def reference(key: bytes) -> int:
    """kafka-python's murmur2 returns the hash as an unsigned 32-bit int: read it as Java's signed int."""
    h = int(kafka_murmur2(key))
    return h - (1 << 32) if h >= 1 << 31 else h


def expected(keys: list[bytes]) -> list[int]:
    return [reference(key) for key in keys]


_rng = np.random.default_rng(7)
RNG_KEYS = [_rng.bytes(int(length)) for length in _rng.integers(0, 64, 3000)]
"""A few thousand random keys, lengths 0 .. 63 (so every tail length and up to 15 blocks), all byte values."""
RNG_HASHES = expected(RNG_KEYS)


# org.apache.kafka.common.utils.UtilsTest.testMurmur2
@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_kafka_utils_test_values(key: bytes, value: int) -> None:
    assert reference(key) == value
    assert murmur2(pa.array([key], pa.binary())).tolist() == [value]


def test_every_length_up_to_40() -> None:
    rng = np.random.default_rng(1)
    keys = [rng.bytes(length) for length in range(41)] + [b"\xff" * length for length in range(41)]
    result = murmur2(pa.array(keys, pa.binary()))
    assert result.dtype == np.int32
    assert result.tolist() == expected(keys)


def test_random_keys() -> None:
    assert murmur2(pa.array(RNG_KEYS, pa.binary())).tolist() == RNG_HASHES


def test_sliced_array() -> None:
    array = pa.array(RNG_KEYS[:100], pa.binary())
    assert murmur2(array.slice(3, 50)).tolist() == RNG_HASHES[3:53]
    assert murmur2(array.slice(99)).tolist() == RNG_HASHES[99:100]
    assert murmur2(array.slice(100)).tolist() == []


def test_large_binary() -> None:
    array = pa.array(RNG_KEYS[:500], pa.large_binary())
    assert murmur2(array).tolist() == RNG_HASHES[:500]
    assert murmur2(array.slice(17, 100)).tolist() == RNG_HASHES[17:117]


def test_chunked_array() -> None:
    chunks = [pa.array(keys, pa.binary()) for keys in (RNG_KEYS[:100], [], RNG_KEYS[100:300])]
    assert murmur2(pa.chunked_array(chunks)).tolist() == RNG_HASHES[:300]
    assert murmur2(pa.chunked_array([], pa.binary())).tolist() == []


def test_a_few_very_long_keys_among_short_ones() -> None:
    rng = np.random.default_rng(2)
    keys = [rng.bytes(int(length)) for length in rng.integers(0, 20, 400)]
    for at, length in [(5, 2048), (200, 2047), (399, 2050)]:
        keys[at] = rng.bytes(length)
    assert murmur2(pa.array(keys, pa.binary())).tolist() == expected(keys)


def test_empty_array() -> None:
    result = murmur2(pa.array([], pa.binary()))
    assert result.dtype == np.int32
    assert len(result) == 0


def test_murmur2_hashes_null_as_the_empty_key() -> None:
    assert murmur2(pa.array([b"abc", None, b"21"], pa.binary())).tolist() == expected([b"abc", b"", b"21"])


def test_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="binary or large_binary"):
        murmur2(pa.array(["abc"]))


@pytest.mark.parametrize("num_partitions", [1, 3, 12])
def test_partition_for_keys(num_partitions: int) -> None:
    partitions = partition_for_keys(pa.array(RNG_KEYS, pa.binary()), num_partitions)
    assert partitions.dtype == np.int32
    assert partitions.tolist() == [(h & 0x7FFFFFFF) % num_partitions for h in RNG_HASHES]


def test_partition_for_keys_refuses_null_keys() -> None:
    keys = pa.chunked_array([pa.array([b"a", b"b"], pa.binary()), pa.array([b"c", None, None], pa.binary())])
    with pytest.raises(ValueError, match=r"row 3 is null .*keyless messages need an explicit partition"):
        partition_for_keys(keys, 3)


@pytest.mark.parametrize("num_partitions", [0, -1, 2**31])
def test_partition_for_keys_refuses_bad_partition_counts(num_partitions: int) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_keys(pa.array([b"a"], pa.binary()), num_partitions)
