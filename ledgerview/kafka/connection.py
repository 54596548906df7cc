"""One client connection of the Kafka endpoint, as an asyncio buffered protocol: request bytes are received
straight into the buffer of the frame they belong to, and responses are written with flow control.

asyncio's StreamReader receives into a new bytes object per read, appends it to its own buffer and copies each
frame out again: three copies of every request byte, each into fresh pages when glibc unmaps freed blocks
(large_buffers.py). Here the transport receives (recv_into) into one of two places:

- between frames, a staging buffer of STAGING_BYTES, so that several small frames, or a frame's size and its first
  bytes, take one system call; the frame reader (server.py's read_frame) takes sizes and frames out of it;
- once a frame's buffer is given (``start_frame``) and the frame is not all staged, the rest of that buffer, so
  the bulk of a large frame is copied once, by the kernel.

The socket is not read while the staging buffer is full and no frame is being received: a connection thus holds
at most STAGING_BYTES that queued.max.request.bytes does not count, and TCP pushes back on its client. (On a TLS
listener asyncio's SSL layer reads ahead of that, up to its own buffer of encrypted bytes, about 256 KiB.)
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine
from typing import Any

STAGING_BYTES = 64 * 1024
"""Bytes received ahead of the frame being read: sizes, small frames and the start of a large one."""
_SIZE = struct.Struct(">i")


class KafkaConnection(asyncio.BufferedProtocol):
    """Runs ``serve(self)`` as a task once connected; used on the endpoint's event loop only."""

    def __init__(self, serve: Callable[[KafkaConnection], Coroutine[Any, Any, None]]) -> None:
        self._serve = serve
        self.task: asyncio.Task[None] | None = None
        """The task serving this connection (held here so that it is not collected while it waits)."""
        self._transport: asyncio.Transport | None = None
        self._staging = bytearray(STAGING_BYTES)
        self._staged_start = 0
        self._staged_end = 0
        self._frame: memoryview | None = None
        """The frame buffer the transport receives into, while its frame is incomplete."""
        self._frame_received = 0
        self._goal = 0
        """Staged bytes (no frame) or frame bytes (a frame) that ``_waiter`` waits for."""
        self._waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._ended: Exception | None = None
        """Why no more bytes will come (end of stream, or the connection lost)."""
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # The transport's side.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.task = asyncio.get_running_loop().create_task(self._serve(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return self._frame[self._frame_received :]
        if self._staged_start == self._staged_end:
            self._staged_start = self._staged_end = 0
        elif self._staged_end == STAGING_BYTES:
            staged = self._staged_end - self._staged_start
            self._staging[:staged] = self._staging[self._staged_start : self._staged_end]
            self._staged_start, self._staged_end = 0, staged
        return memoryview(self._staging)[self._staged_end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_received += nbytes
            reached = self._frame_received >= self._goal
            if self._frame_received == len(self._frame):
                self._frame = None
        else:
            self._staged_end += nbytes
            reached = self._staged_end - self._staged_start >= self._goal
            self._pause_when_full()
        if reached:
            self._wake()

    def eof_received(self) -> bool:
        self._end(asyncio.IncompleteReadError(b"", None))
        # Half-open: responses to the requests already read may still be written (an SSL transport cannot).
        return self.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ConnectionResetError("the connection was lost") if exc is None else exc)
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # The frame reader's side.

    @property
    def has_unread(self) -> bool:
        """Whether the client sent bytes not read yet, or ended the connection."""
        return self._staged_end > self._staged_start or self._ended is not None

    def take_size(self) -> int | None:
        """The next frame's size if its four bytes are staged (they are then consumed), else None."""
        if self._staged_end - self._staged_start < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(self._staging, self._staged_start)
        self._consume(_SIZE.size)
        return int(size)

    async def read_size(self) -> int:
        """The next frame's size, waiting for its four bytes; raises IncompleteReadError (or the connection's
        error) when they will not come."""
        size = self.take_size()
        while size is None:
            await self._wait(_SIZE.size)
            size = self.take_size()
        return size

    def start_frame(self, frame: memoryview) -> int:
        """Receive the frame whose size was just read into ``frame`` (its whole length): its staged bytes are
        copied now and the rest is received into it directly. Returns how many of its bytes are in it already."""
        staged = min(len(frame), self._staged_end - self._staged_start)
        frame[:staged] = memoryview(self._staging)[self._staged_start : self._staged_start + staged]
        self._consume(staged)
        self._frame_received = staged
        if staged < len(frame):
            self._frame = frame
        return staged

    async def read_frame_bytes(self, count: int) -> int:
        """Wait until at least ``count`` bytes of the started frame are in; returns how many are. Raises
        IncompleteReadError (or the connection's error) when they will not come."""
        while self._frame is not None and self._frame_received < count:
            await self._wait(count)
        return self._frame_received

    def end_frame(self) -> None:
        """Stop receiving into the started frame (it is complete, or the connection is closing)."""
        self._frame = None

    # The writer's side.

    @property
    def transport(self) -> asyncio.Transport:
        if self._transport is None:
            raise RuntimeError("the connection is not made yet")
        return self._transport

    def write(self, data: bytes | memoryview) -> None:
        self.transport.write(data)

    def get_extra_info(self, name: str) -> Any:
        return self.transport.get_extra_info(name)

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark; raises when the connection was
        lost."""
        if self.transport.is_closing():
            await asyncio.sleep(0)  # lets connection_lost run first, as StreamWriter.drain does
        if self._closed.done():
            raise ConnectionResetError("the connection was lost")
        if not self._writing_paused:
            return
        self._drained = asyncio.get_running_loop().create_future()
        await self._drained
        if self._closed.done():
            raise ConnectionResetError("the connection was lost")

    def close(self) -> None:
        self.transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    # Inside.

    def _consume(self, count: int) -> None:
        self._staged_start += count
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def _pause_when_full(self) -> None:
        if self._staged_start == 0 and self._staged_end == STAGING_BYTES:
            self._reading_paused = True
            self.transport.pause_reading()

    async def _wait(self, goal: int) -> None:
        if self._ended is not None:
            raise self._ended
        self._goal = goal
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _end(self, reason: Exception) -> None:
        if self._ended is None:
            self._ended = reason
        self._wake()
