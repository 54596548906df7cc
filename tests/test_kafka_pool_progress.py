"""A connection whose client reads always progresses through queued.max.request.bytes, however many other clients
never read their responses (request_queue.py, response_sender.py): each of those holds at most one response piece,
and once every byte counted is held for clients that do not read, the next piece or request passes.

Real sockets on 127.0.0.1 and the endpoint's own parts (KafkaConnection, read_frame, drain, ResponseSender and the
pool): each connection reads request frames (how many pieces to answer, and their fill byte) and streams that many
PIECE-byte pieces back for each. Clients that do not read have tiny kernel buffers, so their pieces stay in the
endpoint's write buffers, counted in the pool."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable

from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.connection import KafkaConnection
from ledgerview.kafka.fetch_response import FramedResponse, fixed
from ledgerview.kafka.request_queue import SMALL_REQUEST_BYTES, QueuedRequestBytes
from ledgerview.kafka.response_sender import ResponseSender
from ledgerview.kafka.server import drain, read_frame

MiB = 1024 * 1024
BOUND = 4 * MiB
PIECE = 512 * 1024
"""A large piece (over SMALL_REQUEST_BYTES): at most seven fit under the bound for large requests."""
NOT_READING = 10
"""Connections whose clients never read: their pieces alone would fill the bound."""
PIECES = 16
"""Pieces of each response: 8 MiB, twice the bound."""
OPTIONS = EndpointOptions(port=0)
LIVENESS_S = 20.0
"""Only so that a stalled run fails instead of hanging: a run that progresses takes well under a second."""


def _request(pieces: int, fill: int, size: int, *, reads: bool = True) -> bytes:
    """A frame of ``size`` bytes asking ``pieces`` pieces filled with ``fill``; a client that will not read asks the
    endpoint to keep only a tiny kernel buffer for it, so that its pieces stay in the endpoint's write buffer."""
    return struct.pack(">iiii", size, pieces, fill, reads) + bytes(size - 12)


async def _serve(pool: QueuedRequestBytes, connection: KafkaConnection) -> None:
    """Read request frames, each counted in ``pool`` until answered, and stream each one's pieces counted there."""
    sender = ResponseSender(connection, pool, lambda: drain(connection, OPTIONS))
    try:
        while True:
            frame = await read_frame(connection, OPTIONS, pool=pool)
            pool.release(len(frame))
            pieces, fill, reads = struct.unpack_from(">iii", frame)
            if not reads:
                connection.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            body = bytes([fill]) * PIECE
            response = [fixed(struct.pack(">i", pieces * PIECE)), *(fixed(body) for _ in range(pieces))]
            await sender.send(FramedResponse(response, lambda: None))
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        sender.close()
        connection.close()


async def _connect(port: int, *, reads: bool) -> socket.socket:
    client = socket.socket()
    if not reads:  # what the endpoint sends stays in its own write buffer
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    return client


async def _read_response(client: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    received = bytearray()
    while len(received) < 4 or len(received) < 4 + struct.unpack_from(">i", received)[0]:
        chunk = await loop.sock_recv(client, MiB)
        if not chunk:
            raise ConnectionError("the endpoint closed the connection")
        received += chunk
    return bytes(received[4:])


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def _with_unread_clients(reading: Callable[[QueuedRequestBytes, int], Awaitable[None]]) -> None:
    """Open NOT_READING connections whose clients ask 8 MiB each and never read; once a large piece no longer fits
    under the bound, run ``reading(pool, port)``; then check every connection held at most one piece and that all is
    released once the clients are gone."""
    async def run() -> None:
        pool = QueuedRequestBytes(BOUND)
        loop = asyncio.get_running_loop()
        served: list[asyncio.Task[None]] = []

        def connection() -> KafkaConnection:
            async def serve(made: KafkaConnection) -> None:
                served.append(asyncio.current_task())  # type: ignore[arg-type]
                await _serve(pool, made)
            return KafkaConnection(serve)

        server = await loop.create_server(connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        unread: list[socket.socket] = []
        try:
            for fill in range(NOT_READING):
                unread.append(await _connect(port, reads=False))
                await loop.sock_sendall(unread[-1], _request(PIECES, fill, 12, reads=False))
            await asyncio.wait_for(_until(lambda: pool.queued_bytes + PIECE > pool.large_limit_bytes), LIVENESS_S)
            await asyncio.wait_for(reading(pool, port), LIVENESS_S)
            # The reading client's pieces (or request) passed the bound, as only stalled pieces were queued; but
            # each connection held one piece at most.
            assert pool.large_limit_bytes < pool.peak_bytes <= (NOT_READING + 1) * PIECE
        finally:
            for client in unread:
                client.close()
            await asyncio.wait_for(_until(lambda: all(task.done() for task in served)), LIVENESS_S)
            server.close()
            await server.wait_closed()
        assert pool.queued_bytes == pool.stalled_bytes == 0

    asyncio.run(run())


def test_a_reading_client_gets_its_whole_response_while_unread_responses_fill_the_pool() -> None:
    async def reading(pool: QueuedRequestBytes, port: int) -> None:
        client = await _connect(port, reads=True)
        try:
            await asyncio.get_running_loop().sock_sendall(client, _request(PIECES, 0xAB, 12))
            assert await _read_response(client) == bytes([0xAB]) * (PIECES * PIECE)
        finally:
            client.close()

    _with_unread_clients(reading)


def test_a_reading_clients_large_request_is_read_while_unread_responses_fill_the_pool() -> None:
    async def reading(pool: QueuedRequestBytes, port: int) -> None:
        client = await _connect(port, reads=True)
        try:
            loop = asyncio.get_running_loop()
            for number in range(3):  # one request after another, each larger than the small requests' share
                await loop.sock_sendall(client, _request(1, number, 4 * SMALL_REQUEST_BYTES))
                assert await _read_response(client) == bytes([number]) * PIECE
        finally:
            with contextlib.suppress(OSError):
                client.close()

    _with_unread_clients(reading)
