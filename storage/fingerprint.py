"""Fingerprints of binary keys, the engine's one key hash: 64 bits (``fingerprints``) where a collision only costs
time, as when the compactor splits its phase one by them (compactor/key_codes.py), and 128 bits
(``wide_fingerprints``) where a collision would lose data: the cleaner's key map keeps them (a fixed 16 bytes per
key whatever its length, as Kafka's cleaner keeps a fixed 16-byte MD5 per key).

The hash is keyed: its multipliers are drawn at random once per process, so that no one outside the process can
choose a key with the fingerprint of another. With the fixed hash this module had before, anyone who could append
to a compacted topic computed in microseconds a key of their own with the fingerprint of someone else's key, and
the next cleaning pass removed that key's latest message as superseded. Fingerprints therefore differ between
processes and are never stored: a key map, a phase one and their spills live in one process.

The family is the vector multiply-shift hash (Dietzfelbinger; Thorup, "High Speed Hashing for Integers and
Strings", 2015, section 3.3): a key is a vector of 32-bit words, its byte length first, then its bytes as
little-endian words (zero-padded), and one lane is ``(a[0] + sum(a[i + 1] * x[i])) mod 2**64 >> 32`` with random
64-bit multipliers ``a``. A lane is strongly universal: two distinct keys, chosen without knowing ``a``, share its
32 bits with probability 2**-32. Two lanes with their own multipliers make a 64-bit fingerprint: 2**-64 per
pair; four make a wide one: 2**-128 (Kafka accepts MD5's 2**-128). The cleaner removes a message whose key's
fingerprint is in its map of the dirty keys, so what counts is every pair of a key of the log and a key of the
map: with 64 bits, 10**8 keys against a map of 10**7 would lose a live message in about 1 pass of 20,000, without
a trace; hence the wide fingerprint there. The length word makes keys that differ only by trailing zero bytes
distinct vectors.

A key longer than BLOCK_BYTES is hashed as a tree: its blocks of BLOCK_BYTES (the last zero-padded) are hashed
alone (with as many lanes), and the row of their fingerprints is hashed as the key, with the key's own length as
its first word. So the multipliers are a fixed 34 a lane whatever the key length (a table that grew with the
longest key would let one huge key hold memory for the life of the process), and two distinct keys of n blocks
collide with probability at most about n times that of a pair: distinct keys differ in a block, whose fingerprints
then collide, or in the row above.

Computed for a whole ``pa.binary()`` array at once, without a loop per key: keys are taken by length class (one
class when keys have a fixed width, the common case), each class as a 2-D array of 32-bit words; the loop runs
over the word index, never over the keys.
"""

from __future__ import annotations

import secrets
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from storage.binary_arrays import value_offsets

U64 = npt.NDArray[np.uint64]

