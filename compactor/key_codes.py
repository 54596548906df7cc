"""Keys as exact fixed-width codes, so that phase one groups them fast, and 64-bit hashes of keys, so that it can
split them into passes.

Grouping variable-length binary keys costs Arrow about twice as much as grouping fixed-size ones. When every key
has the same length L (fixed-width ids, the usual case), at most MAX_CODED_KEY_BYTES, phase one groups them as
``fixed_size_binary(L)``: the keys' own bytes, read zero-copy from the array's data buffer, so the coding is exact
(never a hash). Otherwise the keys stay binary. Both order keys as their bytes do, so sorting the codes sorts the
keys, as the key index's sorted runs need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from storage.binary_arrays import value_offsets
from storage.partitioner import murmur2

MAX_CODED_KEY_BYTES: Final = 64
_MIX: Final = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_SHIFT: Final = np.uint64(33)
U64 = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class KeyCoding:
    """How the keys of one compaction run are grouped: the same for every batch of the run."""

    width: int
    """Bytes per code, the length of every key; 0: keys stay binary."""

    @staticmethod
    def for_keys(keys: pa.Array) -> KeyCoding:
        """The coding for keys like these (a binary array without nulls)."""
        lengths = np.diff(_offsets_and_data(keys)[0])
        if len(lengths) and 0 < lengths[0] <= MAX_CODED_KEY_BYTES and np.all(lengths == lengths[0]):
            return KeyCoding(int(lengths[0]))
        return KeyCoding(0)

    def accepts(self, keys: pa.Array) -> bool:
        """Whether ``keys`` (binary, no nulls) can be coded: all of them are ``width`` bytes long."""
        return not self.width or bool(np.all(np.diff(_offsets_and_data(keys)[0]) == self.width))

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.binary(self.width) if self.width else pa.binary()

    def bytes_per_key(self, mean_key_bytes: float) -> float:
        """Bytes a grouped key itself takes (the code, or the binary key and its offset)."""
        return float(self.width) if self.width else mean_key_bytes + 4

    def encode(self, keys: pa.Array) -> pa.Array:
        """The codes of ``keys`` (binary, no nulls, accepted), zero-copy."""
        if not self.width:
            return keys
        offsets, data = _offsets_and_data(keys)
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(self.width), len(keys), [None, data.slice(int(offsets[0]), len(keys) * self.width)])

    def decode(self, codes: pa.Array) -> pa.Array:
        """The keys (binary) of ``codes``."""
        if not self.width:
            return codes
        offsets = np.arange(len(codes) + 1, dtype=np.int32) * self.width
        return pa.BinaryArray.from_buffers(pa.binary(), len(codes),
                                           [None, pa.py_buffer(offsets), pa.py_buffer(code_matrix(codes).tobytes())])

    def sort_order(self, codes: pa.Array) -> npt.NDArray[np.intp]:
        """Row order that sorts the keys bytewise (RocksDB's default comparator)."""
        if not self.width:
            return np.asarray(pc.sort_indices(codes).to_numpy(), dtype=np.intp)
        # The codes past the prefix they all share (ids often have one) as big-endian 64-bit words, zero-padded to
        # a multiple of 8 bytes (which keeps the order), sorted with the first word as the primary key: one
        # argsort when what differs fits 8 bytes.
        matrix = code_matrix(codes)
        same = np.flatnonzero(~np.all(matrix == matrix[:1], axis=0)) if len(matrix) else np.zeros(0, np.intp)
        if not len(same):  # every code is the same
            return np.arange(len(matrix), dtype=np.intp)
        matrix = matrix[:, int(same[0]) :]
        padded = np.zeros((len(matrix), -(-matrix.shape[1] // 8) * 8), np.uint8)
        padded[:, : matrix.shape[1]] = matrix
        words = padded.view(">u8").astype(np.uint64)
        if words.shape[1] <= 1:
            # Not a stable sort: equal codes are one key, and numpy's stable sort of 64-bit words was 3 to 5
            # times slower (0.14 to 0.23 s for 1M keys against 0.04 s).
            return np.argsort(words.ravel())
        order: npt.NDArray[np.intp] = np.lexsort([words[:, j] for j in reversed(range(words.shape[1]))])
        return order

    def hashes(self, codes: pa.Array) -> U64:
        """A well-mixed 64-bit hash of every key (equal keys, equal hashes), for estimating and partitioning."""
        if not self.width:
            return _mix(murmur2(codes).view(np.uint32).astype(np.uint64))
        matrix = code_matrix(codes)
        if self.width < 8:
            padded = np.zeros((len(matrix), 8), np.uint8)
            padded[:, : self.width] = matrix
            matrix = padded
        width = matrix.shape[1]
        result = np.full(len(matrix), np.uint64(width), np.uint64)
        starts = list(range(0, width - 7, 8)) + ([width - 8] if width % 8 else [])  # the last may overlap
        for start in starts:
            result ^= np.ndarray((len(matrix),), "<u8", matrix, offset=start, strides=(matrix.strides[0],))
            result *= _MIX[0]
            result ^= result >> _SHIFT
        return _mix(result)


def code_matrix(codes: pa.Array) -> npt.NDArray[np.uint8]:
    """The codes of a ``fixed_size_binary`` array as a (rows, width) byte matrix, zero-copy."""
    width = codes.type.byte_width
    data = codes.buffers()[1]
    if data is None or len(codes) == 0:
        return np.zeros((0, width), np.uint8)
    return np.frombuffer(data, np.uint8, len(codes) * width, codes.offset * width).reshape(len(codes), width)


def _offsets_and_data(keys: pa.Array) -> tuple[npt.NDArray[np.int64], pa.Buffer]:
    data = keys.buffers()[2]
    return value_offsets(keys).astype(np.int64), data if data is not None else pa.py_buffer(b"")


def _mix(values: U64) -> U64:
    """murmur3's 64-bit finaliser after a multiply: every input bit affects every output bit."""
    values = values * _MIX[0]
    values ^= values >> _SHIFT
    values *= _MIX[1]
    values ^= values >> _SHIFT
    values *= _MIX[2]
    values ^= values >> _SHIFT
    return values
