"""Keys as exact codes that Arrow groups fast, and 64-bit hashes of keys, so that phase one can split them into
passes.

Arrow groups integers fastest: 10M messages of 9-byte keys took it 0.21 to 0.43 s as uint64 words, 0.36 to 0.62 s
as ``fixed_size_binary(9)`` and about twice that as binary. So when every key has the same length L:

- *word coding*: if L <= 8, or if every key shares its first L - 8 bytes (ids often share a prefix), the code is
  the key's last min(L, 8) bytes as a big-endian uint64 (zero-padded on the right when L < 8) and the shared prefix
  is kept once;
- *fixed coding*: otherwise, ``fixed_size_binary(L)``, the keys' own bytes, zero-copy;

and keys of several lengths stay binary. Every coding is exact (never a hash) and orders its codes as the keys'
bytes, so sorting the codes sorts the keys, as the key index's sorted runs need. The coding is chosen from the
first batch; a later batch it refuses makes phase one start again with a wider one (``widened``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from storage.binary_arrays import value_offsets
from storage.fingerprint import fingerprint_rows, fingerprints

MAX_CODED_KEY_BYTES: Final = 64
WORD_BYTES: Final = 8
U64 = npt.NDArray[np.uint64]
_BUCKET_MULTIPLIER: Final = np.uint64(secrets.randbits(64) | 1)
"""Odd, drawn at random once per process: multiply-shift hashing (Dietzfelbinger) spreads the top bits of any keys
not chosen knowing it. With a fixed multiplier (2**64 / phi before), a producer could choose keys whose products
share their top bits: every key fell in one bucket, and phase one finished that bucket whole, far past its
memory budget."""


class KeysRefused(Exception):
    """Keys a coding cannot code: phase one starts again with ``KeyCoding.widened``."""

    def __init__(self, refused: pa.Array) -> None:
        super().__init__(f"{len(refused)} keys do not fit the key coding")
        self.refused = refused


@dataclass(frozen=True)
class KeyCoding:
    """How the keys of one compaction run are grouped: the same for every batch of the run."""

    width: int
    """The length of every key; 0: keys of any length, grouped as binary."""
    prefix: bytes | None = None
    """Word coding: the first ``width - 8`` bytes every key shares (empty when width <= 8). None: fixed coding
    (``width`` > 0) or binary."""

    @staticmethod
    def for_keys(keys: pa.Array) -> KeyCoding:
        """The narrowest coding for keys like these (a binary array without nulls)."""
        width = _single_length(keys)
        if not width:
            return KeyCoding(0)
        shared = max(0, width - WORD_BYTES)
        matrix = _key_matrix(keys, width)
        if len(matrix) and _rows_start_with(matrix, matrix[0, :shared].tobytes()):
            return KeyCoding(width, matrix[0, :shared].tobytes())
        return KeyCoding(width)

    def widened(self, refused: pa.Array) -> KeyCoding:
        """The coding to start again with after ``encode`` refused ``refused``: it codes them and every key this one
        did."""
        if self.prefix is not None and _single_length(refused) == self.width:
            return KeyCoding(self.width)
        return KeyCoding(0)

    @property
    def arrow_type(self) -> pa.DataType:
        if self.prefix is not None:
            return pa.uint64()
        return pa.binary(self.width) if self.width else pa.binary()

    @property
    def code_bytes(self) -> int:
        """Bytes of every code (0: binary codes, of any length)."""
        return WORD_BYTES if self.prefix is not None else self.width

    def bytes_per_key(self, mean_key_bytes: float) -> float:
        """Bytes a grouped key itself takes (the code, or the binary key and its offset)."""
        return float(self.code_bytes) if self.width else mean_key_bytes + 4

    def encode(self, keys: pa.Array) -> pa.Array:
        """The codes of ``keys`` (binary, no nulls); raises KeysRefused unless every key is ``width`` bytes long
        (and shares the prefix)."""
        if not self.width:
            return keys
        if not len(keys):
            return pa.array([], self.arrow_type)
        if _single_length(keys) != self.width:
            raise KeysRefused(keys)
        matrix = _key_matrix(keys, self.width)
        if self.prefix is None:
            return pa.FixedSizeBinaryArray.from_buffers(pa.binary(self.width), len(keys),
                                                        [None, pa.py_buffer(matrix)])
        if not _rows_start_with(matrix, self.prefix):
            raise KeysRefused(keys)
        if self.width >= WORD_BYTES:
            words = np.ndarray((len(matrix),), ">u8", matrix, offset=self.width - WORD_BYTES,
                               strides=(matrix.strides[0],))
        else:
            padded = np.zeros((len(matrix), WORD_BYTES), np.uint8)
            padded[:, : self.width] = matrix
            words = padded.view(">u8").ravel()
        return pa.array(words.astype(np.uint64), pa.uint64())

    def decode(self, codes: pa.Array) -> pa.Array:
        """The keys (binary) of ``codes``."""
        if not self.width:
            return codes
        if self.prefix is None:
            matrix = code_matrix(codes)
        else:
            words = np.asarray(codes.to_numpy(), ">u8").view(np.uint8).reshape(len(codes), WORD_BYTES)
            matrix = np.empty((len(codes), self.width), np.uint8)
            matrix[:, : len(self.prefix)] = np.frombuffer(self.prefix, np.uint8)
            matrix[:, len(self.prefix) :] = words[:, : self.width - len(self.prefix)]
        offsets = np.arange(len(codes) + 1, dtype=np.int32) * self.width
        return pa.BinaryArray.from_buffers(pa.binary(), len(codes),
                                           [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(matrix))])

    def sort_order(self, codes: pa.Array) -> npt.NDArray[np.intp]:
        """Row order that sorts the keys bytewise (RocksDB's default comparator). Not a stable sort: equal codes
        are one key, and numpy's stable sort of 64-bit words was 3 to 5 times slower (0.14 to 0.23 s for 1M keys
        against 0.04 s)."""
        if not self.width:
            return np.asarray(pc.sort_indices(codes).to_numpy(), dtype=np.intp)
        if self.prefix is not None:
            return np.argsort(codes.to_numpy())
        # The codes past the prefix they all share as big-endian 64-bit words, zero-padded to a multiple of 8
        # bytes (which keeps the order), sorted with the first word as the primary key.
        matrix = code_matrix(codes)
        same = np.flatnonzero(~np.all(matrix == matrix[:1], axis=0)) if len(matrix) else np.zeros(0, np.intp)
        if not len(same):  # every code is the same
            return np.arange(len(matrix), dtype=np.intp)
        matrix = matrix[:, int(same[0]) :]
        padded = np.zeros((len(matrix), -(-matrix.shape[1] // 8) * 8), np.uint8)
        padded[:, : matrix.shape[1]] = matrix
        words = padded.view(">u8").astype(np.uint64)
        if words.shape[1] <= 1:
            return np.argsort(words.ravel())
        order: npt.NDArray[np.intp] = np.lexsort([words[:, j] for j in reversed(range(words.shape[1]))])
        return order

    def bucket_ids(self, codes: pa.Array, bits: int) -> np.ndarray:
        """A bucket from 0 to 2**bits - 1 (bits <= 16) for every key, equal keys in one bucket. Word codes take the
        top bits of the word times _BUCKET_MULTIPLIER, xor-shifted and multiplied once more (about 1.3 ns a key,
        where ``hashes`` costs about 20); other codes the top bits of ``hashes``, which is keyed too. The product
        alone spreads keys in arithmetic progression (ids, timestamps) unevenly for some multipliers: 64k
        consecutive ids over 256 buckets (256 a bucket on average) fell outside 154 to 358 for 14 draws of 3,000,
        at worst 2,260 in one bucket; mixed, for none (at worst 347)."""
        if self.prefix is None:
            mixed: U64 = self.hashes(codes)
        else:
            mixed = codes.to_numpy() * _BUCKET_MULTIPLIER
            np.bitwise_xor(mixed, mixed >> np.uint64(32), out=mixed)
            np.multiply(mixed, _FMIX_MULTIPLIERS[1], out=mixed)
        ids: np.ndarray = (mixed >> np.uint64(64 - bits)).astype(np.uint8 if bits <= 8 else np.uint16)
        return ids

    def hashes(self, codes: pa.Array) -> U64:
        """A well-mixed 64-bit hash of every key (equal keys, equal hashes), for partitioning: the engine's key
        fingerprint (storage/fingerprint.py) of the keys, or of the codes' bytes for word codes (a key's word is its
        suffix, the same for equal keys), through MurmurHash3's 64-bit finalizer. The fingerprint's lanes bound
        collisions, not how evenly their top bits spread: 64k keys ``key-<n>`` over 256 buckets (256 a bucket on
        average) fell outside 154 to 358 for 12 of 700 draws of the multipliers, at worst 29 and 522; finalized,
        for none of 400 draws (at worst 192 and 330). The finalizer is a bijection, so it adds no collision."""
        hashed = fingerprints(codes) if not self.width else fingerprint_rows(code_matrix(codes))
        return _finalized(hashed)


def _finalized(hashed: U64) -> U64:
    """MurmurHash3's fmix64 of each hash, in place: xor-shifts and two multiplies that make every output bit
    depend on every input bit."""
    for multiplier in _FMIX_MULTIPLIERS:
        np.bitwise_xor(hashed, hashed >> np.uint64(33), out=hashed)
        np.multiply(hashed, multiplier, out=hashed)
    np.bitwise_xor(hashed, hashed >> np.uint64(33), out=hashed)
    return hashed


_FMIX_MULTIPLIERS: Final = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))


def code_matrix(codes: pa.Array) -> npt.NDArray[np.uint8]:
    """The codes of a fixed-width array (``fixed_size_binary`` or uint64) as a (rows, width) byte matrix,
    zero-copy."""
    width = codes.type.byte_width
    data = codes.buffers()[1]
    if data is None or len(codes) == 0:
        return np.zeros((0, width), np.uint8)
    return np.frombuffer(data, np.uint8, len(codes) * width, codes.offset * width).reshape(len(codes), width)


def _single_length(keys: pa.Array) -> int:
    """The length every key has, if it is one from 1 to MAX_CODED_KEY_BYTES; else 0."""
    offsets = value_offsets(keys)
    if len(offsets) < 2:
        return 0
    width = int(offsets[1]) - int(offsets[0])
    if 0 < width <= MAX_CODED_KEY_BYTES and np.all(np.diff(offsets) == width):
        return width
    return 0


def _rows_start_with(matrix: npt.NDArray[np.uint8], prefix: bytes) -> bool:
    """Whether every row of a (rows, width) byte matrix starts with ``prefix``: compared as up to 8 bytes at a time,
    one integer column each. numpy's compare of a 2-D slice took 7.9 ns a row for a 2-byte prefix (0.5 for a 1-byte
    one); encoding 10-byte keys with a 2-byte prefix went from 9.0 to 1.1 ns a key."""
    position = 0
    while position < len(prefix) and len(matrix):
        size = next(size for size in (8, 4, 2, 1) if size <= len(prefix) - position)
        column = np.ndarray((len(matrix),), f"<u{size}", matrix, offset=position, strides=(matrix.strides[0],))
        if not np.all(column == int.from_bytes(prefix[position : position + size], "little")):
            return False
        position += size
    return True


def _key_matrix(keys: pa.Array, width: int) -> npt.NDArray[np.uint8]:
    """Keys all ``width`` bytes long as a (rows, width) byte matrix, zero-copy."""
    data = keys.buffers()[2]
    if data is None or len(keys) == 0:
        return np.zeros((0, width), np.uint8)
    return np.frombuffer(data, np.uint8, len(keys) * width, int(value_offsets(keys)[0])).reshape(len(keys), width)
