"""Decompressing the records of a produced Kafka batch: gzip, snappy, lz4 and zstd, the codecs Kafka clients use.

gzip comes from the standard library; snappy (raw blocks, or the xerial framing Java clients write), lz4 (frame
format) and zstd from the codecs pyarrow already ships, so no extra dependency is needed. Fetch responses are
always sent uncompressed, which every client accepts.

Every codec decompresses with a limit, so a few compressed kilobytes cannot make the endpoint build gigabytes (a
compression bomb): gzip, lz4 and zstd stream through a decompressor CHUNK_BYTES at a time and stop as soon as the
output passes the limit; snappy declares each block's uncompressed size first, checked before the block is
decompressed.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import pyarrow as pa

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CHUNK_BYTES = 1 << 16
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_GZIP_OR_ZLIB_WBITS = 47  # 32 + 15: gzip or zlib header, detected


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


def decompress(codec: int, data: bytes | memoryview, *, limit_bytes: int) -> bytes:
    """The uncompressed records of a batch whose attributes name ``codec`` (0 returns ``data`` as bytes); raises
    DecompressedTooLargeError, having decompressed at most about ``limit_bytes`` + CHUNK_BYTES, when they would
    pass ``limit_bytes``."""
    if codec == 0:
        if len(data) > limit_bytes:
            raise DecompressedTooLargeError(codec, limit_bytes)
        return bytes(data)
    if codec == 1:
        return _gzip(data, limit_bytes)
    if codec == 2:
        return _snappy(bytes(data), limit_bytes)
    if codec in (3, 4):
        stream = pa.CompressedInputStream(pa.BufferReader(pa.py_buffer(data)), "lz4" if codec == 3 else "zstd")
        return _bounded(codec, iter(lambda: stream.read(CHUNK_BYTES), b""), limit_bytes)
    raise UnsupportedCompressionError(codec)


def _gzip(data: bytes | memoryview, limit_bytes: int) -> bytes:
    return _bounded(1, _gzip_chunks(data), limit_bytes)


def _gzip_chunks(data: bytes | memoryview) -> Iterator[bytes]:
    decompressor = zlib.decompressobj(wbits=_GZIP_OR_ZLIB_WBITS)
    chunk = decompressor.decompress(data, CHUNK_BYTES)
    while chunk:
        yield chunk
        chunk = decompressor.decompress(decompressor.unconsumed_tail, CHUNK_BYTES)
    if not decompressor.eof:
        raise zlib.error("the gzip stream is truncated")


def _bounded(codec: int, chunks: Iterator[bytes], limit_bytes: int) -> bytes:
    """The chunks joined, or DecompressedTooLargeError as soon as they pass ``limit_bytes``."""
    kept, total = [], 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit_bytes:
            raise DecompressedTooLargeError(codec, limit_bytes)
        kept.append(chunk)
    return b"".join(kept)


def _snappy(data: bytes, limit_bytes: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, limit_bytes)
    chunks, position = [], _XERIAL_HEADER_BYTES
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position)
        chunks.append(_snappy_block(data[position + 4 : position + 4 + length], limit_bytes))
        limit_bytes -= len(chunks[-1])
        position += 4 + length
    return b"".join(chunks)


def _snappy_block(block: bytes, limit_bytes: int) -> bytes:
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
    return bytes(pa.Codec("snappy").decompress(block, decompressed_size=size))
