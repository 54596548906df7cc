"""Request frames read from a connection under the limits Kafka's broker configs set (a 4-byte size, then the
frame): socket.request.max.bytes, connections.max.idle.ms, frame.stall.timeout.ms and queued.max.request.bytes.

Steps:
1. Wait for the size, at most connections.max.idle.ms. A size outside 1 to the limit closes the connection before
   any of the body is read (Kafka's InvalidReceiveException).
2. With a pool, wait until the frame fits queued.max.request.bytes and count it there (meanwhile the connection
   receives at most its staging buffer, then stops reading: connection.py). The frame stays counted until the
   caller releases it; on any failure below it is released here.
3. Take a buffer for it (frame_buffers.py) and receive the body into it: every FRAME_CHUNK_BYTES (or the end)
   must arrive within frame.stall.timeout.ms, and the whole body within connections.max.idle.ms of its size.
"""

from __future__ import annotations

import asyncio

from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.connection import KafkaConnection
from ledgerview.kafka.frame_buffers import FrameBuffers
from ledgerview.kafka.request_queue import QueuedRequestBytes

FRAME_CHUNK_BYTES = 1024 * 1024
"""A frame's body must progress this much (or end) within frame.stall.timeout.ms."""


class CloseConnection(Exception):
    """The connection must be closed (Kafka's answer to a request it cannot parse or a limit it passes)."""


async def read_frame(connection: KafkaConnection, options: EndpointOptions, *, max_bytes: int | None = None,
                     pool: QueuedRequestBytes | None = None, buffers: FrameBuffers | None = None) -> memoryview:
    """The next request frame, whole (steps above). ``max_bytes`` defaults to socket.request.max.bytes; with
    ``pool`` the frame is counted there until the caller releases it; with ``buffers`` its buffer comes from (and
    should go back to) them. Raises CloseConnection, or IncompleteReadError (or ConnectionError) when the client
    left."""
    limit = options.socket_request_max_bytes if max_bytes is None else max_bytes
    idle_seconds = options.connections_max_idle_ms / 1000
    size = connection.take_size()
    if size is None:
        try:
            async with asyncio.timeout(idle_seconds):
                size = await connection.read_size()
        except TimeoutError:
            raise CloseConnection(f"idle for connections.max.idle.ms={options.connections_max_idle_ms}") from None
    if not 0 < size <= limit:
        raise CloseConnection(f"a frame of {size} bytes, outside 1 to {limit} (socket.request.max.bytes, or "
                              "sasl.server.max.receive.size before authentication)")
    if pool is not None:
        await pool.reserve(size)
    frame = buffers.take(size) if buffers is not None else memoryview(bytearray(size))
    try:
        received = connection.start_frame(frame)
        if received < size:
            try:
                async with asyncio.timeout(idle_seconds):
                    await _receive_body(connection, size, received, options)
            except TimeoutError:
                raise CloseConnection(f"a frame of {size} bytes not complete after connections.max.idle.ms="
                                      f"{options.connections_max_idle_ms}") from None
    except BaseException:
        connection.end_frame()
        if pool is not None:
            pool.release(size)
        raise
    return frame


async def _receive_body(connection: KafkaConnection, size: int, received: int, options: EndpointOptions) -> None:
    while received < size:
        try:
            async with asyncio.timeout(options.frame_stall_timeout_ms / 1000):
                received = await connection.read_frame_bytes(min(size, received + FRAME_CHUNK_BYTES))
        except TimeoutError:
            raise CloseConnection(f"a frame of {size} bytes stalled with {size - received} to come: nothing for "
                                  f"frame.stall.timeout.ms={options.frame_stall_timeout_ms}") from None
