"""Request frames as the endpoint receives them (ledgerview/kafka/connection.py, server.py's read_frame,
frame_buffers.py): every frame comes out whole and exact however its bytes are split into reads (one byte at a
time, across the size prefix, many frames in one read, past the staging buffer); the socket is not read past the
staging buffer while a frame waits for room in queued.max.request.bytes; a connection that ends mid-frame releases
its room; a reused frame buffer never changes what an earlier request stored, and one still viewed is not reused;
free buffers live in the pool's free room and are evicted when it is needed. Against a real endpoint: pipelined
requests answered in order, a client that stops sending still gets its answer, large produced requests stored
exactly."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.kafka import EndpointOptions, KafkaEndpoint
from ledgerview.kafka.connection import STAGING_BYTES, KafkaConnection
from ledgerview.kafka.frame_buffers import REUSED_FRAME_BYTES_MIN, FrameBuffers
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.request_queue import QueuedRequestBytes
from ledgerview.kafka.server import read_frame
from storage import Store
from tests.kafka_support import RawClient, produce_request, wait_for

OPTIONS = EndpointOptions(port=0)
SMALL_FRAMES = [bytes([n]) * size for n, size in enumerate([1, 10, 3, 100, 7, 2000, 4])]
FRAMES = [bytes([n % 251]) * size for n, size in enumerate(
    [1, 10, 3, REUSED_FRAME_BYTES_MIN + 5, 200_000, 100, REUSED_FRAME_BYTES_MIN + 9, STAGING_BYTES, 7, 300_000])]
"""Small frames, frames larger than the staging buffer, and large ones of reusable sizes, each of its own bytes."""


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.closed = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _wire(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(frame)) + frame for frame in frames)


async def _connected() -> tuple[KafkaConnection, _Transport]:
    async def serve(connection: KafkaConnection) -> None:
        pass

    connection, transport = KafkaConnection(serve), _Transport()
    connection.connection_made(transport)
    return connection, transport


async def _deliver(connection: KafkaConnection, transport: _Transport, data: bytes, read_bytes: int) -> None:
    """As the event loop's transport does: receive at most ``read_bytes`` into each buffer the protocol gives,
    and nothing while reading is paused."""
    while data:
        while transport.paused:
            await asyncio.sleep(0)
        buffer = connection.get_buffer(-1)
        count = min(len(buffer), read_bytes, len(data))
        assert count > 0
        buffer[:count] = data[:count]
        del buffer  # as the transport's, the view lives only during the read
        data = data[count:]
        connection.buffer_updated(count)
        await asyncio.sleep(0)


async def _read_all(connection: KafkaConnection, pool: QueuedRequestBytes, buffers: FrameBuffers,
                    count: int) -> list[bytes]:
    frames = []
    for _ in range(count):
        frame = await read_frame(connection, OPTIONS, pool=pool, buffers=buffers)
        frames.append(bytes(frame))
        pool.release(FrameBuffers.charge(len(frame)))
        buffers.give_back(frame)
    return frames


def _received(sent: list[bytes], read_bytes: int) -> tuple[list[bytes], QueuedRequestBytes]:
    async def run() -> tuple[list[bytes], QueuedRequestBytes]:
        connection, transport = await _connected()
        pool = QueuedRequestBytes(64 << 20)
        buffers = FrameBuffers(pool)
        delivery = asyncio.create_task(_deliver(connection, transport, _wire(sent), read_bytes))
        frames = await _read_all(connection, pool, buffers, len(sent))
        await delivery
        return frames, pool

    return asyncio.run(run())


@pytest.mark.parametrize("read_bytes", [1, 2, 3, 5, 1 << 30])
def test_small_frames_come_out_whole_one_byte_at_a_time_or_split_across_their_size(read_bytes: int) -> None:
    frames, pool = _received(SMALL_FRAMES, read_bytes)
    assert frames == SMALL_FRAMES and pool.queued_bytes == 0


@pytest.mark.parametrize("read_bytes", [4099, STAGING_BYTES - 1, STAGING_BYTES + 3, 1 << 30])
def test_large_frames_come_out_whole_however_their_bytes_are_split(read_bytes: int) -> None:
    frames, pool = _received(FRAMES, read_bytes)
    assert frames == FRAMES
    assert pool.queued_bytes == 0 and pool.cached_bytes > 0  # reusable buffers were kept, in the pool's room


def test_the_socket_is_not_read_past_the_staging_buffer_while_a_frame_waits_for_room() -> None:
    async def run() -> None:
        connection, transport = await _connected()
        pool = QueuedRequestBytes(1 << 20)
        await pool.reserve(1 << 20)  # another connection's request fills the bound
        buffers = FrameBuffers(pool)
        frames = [bytes(300_000), b"after"]
        reader = asyncio.create_task(_read_all(connection, pool, buffers, len(frames)))
        delivery = asyncio.create_task(_deliver(connection, transport, _wire(frames), 1 << 30))
        for _ in range(100):
            await asyncio.sleep(0)
        assert transport.paused and not reader.done()  # a full staging buffer, nothing more read
        pool.release(1 << 20)
        assert await reader == frames
        await delivery

    asyncio.run(run())


def test_a_connection_that_ends_mid_frame_releases_its_room() -> None:
    async def run() -> None:
        connection, transport = await _connected()
        pool = QueuedRequestBytes(64 << 20)
        reader = asyncio.create_task(read_frame(connection, OPTIONS, pool=pool, buffers=FrameBuffers(pool)))
        await _deliver(connection, transport, struct.pack(">i", 1 << 20) + bytes(STAGING_BYTES * 2), 1 << 30)
        assert pool.queued_bytes == FrameBuffers.charge(1 << 20) and not reader.done()
        connection.eof_received()
        with pytest.raises(asyncio.IncompleteReadError):
            await reader
        assert pool.queued_bytes == 0

    asyncio.run(run())


def test_a_buffer_still_viewed_is_not_reused() -> None:
    pool = QueuedRequestBytes(64 << 20)
    buffers = FrameBuffers(pool)
    frame = buffers.take(REUSED_FRAME_BYTES_MIN)
    frame[:] = b"k" * len(frame)
    kept = frame[10:20]  # part of the request still held after its answer
    buffers.give_back(frame)
    assert pool.cached_bytes == 0
    other = buffers.take(REUSED_FRAME_BYTES_MIN)  # a free buffer of the same size, which may be reused
    other_buffer = other.obj
    buffers.give_back(other)
    reused = buffers.take(REUSED_FRAME_BYTES_MIN)
    assert reused.obj is other_buffer  # the free list held only the unviewed buffer
    reused[:] = bytes(REUSED_FRAME_BYTES_MIN)
    assert bytes(kept) == b"k" * 10
    del kept


def test_a_frame_is_charged_at_least_the_buffer_it_is_received_into() -> None:
    """The pool counts a frame at FrameBuffers.charge: never less than the (reused or new) buffer it gets."""
    buffers = FrameBuffers(QueuedRequestBytes(64 << 20))
    buffers.give_back(buffers.take(1 << 20))
    smaller = (1 << 20) * 4 // 5 + 1
    reused = buffers.take(smaller)
    assert len(bytearray_of(reused)) == 1 << 20 > smaller  # the free buffer, a quarter larger than its frame
    for size, frame in [(smaller, reused), *((size, buffers.take(size)) for size in (1 << 17, 700_001, 4 << 20))]:
        assert len(frame) == size <= len(bytearray_of(frame)) <= FrameBuffers.charge(size)


def bytearray_of(frame: memoryview) -> bytearray:
    buffer = frame.obj
    assert isinstance(buffer, bytearray)
    return buffer


def test_free_buffers_take_only_free_room_and_are_evicted_when_it_is_needed() -> None:
    async def run() -> None:
        pool = QueuedRequestBytes(8 << 20)
        buffers = FrameBuffers(pool)
        for frame in [buffers.take(1 << 20) for _ in range(3)]:
            buffers.give_back(frame)
        assert pool.cached_bytes == 3 << 20
        await pool.reserve(5 << 20)  # the large requests' 7 MiB, less 5, leaves room for 2 of them
        assert pool.cached_bytes <= 2 << 20 and pool.queued_bytes + pool.cached_bytes <= pool.large_limit_bytes
        buffers.give_back(buffers.take(REUSED_FRAME_BYTES_MIN // 2))  # small frames' buffers are not kept
        assert pool.cached_bytes <= 2 << 20

    asyncio.run(run())


def _api_versions(correlation_id: int, client_id: str = "probe") -> bytes:
    request = ApiVersionsRequest(version=2)
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))


def test_pipelined_requests_in_one_write_are_answered_in_order(tmp_path: Path) -> None:
    """Small and 10 KB requests in turn, four staging buffers' worth: frames end and start at many offsets of the
    staging buffer, and some cross its end."""
    requests = [_api_versions(n, "p" * (n % 2 * 9_999)) for n in range(4 * STAGING_BYTES // 5_000)]
    with KafkaEndpoint(tmp_path / "data", port=0) as endpoint:
        client = RawClient(f"127.0.0.1:{endpoint.port}")
        try:
            client.send_frame(b"".join(requests))
            answered = [struct.unpack_from(">i", client.read_frame())[0] for _ in requests]
        finally:
            client.close()
    assert answered == list(range(len(requests)))


def test_a_client_that_stops_sending_still_gets_its_answer(tmp_path: Path) -> None:
    with KafkaEndpoint(tmp_path / "data", port=0) as endpoint:
        client = RawClient(f"127.0.0.1:{endpoint.port}")
        try:
            client.send_frame(_api_versions(7))
            client.socket.shutdown(socket.SHUT_WR)
            response = ApiVersionsResponse.decode(client.read_frame(), version=2, header=True)
        finally:
            client.close()
    assert response.error_code == ErrorCode.NONE and response.api_keys


def _batch(values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for offset, value in enumerate(values):
        builder.append(offset, timestamp=1_700_000_000_000, key=b"k%d" % offset, value=value, headers=[])
    return bytes(builder.build())


def test_large_produced_requests_sent_together_are_stored_exactly(tmp_path: Path) -> None:
    """Each request's buffer is reused for the next: what the first stored must not change."""
    data = tmp_path / "data"
    rng = np.random.default_rng(19)
    requests = [[rng.bytes(100) for _ in range(3000)] for _ in range(3)]
    with Store.open(data) as store:
        store.create_topic("exact", partitions=1)
    with KafkaEndpoint(data, port=0) as endpoint:
        client = RawClient(f"127.0.0.1:{endpoint.port}")
        try:
            framed = []
            for correlation_id, values in enumerate(requests):
                request = produce_request("exact", _batch(values))
                request.with_header(correlation_id=correlation_id, client_id="exact")
                framed.append(bytes(request.encode(version=7, header=True, framed=True)))
            client.send_frame(b"".join(framed))
            errors = [ProduceResponse.decode(client.read_frame(), version=7, header=True)
                      .responses[0].partition_responses[0].error_code for _ in requests]
        finally:
            client.close()
        wait_for(lambda: endpoint._queued.cached_bytes > 0, "the produced frames' buffer kept for reuse")
    assert errors == [ErrorCode.NONE] * len(requests)
    with Store.open(data) as store:
        stored = store.read("exact", partition=0, start_offset=0)["value"].to_pylist()
    assert stored == [value for values in requests for value in values]
