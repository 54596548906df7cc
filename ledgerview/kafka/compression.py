"""Decompressing the records of a produced Kafka batch: gzip, snappy, lz4 and zstd, the codecs Kafka clients use.

gzip comes from the standard library; snappy (raw blocks, or the xerial framing Java clients write), lz4 (frame
format) and zstd from the codecs pyarrow already ships, so no extra dependency is needed. Fetch responses are
always sent uncompressed, which every client accepts.
"""

from __future__ import annotations

import struct
import zlib

import pyarrow as pa

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16


class UnsupportedCompressionError(ValueError):
    def __init__(self, codec: int) -> None:
        self.codec = codec
        super().__init__(f"compression codec {codec} is not one of {CODEC_NAMES}")


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """The uncompressed records of a batch whose attributes name ``codec`` (0 returns ``data`` as bytes)."""
    if codec == 0:
        return bytes(data)
    if codec == 1:
        return zlib.decompress(data, wbits=47)  # 32 + 15: gzip or zlib header, detected
    if codec == 2:
        return _snappy(bytes(data))
    if codec in (3, 4):
        stream = pa.CompressedInputStream(pa.BufferReader(pa.py_buffer(data)), "lz4" if codec == 3 else "zstd")
        return bytes(stream.read())
    raise UnsupportedCompressionError(codec)


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data)
    chunks, position = [], _XERIAL_HEADER_BYTES
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position)
        chunks.append(_snappy_block(data[position + 4 : position + 4 + length]))
        position += 4 + length
    return b"".join(chunks)


def _snappy_block(block: bytes) -> bytes:
    size = shift = position = 0
    while True:  # a raw snappy block starts with its uncompressed length as an unsigned varint
        byte = block[position]
        size |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            break
        shift += 7
    return bytes(pa.Codec("snappy").decompress(block, decompressed_size=size))
