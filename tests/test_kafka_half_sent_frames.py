"""Frames sent in part must not starve other clients: many connections each send half of a large request frame and
stop; a well-behaved kafka-python producer and consumer still produce and consume while those connections are
open (large frames cannot fill the last part of queued.max.request.bytes), and a frame whose bytes stop arriving
is closed after frame.stall.timeout.ms, its room released."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import pytest

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.request_queue import SMALL_REQUEST_BYTES, QueuedRequestBytes
from storage import Store
from tests.kafka_support import RawClient, established_connections_to, good_clients_work, wait_for

logging.getLogger("kafka").setLevel(logging.WARNING)

BOUND = 8 * 1024 * 1024
FRAME_BYTES = 1024 * 1024
HALF_SENT = 40
"""40 frames of 1 MiB declare five times the bound."""


def _half_sent(bootstrap: str) -> RawClient:
    client = RawClient(bootstrap)
    client.send_frame(struct.pack(">i", FRAME_BYTES) + bytes(FRAME_BYTES // 2))
    return client


@pytest.mark.slow
def test_a_good_client_produces_and_consumes_while_many_frames_are_half_sent(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("good", partitions=1)
    options = EndpointOptions(port=0, queued_max_request_bytes=BOUND)
    with KafkaEndpoint(data, options=options) as endpoint:
        bootstrap = f"127.0.0.1:{endpoint.port}"
        hostile = [_half_sent(bootstrap) for _ in range(HALF_SENT)]
        try:
            wait_for(lambda: endpoint._queued.waits > 0, "half-sent frames to fill the large part of the bound")
            good_clients_work(bootstrap)
            assert established_connections_to(endpoint.port) >= HALF_SENT  # the half-sent frames are still open
            assert endpoint._queued.queued_bytes > 0
        finally:
            for client in hostile:
                client.close()


def test_a_frame_whose_bytes_stop_arriving_is_closed_after_frame_stall_timeout_ms(tmp_path: Path) -> None:
    options = EndpointOptions(port=0, frame_stall_timeout_ms=200)
    with KafkaEndpoint(tmp_path / "data", options=options) as endpoint:
        client = _half_sent(f"127.0.0.1:{endpoint.port}")
        try:
            assert client.socket.recv(1) == b""  # closed by the endpoint
            wait_for(lambda: endpoint._queued.queued_bytes == 0, "the stalled frame's room released")
        finally:
            client.close()
    with pytest.raises(ValueError, match="frame_stall_timeout_ms is 0; it must be at least 1"):
        EndpointOptions(frame_stall_timeout_ms=0)


def test_large_frames_leave_the_last_eighth_of_the_bound_to_small_ones() -> None:
    async def fill() -> QueuedRequestBytes:
        queue = QueuedRequestBytes(8 * FRAME_BYTES)
        for _ in range(7):
            assert queue.fits(FRAME_BYTES)
            await queue.reserve(FRAME_BYTES)
        return queue

    queue = asyncio.run(fill())
    assert not queue.fits(FRAME_BYTES)
    assert queue.fits(SMALL_REQUEST_BYTES)
