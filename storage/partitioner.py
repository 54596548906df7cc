"""Kafka's default partitioner, computed columnar over Arrow binary arrays.

Why: data written through ledgerview and data written through Kafka clients must land in the same partitions,
so that every message of a key sits in one partition log whichever client produced it (compaction keeps
the latest value per key *per partition*). Kafka's Java client and kafka-python both pick
``toPositive(murmur2(key)) % num_partitions`` with ``toPositive(h) = h & 0x7fffffff``; this module
computes the same numbers for a whole ``pa.binary()`` / ``pa.large_binary()`` array at once.

murmur2 as in ``org.apache.kafka.common.utils.Utils.murmur2`` (all arithmetic on 32-bit words, mod 2**32;
``>>>`` is a logical shift), with seed = 0x9747b28c, m = 0x5bd1e995, r = 24:

1. ``h = seed ^ len(key)``.
2. For each whole 4-byte block of the key, read as a little-endian word ``k``:
   ``k *= m; k ^= k >>> r; k *= m; h *= m; h ^= k``.
3. The 1 to 3 trailing bytes ``t``: ``h ^= t[2] << 16`` (3 left), ``h ^= t[1] << 8`` (2 or more),
   ``h ^= t[0]; h *= m`` (1 or more).
4. Final mix: ``h ^= h >>> 13; h *= m; h ^= h >>> 15``; the result is read as a signed Java int.

Vectorised, on uint32 numpy arrays (multiplication wraps as Java ints do): the keys' bytes are copied once
from the array's data buffer and read as unaligned little-endian words at each key's offsets. Step 2 loops
over the block index j (max key length / 4 iterations, not one per key), gathering block j of every key
that has one. Keys with more blocks than the shortest are sorted once by block count, so those that have
block j are a contiguous run of that order: a few long keys among many short ones cost only their own
blocks. Steps 1, 3 and 4 are whole-array operations.

Null keys: Kafka sends keyless records to a sticky or random partition, which cannot be reproduced here.
:func:`murmur2` hashes a null row as the empty key (the caller decides what nulls mean);
:func:`partition_for_keys` refuses nulls with a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

SEED: Final = np.uint32(0x9747B28C)
M: Final = np.uint32(0x5BD1E995)
R: Final = np.uint32(24)

U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]


def _key_bytes(keys: pa.Array | pa.ChunkedArray) -> tuple[I64, I64, U8]:
    """The keys' offsets (key i is bytes offsets[i] .. offsets[i + 1]), lengths (0 for null rows) and bytes:
    a copy of their span of the data buffer, padded with 8 zero bytes so that 8 bytes can be read at any key's
    end."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        raise TypeError(f"keys must be binary or large_binary, not {keys.type}: cast them first")
    validity, offsets_buffer, data = keys.buffers()
    offsets: I64 = np.zeros(1, np.int64)  # a zero-length array may come without buffers
    if offsets_buffer is not None:
        offset_dtype = "<i4" if pa.types.is_binary(keys.type) else "<i8"
        count = keys.offset + len(keys) + 1
        offsets = np.frombuffer(offsets_buffer, offset_dtype, count)[keys.offset :].astype(np.int64)
    begin, end = int(offsets[0]), int(offsets[-1])
    key_bytes = np.zeros(end - begin + 8, np.uint8)
    if data is not None:
        key_bytes[: end - begin] = np.frombuffer(data, np.uint8, count=end - begin, offset=begin)
    offsets -= begin
    lengths = np.diff(offsets)
    if validity is not None and keys.null_count:
        lengths[keys.is_null().to_numpy(zero_copy_only=False)] = 0
    return offsets, lengths, key_bytes


def _words(key_bytes: U8, dtype: str) -> npt.NDArray[Any]:
    """The little-endian unsigned int (``dtype`` "<u4" or "<u8") starting at each byte position, zero-copy."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(key_bytes.size - size + 1,), dtype=dtype, buffer=key_bytes, strides=(1,))


def _add_blocks(h: U32, starts: I64, first: Sequence[int], key_bytes: U8) -> None:
    """Step 2, in place, for blocks j = 0 .. len(first) - 1 of the keys at ``starts``, of which only those
    from index first[j] on have a block j. One gather reads two blocks: the 8 bytes at start + 4 * j."""
    for j in range(0, len(first), 2):
        two_blocks = _words(key_bytes[4 * j :], "<u8")[starts[first[j] :]].view("<u4").reshape(-1, 2)
        for column, start in enumerate(first[j : j + 2]):
            k = two_blocks[start - first[j] :, column] * M
            k ^= k >> R
            k *= M
            h[start:] *= M
            h[start:] ^= k


_TAIL_MASK: Final = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], np.uint32)
_TAIL_MULTIPLIER: Final = np.array([1, M, M, M], np.uint32)


def murmur2(keys: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int32]:
    """Kafka's ``Utils.murmur2`` of every key, as signed 32-bit ints; null rows hash as the empty key."""
    offsets, lengths, key_bytes = _key_bytes(keys)
    starts = offsets[:-1]
    h: U32 = lengths.astype(np.uint32)
    h ^= SEED
    blocks = lengths >> 2
    fewest, most = (int(blocks.min()), int(blocks.max())) if len(blocks) else (0, 0)
    _add_blocks(h, starts, [0] * fewest, key_bytes)  # the blocks every key has: whole arrays
    if most > fewest:
        # The keys with more blocks, sorted by block count (a radix sort for small counts): the keys that have
        # block j are then those from first[j - fewest] on.
        count_type = np.uint8 if most < 2**8 else np.uint16 if most < 2**16 else np.int64
        at_most = np.cumsum(np.bincount(blocks))  # at_most[j]: keys with <= j blocks
        longer = np.argsort(blocks.astype(count_type), kind="stable")[at_most[fewest] :]
        first = (at_most[fewest:most] - at_most[fewest]).tolist()
        state = h[longer]
        _add_blocks(state, starts[longer], first, key_bytes[4 * fewest :])
        h[longer] = state
    # Step 3: the 0 to 3 trailing bytes, as a little-endian word (masked to 0 when there are none).
    tail = lengths & 3
    last_word = _words(key_bytes, "<u4")[offsets[1:] - tail]
    last_word &= _TAIL_MASK[tail]
    h ^= last_word
    h *= _TAIL_MULTIPLIER[tail]
    h ^= h >> np.uint32(13)
    h *= M
    h ^= h >> np.uint32(15)
    return h.view(np.int32)


def partition_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> npt.NDArray[np.int32]:
    """Kafka's default partition of every key: ``(murmur2(key) & 0x7fffffff) % num_partitions``.

    Raises ``ValueError`` if a key is null: keyless messages need an explicit partition.
    """
    if not 1 <= num_partitions <= 0x7FFFFFFF:
        raise ValueError(f"num_partitions must be between 1 and 2**31 - 1, not {num_partitions}")
    if keys.null_count:
        row = int(pc.index(pc.is_null(keys), True).as_py())
        raise ValueError(
            f"key at row {row} is null ({keys.null_count} null keys): keyless messages need an explicit "
            "partition, Kafka's default partitioner only hashes keys"
        )
    return (murmur2(keys) & np.int32(0x7FFFFFFF)) % np.int32(num_partitions)