LANES: Final = 4
"""Lanes 0 and 1 make ``fingerprints``; all four ``wide_fingerprints``."""
BLOCK_BYTES: Final = 128
"""Keys longer than this are hashed as a tree of blocks (``_tree_hash``)."""
ROWS_PER_SLICE: Final = 65536
_MULTIPLIERS: Final = np.random.Generator(np.random.PCG64(secrets.randbits(128))).integers(
    0, 2**64, (LANES, BLOCK_BYTES // 4 + 2), dtype=np.uint64)
"""Each lane's multipliers ``a``, drawn once per process; never shown outside this module."""


def fingerprints(keys: pa.Array) -> U64:
    """A uint64 per key of a binary array (a null key fingerprints as the empty key; callers drop nulls)."""
    return _keys_hash(keys, 1).ravel()


def wide_fingerprints(keys: pa.Array) -> npt.NDArray[np.uint64]:
    """The 128-bit fingerprint of each key of a binary array as a (keys, 2) array, its high 64 bits first (a null
    key fingerprints as the empty key; callers drop nulls). The high bits are not ``fingerprints``' for keys
    longer than BLOCK_BYTES."""
    return _keys_hash(keys, 2)


def _keys_hash(keys: pa.Array, words: int) -> npt.NDArray[np.uint64]:
    """``words`` 64-bit fingerprint words (1 or 2) per key of a binary array, as a (keys, words) array."""
    if not pa.types.is_binary(keys.type):
        raise TypeError(f"keys must be binary, not {keys.type}")
    count = len(keys)
    if count == 0:
        return np.empty((0, words), dtype=np.uint64)
    offsets = value_offsets(keys)
    first = int(offsets[0])
    starts = offsets[:-1] - first
    lengths = np.diff(offsets)
    data_buffer = keys.buffers()[2]
    span = int(offsets[-1]) - first
    data = (np.frombuffer(data_buffer, dtype=np.uint8, count=span, offset=first) if span
            else np.zeros(0, dtype=np.uint8))
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest == longest:
        return _tree_hash(data.reshape(count, longest), longest, words)
    result = np.empty((count, words), dtype=np.uint64)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        rows_bytes = data[starts[rows, None] + np.arange(length)] if length else np.zeros((len(rows), 0), np.uint8)
        result[rows] = _tree_hash(rows_bytes, length, words)
    return result


def fingerprint_rows(rows_bytes: npt.NDArray[np.uint8]) -> U64:
    """The fingerprints of keys given as the rows of a (keys, length) byte matrix: equal to ``fingerprints`` of the
    same keys as a binary array."""
    return _tree_hash(rows_bytes, rows_bytes.shape[1], 1).ravel()


def _tree_hash(rows_bytes: npt.NDArray[np.uint8], length_word: int, words: int) -> npt.NDArray[np.uint64]:
    """The (rows, words) fingerprint words of the rows of ``rows_bytes`` (keys of one length; ``length_word``: the
    length a key's vector starts with). Rows of up to BLOCK_BYTES are hashed as they are; longer ones are cut into
    blocks (zero-padded), each block hashed, and the rows of block fingerprints hashed the same way, so that no key
    needs more multipliers than a block."""
    count, width = rows_bytes.shape
    if width <= BLOCK_BYTES:
        return _sliced_hash(rows_bytes, length_word, words)
    blocks = -(-width // BLOCK_BYTES)
    padded = np.zeros((count, blocks * BLOCK_BYTES), dtype=np.uint8)
    padded[:, :width] = rows_bytes
    block_fingerprints = _sliced_hash(padded.reshape(count * blocks, BLOCK_BYTES), BLOCK_BYTES, words)
    return _tree_hash(block_fingerprints.view(np.uint8).reshape(count, blocks * 8 * words), length_word, words)


def _sliced_hash(rows_bytes: npt.NDArray[np.uint8], length_word: int, words: int) -> npt.NDArray[np.uint64]:
    """The vector hash of rows of at most BLOCK_BYTES, ROWS_PER_SLICE rows at a time so that the word arrays stay
    small and in the CPU's caches."""
    count, width = rows_bytes.shape
    result = np.empty((count, words), dtype=np.uint64)
    for first in range(0, count, ROWS_PER_SLICE):
        rows = rows_bytes[first : first + ROWS_PER_SLICE]
        by_word = np.zeros((len(rows), -(-width // 4) * 4), dtype=np.uint8)
        by_word[:, :width] = rows
        result[first : first + len(rows)] = _vector_multiply_shift(by_word.view("<u4"), length_word, words)
    return result


def _vector_multiply_shift(by_word: npt.NDArray[np.uint32], length_word: int, words: int) -> npt.NDArray[np.uint64]:
    """The first ``2 * words`` lanes of the vectors (length_word, *row) for the rows of ``by_word``, two lanes to a
    64-bit fingerprint word: a (rows, words) array."""
    count = by_word.shape[0]
    multipliers = _MULTIPLIERS[: 2 * words]
    lanes = [np.full(count, (int(a[0]) + int(a[1]) * length_word) % 2**64, dtype=np.uint64) for a in multipliers]
    word, term = np.empty(count, dtype=np.uint64), np.empty(count, dtype=np.uint64)
    for j in range(by_word.shape[1]):
        np.copyto(word, by_word[:, j], casting="safe")
        for lane, a in zip(lanes, multipliers, strict=True):
            np.multiply(word, a[j + 2], out=term)
            np.add(lane, term, out=lane)
    result = np.empty((count, words), dtype=np.uint64)
    for index in range(words):
        high, low = (np.right_shift(lane, np.uint64(32), out=lane) for lane in lanes[2 * index : 2 * index + 2])
        np.bitwise_or(np.left_shift(high, np.uint64(32), out=high), low, out=result[:, index])
    return result
