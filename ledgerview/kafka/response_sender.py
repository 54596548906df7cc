"""Writes a streamed response (a Fetch: ledgerview/kafka/fetch_response.py) on one connection piece by piece, so
no response is ever built whole, and bounds the bytes of such responses across all connections.

Each piece's bytes (its ``charge``: the buffer it may be encoded into, when that can be larger) are reserved in the
endpoint's queued.max.request.bytes pool (request_queue.py) before the piece is encoded, and stay counted until the
transport has handed them to the kernel: the pool thus bounds the bytes of requests read and not answered plus the
bytes of fetch responses being built or waiting in a connection's write buffer (but for one stalled piece per
connection whose client does not read, below). Python 3.11's socket transport
copies what it cannot send at once, so a piece's buffer is free for reuse as soon as it is written (batch_cache.py
reuses it only when nothing views it any more: a transport may keep a view instead, as Python 3.12's does).

A connection holds at most one piece not yet handed to the kernel: before it reserves room for the next, it waits
until its client has read enough for the kernel to take the last one (as a Kafka channel holds the response it
built until it is sent, and reads no request meanwhile). While it waits, that piece is stalled in the pool: once
nothing but stalled pieces is queued, a request or piece passes whatever the bound, so a client that reads always
progresses even when every other connection holds a piece its client never reads; connections waiting for room
hold none. A response whose pieces are larger than the whole bound passes the same way when nothing else is
queued (as a request). The connection yields to the event loop every YIELD_BYTES written, so other connections
are served while a large response is encoded and sent. A response is written whole before the connection reads
its next request, so responses keep request order. After a Fetch, ``prepare`` encodes its read-ahead
(ledgerview/kafka/read_ahead.py) until the client sends anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Generator

from ledgerview.kafka.connection import KafkaConnection
from ledgerview.kafka.fetch_response import FramedResponse, Piece
from ledgerview.kafka.request_queue import QueuedRequestBytes

WRITE_BUFFER_BYTES_MAX = 4 * 1024 * 1024
"""A connection waits for its client to read once this much of its responses (those not streamed here: server.py)
is in its write buffer."""
YIELD_BYTES = 1024 * 1024
"""A connection writing a streamed response lets the event loop run other connections every this many bytes."""


class ResponseSender:
    """The streamed responses of one connection; ``drain`` waits until its client reads (or gives up)."""

    def __init__(self, writer: KafkaConnection, pool: QueuedRequestBytes,
                 drain: Callable[[], Awaitable[None]]) -> None:
        self._writer = writer
        self._pool = pool
        self._drain = drain
        self.held_bytes = 0
        """Bytes reserved in the pool for this connection's pieces not yet handed to the kernel."""

    async def send(self, response: FramedResponse) -> None:
        """Write every piece of ``response``, encoding each once room is reserved for it; then close it."""
        try:
            unyielded = 0
            for piece in response.pieces:
                await self._flush()
                await self._pool.reserve(piece.charge)
                self.held_bytes += piece.charge
                self._write(piece)
                unyielded += piece.size
                if unyielded >= YIELD_BYTES:
                    await asyncio.sleep(0)
                    unyielded = 0
            await self._flush()
        finally:
            response.close()

    async def prepare(self, pieces: Generator[Piece, None, None], client_spoke: Callable[[], bool]) -> None:
        """Make the pieces of the response the client will likely ask for next (FramedResponse.read_ahead), one at a
        time while ``client_spoke()`` is false (checked before each is read and made), yielding to the event loop
        after each, so that the work overlaps the client's handling of the last response. A piece is made only
        when the pool has spare room for its buffer and for the cache to keep that buffer
        (QueuedRequestBytes.take_spare); the first that has none ends the read-ahead. The cache keeps it as any
        fetched batch, its least recently used entries making room when it is full."""
        with contextlib.closing(pieces):
            while not client_spoke():
                piece = next(pieces, None)
                if piece is None or not self._pool.take_spare(piece.charge, then_cached=piece.charge):
                    return
                try:
                    piece.written(piece.make())
                finally:
                    self._pool.release(piece.charge)
                await asyncio.sleep(0)

    def _write(self, piece: Piece) -> None:
        """Encode ``piece``, hand it to the transport, then tell the piece it was written (its buffer may be reused:
        no reference to it is kept here past this call)."""
        data = piece.make()
        if len(data) != piece.size:
            raise RuntimeError(f"a response piece sized {piece.size} bytes encoded to {len(data)}")
        self._writer.write(memoryview(data))
        piece.written(data)

    def close(self) -> None:
        """The connection is closing: release what it holds."""
        self._pool.release(self.held_bytes)
        self.held_bytes = 0

    async def _flush(self) -> None:
        """Release what the transport has handed to the kernel; if it holds more, wait until the write buffer is
        empty, those bytes stalled in the pool meanwhile, then release them."""
        self._settle()
        if not self.held_bytes:
            return
        transport = self._writer.transport
        transport.set_write_buffer_limits(high=0)  # drain now waits for an empty buffer
        stalled = self.held_bytes
        self._pool.stall(stalled)
        try:
            await self._drain()
        finally:
            self._pool.stall(-stalled)
            if not transport.is_closing():
                transport.set_write_buffer_limits()
        self._settle()

    def _settle(self) -> None:
        """Release the bytes the transport has handed to the kernel since last time."""
        sent = self.held_bytes - min(self.held_bytes, self._writer.transport.get_write_buffer_size())
        if sent:
            self.held_bytes -= sent
            self._pool.release(sent)
