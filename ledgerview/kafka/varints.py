"""Kafka's zigzag varints (records' lengths, deltas and sizes), read and written for many records at once.

A zigzag varint stores a signed n as ``(n << 1) ^ (n >> 63)``, 7 bits per byte, low bits first, the high bit of
each byte meaning "more follow". Fields of one record sit at positions that depend on the sizes of the varints
before them, but the same field of every record can be read in one numpy pass once the record starts are known.
"""

from __future__ import annotations

import numpy as np

INT_VARINT_BYTES_MAX = 5
LONG_VARINT_BYTES_MAX = 10
_SIZE_LIMITS = np.array([1 << (7 * size) for size in range(1, LONG_VARINT_BYTES_MAX)], dtype=np.uint64)


class VarintError(ValueError):
    """Bytes that do not hold a complete varint where one is expected."""


def read_varints(data: np.ndarray, positions: np.ndarray, width: int = INT_VARINT_BYTES_MAX, *,
                 strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The signed values (int64) and byte sizes (int64) of the varints starting at ``positions`` of ``data``
    (uint8); ``width``: the most bytes one may take (5 for Kafka's varint, 10 for its varlong). ``strict=False``:
    bytes that hold no varint get size 0 instead of raising VarintError (for guessed positions).

    One pass per byte position, over only the varints still running: most take one or two bytes."""
    zigzagged = np.zeros(len(positions), dtype=np.uint64)
    sizes = np.zeros(len(positions), dtype=np.int64)
    running = np.arange(len(positions))
    for byte_index in range(width):
        at = positions[running] + byte_index
        outside = (at < 0) | (at >= len(data))
        if outside.any():
            if strict:
                raise VarintError("a varint runs past the records")
            running, at = running[~outside], at[~outside]
        digits = data[at]
        zigzagged[running] |= (digits & 0x7F).astype(np.uint64) << np.uint64(7 * byte_index)
        ended = digits < 0x80
        sizes[running[ended]] = byte_index + 1
        running = running[~ended]
        if len(running) == 0:
            break
    else:
        if strict:
            raise VarintError(f"a varint is longer than {width} bytes")
        sizes[running] = 0
    values = (zigzagged >> np.uint64(1)).astype(np.int64) ^ -(zigzagged & np.uint64(1)).astype(np.int64)
    return values, sizes


def zigzag(values: np.ndarray) -> np.ndarray:
    """The unsigned zigzag form of signed int64 values."""
    signed = values.astype(np.int64)
    return ((signed << 1) ^ (signed >> 63)).astype(np.uint64)


def varint_sizes(zigzagged: np.ndarray) -> np.ndarray:
    """Bytes each zigzagged value takes as a varint: one, plus one for each 7 bits it reaches past. One compare
    pass per byte the largest value needs (most fields of a batch need one or two), cheaper than a search."""
    sizes = np.ones(len(zigzagged), np.int64)
    top = int(zigzagged.max(initial=0))
    for limit in _SIZE_LIMITS.tolist():
        if top < limit:
            break
        sizes += zigzagged >= np.uint64(limit)
    return sizes


def write_varints(out: np.ndarray, positions: np.ndarray, zigzagged: np.ndarray, sizes: np.ndarray) -> None:
    """Write each zigzagged value as a varint of ``sizes`` bytes at ``positions`` of ``out`` (uint8)."""
    remaining = zigzagged.copy()
    for byte in range(int(sizes.max(initial=0))):
        present = sizes > byte
        more = (sizes > byte + 1)[present]
        digit = (remaining[present] & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << 7)
        out[positions[present] + byte] = digit
        remaining >>= np.uint64(7)


def read_varint(data: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """One signed varint at ``position``: (value, position after it)."""
    shift = result = 0
    while True:
        if position >= len(data) or shift > 63:
            raise VarintError("a varint runs past the records")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7


def encode_varint(value: int) -> bytes:
    """One signed value as a zigzag varint."""
    unsigned = (value << 1) ^ (value >> 63)
    out = bytearray()
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)
    return bytes(out)
