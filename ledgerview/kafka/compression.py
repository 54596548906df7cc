"""Decompressing the records of a produced Kafka batch: gzip, snappy, lz4 and zstd, the codecs Kafka clients use.

gzip comes from the standard library; snappy (raw blocks, or the xerial framing Java clients write), lz4 (frame
format) and zstd from the codecs pyarrow already ships, so no extra dependency is needed. Fetch responses are
always sent uncompressed, which every client accepts.

Every codec decompresses with a limit, so a few compressed kilobytes cannot make the endpoint build gigabytes (a
compression bomb): gzip, lz4 and zstd stream through a decompressor CHUNK_BYTES at a time and stop as soon as the
output passes the limit; snappy declares each block's uncompressed size first, checked before the block is
decompressed.

Before producing bytes, each codec calls ``reserve`` with how many it is about to produce (at most CHUNK_BYTES at a
time for the streams, a block's declared size for snappy), so the caller can count them, or make decompression
wait, before they exist (ledgerview/kafka/heavy_work.py). The output is written into one growing buffer, never
joined from pieces nor grown by copying.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable, Iterator

import pyarrow as pa

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CHUNK_BYTES = 1 << 16
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_GZIP_OR_ZLIB_WBITS = 47  # 32 + 15: gzip or zlib header, detected


Records = bytes | bytearray | memoryview
"""Uncompressed records: a buffer of bytes."""


def no_reserve(size: int) -> None:
    """Counts nothing."""


class UnsupportedCompressionError(ValueError):
    def __init__(self, codec: int) -> None:
        self.codec = codec
        super().__init__(f"compression codec {codec} is not one of {CODEC_NAMES}")


class DecompressedTooLargeError(ValueError):
    """The records decompress to more than ``limit_bytes``; decompression stopped there."""

    def __init__(self, codec: int, limit_bytes: int) -> None:
        self.codec = codec
        self.limit_bytes = limit_bytes
        super().__init__(f"{CODEC_NAMES.get(codec, codec)} records decompress to more than {limit_bytes} bytes")


def decompress(codec: int, data: bytes | memoryview, *, limit_bytes: int,
               reserve: Callable[[int], None] = no_reserve) -> Records:
    """The uncompressed records of a batch whose attributes name ``codec`` (0 returns ``data`` itself); raises
    DecompressedTooLargeError, having decompressed at most about ``limit_bytes`` + CHUNK_BYTES, when they would
    pass ``limit_bytes``. ``reserve(n)`` is called before ``n`` more bytes are produced."""
    if codec == 0:
        if len(data) > limit_bytes:
            raise DecompressedTooLargeError(codec, limit_bytes)
        return data
    if codec == 1:
        return _bounded(1, _gzip_chunks(data), limit_bytes, reserve)
    if codec == 2:
        return _snappy(memoryview(data), limit_bytes, reserve)
    if codec in (3, 4):
        stream = pa.CompressedInputStream(pa.BufferReader(pa.py_buffer(data)), "lz4" if codec == 3 else "zstd")
        return _bounded(codec, iter(lambda: stream.read(CHUNK_BYTES), b""), limit_bytes, reserve)
    raise UnsupportedCompressionError(codec)


def _gzip_chunks(data: bytes | memoryview) -> Iterator[bytes]:
    decompressor = zlib.decompressobj(wbits=_GZIP_OR_ZLIB_WBITS)
    chunk = decompressor.decompress(data, CHUNK_BYTES)
    while chunk:
        yield chunk
        chunk = decompressor.decompress(decompressor.unconsumed_tail, CHUNK_BYTES)
    if not decompressor.eof:
        raise zlib.error("the gzip stream is truncated")


def _bounded(codec: int, chunks: Iterator[bytes], limit_bytes: int, reserve: Callable[[int], None]) -> memoryview:
    """The chunks (each at most CHUNK_BYTES) in one buffer, or DecompressedTooLargeError as soon as they pass
    ``limit_bytes``; CHUNK_BYTES are reserved before each chunk is produced. The buffer is an anonymous mapping of
    ``limit_bytes``: only the pages written take memory, and it never grows by copying."""
    out = mmap.mmap(-1, max(limit_bytes, 1))
    size = 0
    while True:
        reserve(CHUNK_BYTES)
        chunk = next(chunks, None)
        if chunk is None:
            return memoryview(out)[:size]
        if size + len(chunk) > limit_bytes:
            raise DecompressedTooLargeError(codec, limit_bytes)
        out[size : size + len(chunk)] = chunk
        size += len(chunk)


def _snappy(data: memoryview, limit_bytes: int, reserve: Callable[[int], None]) -> Records:
    if data[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return memoryview(_snappy_block(data, limit_bytes, reserve))
    out, position = bytearray(), _XERIAL_HEADER_BYTES
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position)
        out += _snappy_block(data[position + 4 : position + 4 + length], limit_bytes - len(out), reserve)
        position += 4 + length
    return out


def _snappy_block(block: memoryview, limit_bytes: int, reserve: Callable[[int], None]) -> pa.Buffer:
    size = shift = position = 0
    while True:  # a raw snappy block starts with its uncompressed length as an unsigned varint
        byte = block[position]
        size |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            break
        shift += 7
    if size > limit_bytes:
        raise DecompressedTooLargeError(2, limit_bytes)
    reserve(size)
    return pa.Codec("snappy").decompress(block, decompressed_size=size)
