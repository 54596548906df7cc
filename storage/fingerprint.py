"""64-bit fingerprints of binary keys, the engine's one key hash: the cleaner's key map keeps them (a fixed 8 bytes
per key whatever its length, as Kafka's cleaner keeps a fixed 16-byte MD5 per key) and the compactor splits its
phase one by them (compactor/key_codes.py).

Computed for a whole ``pa.binary()`` array at once, without a loop per key: keys are taken by length class (one
class when keys have a fixed width, the common case), each class as a 2-D byte array zero-padded to whole 64-bit
words; the loop runs over the word index (a key of L bytes has ceil(L / 8) words), never over the keys. Each word
is mixed into the hash with a multiply-rotate step, the length first, so keys that differ only by trailing zero
bytes differ. A splitmix64 finaliser spreads the bits.

Two distinct keys share a fingerprint with probability about 2**-64 per pair (Kafka accepts MD5's 2**-128); the
cleaner would then treat them as one key. With a million keys in one map that is about 3 in 10**8 per pass.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from storage.binary_arrays import value_offsets

U64 = npt.NDArray[np.uint64]

_SEED = np.uint64(0x9E3779B97F4A7C15)
_MULTIPLY = np.uint64(0xBF58476D1CE4E5B9)
_WORD_MULTIPLY = np.uint64(0x94D049BB133111EB)
_ROTATE = np.uint64(31)
_ROTATE_BACK = np.uint64(33)


def fingerprints(keys: pa.Array) -> U64:
    """A uint64 per key of a binary array (a null key fingerprints as the empty key; callers drop nulls)."""
    if not pa.types.is_binary(keys.type):
        raise TypeError(f"keys must be binary, not {keys.type}")
    count = len(keys)
    if count == 0:
        return np.empty(0, dtype=np.uint64)
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
        return fingerprint_rows(data.reshape(count, longest))
    state = np.empty(count, dtype=np.uint64)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        rows_bytes = data[starts[rows, None] + np.arange(length)] if length else np.zeros((len(rows), 0), np.uint8)
        state[rows] = _hash_fixed_width(rows_bytes, length)
    return _finalise(state)


def fingerprint_rows(rows_bytes: npt.NDArray[np.uint8]) -> U64:
    """The fingerprints of keys given as the rows of a (keys, length) byte matrix: equal to ``fingerprints`` of the
    same keys as a binary array."""
    return _finalise(_hash_fixed_width(rows_bytes, rows_bytes.shape[1]))


def _hash_fixed_width(rows_bytes: npt.NDArray[np.uint8], length: int) -> U64:
    """The unfinalised hash of keys that all have ``length`` bytes (one per row of ``rows_bytes``)."""
    count = rows_bytes.shape[0]
    word_count = (length + 7) // 8
    padded = np.zeros((count, word_count * 8), dtype=np.uint8)
    padded[:, :length] = rows_bytes
    words = padded.view("<u8")
    state = np.full(count, ((length + int(_SEED)) * int(_MULTIPLY)) % 2**64, dtype=np.uint64)
    for j in range(word_count):
        mixed = words[:, j] * _WORD_MULTIPLY
        mixed = (mixed << _ROTATE) | (mixed >> _ROTATE_BACK)
        state ^= mixed
        state *= _MULTIPLY
    return state


def _finalise(state: U64) -> U64:
    """splitmix64's finaliser: every input bit affects every output bit."""
    state = state ^ (state >> np.uint64(30))
    state = state * _MULTIPLY
    state = state ^ (state >> np.uint64(27))
    state = state * _WORD_MULTIPLY
    result: U64 = state ^ (state >> np.uint64(31))
    return result
