"""Oversized fetches must not sink the endpoint: several connections each ask a fetch.max.bytes-sized (55 MiB)
response and do not read it, while a well-behaved kafka-python producer and consumer still produce and consume;
the endpoint (a subprocess, so its own peak RSS is read from /proc) stays within its configured bound plus what it
maps and caches; each oversized response, read afterwards, is whole and in offset order; and an unread response
holds at most one batch in queued.max.request.bytes (the kernel's socket buffers take the rest), never the whole
pool, and gives it back once sent."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from kafka.protocol.consumer import FetchResponse

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.records import BATCH_HEADER
from storage import Store
from tests.kafka_support import RawClient, endpoint_process, fetch_request, good_clients_work, status_bytes, wait_for

logging.getLogger("kafka").setLevel(logging.WARNING)

MiB = 1024 * 1024
BOUND = 32 * MiB
"""queued.max.request.bytes: what requests and fetch responses being built or sent may hold together."""
BULK_MESSAGES, BULK_VALUE_BYTES = 600, 100_000
"""57 MiB in the bulk topic: each oversized fetch is capped at fetch.max.bytes, 55 MiB."""
FETCH_MAX_BYTES = 57671680
HOSTILE = 5
FETCH_CACHE_BYTES = 64 * MiB
"""EndpointOptions.fetch_cache_bytes' default (the cache now lives inside the bound; kept here as slack)."""
MARGIN = 48 * MiB
"""Python, Arrow and kafka-python objects of the requests, the good clients' work and allocator slack."""


def _oversized_fetch(bootstrap: str) -> RawClient:
    """A connection that asks 2^31-1 bytes of the bulk topic and reads nothing yet."""
    request = fetch_request("bulk", max_bytes=2**31 - 1, max_wait_ms=100)
    request.with_header(correlation_id=7, client_id="hostile")
    client = RawClient(bootstrap)
    client.socket.settimeout(60)
    client.send_frame(bytes(request.encode(version=11, header=True, framed=True)))
    return client


def _check_whole(client: RawClient, expected_bytes: int = FETCH_MAX_BYTES) -> None:
    """The oversized response: one partition, no error, batches from offset 0 on without gaps, about
    ``expected_bytes`` of records (fetch.max.bytes, or the whole topic when smaller)."""
    response = FetchResponse.decode(client.read_frame(), version=11, header=True)
    [topic] = response.responses
    [partition] = topic.partitions
    assert partition.error_code == 0
    records, position, next_offset = partition.records, 0, 0
    while position < len(records):
        base_offset, length, *_, last_delta, _, _, _, _, _, count = BATCH_HEADER.unpack_from(records, position)
        assert (base_offset, count) == (next_offset, last_delta + 1)
        next_offset, position = base_offset + count, position + 12 + length
    assert position == len(records)
    assert expected_bytes - 2 * BULK_VALUE_BYTES < len(records) <= expected_bytes + 4096


def _store(data: Path, bulk_messages: int) -> None:
    with Store.open(data) as store:
        store.create_topic("good", partitions=1)
        store.create_topic("bulk", partitions=1)
        rng = np.random.default_rng(18)
        for _ in range(bulk_messages // 100):
            store.append("bulk", [(None, rng.bytes(BULK_VALUE_BYTES)) for _ in range(100)], partition=0)


@pytest.mark.slow
def test_good_clients_work_and_memory_stays_bounded_while_oversized_fetches_go_unread(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data, BULK_MESSAGES)
    with endpoint_process(data, "--queued-max-request-bytes", str(BOUND)) as (process, bootstrap):
        hostile: list[RawClient] = []
        try:
            idle = status_bytes(process.pid, "VmRSS:")
            hostile = [_oversized_fetch(bootstrap) for _ in range(HOSTILE)]
            good_clients_work(bootstrap)
            for client in hostile:
                _check_whole(client)
            peak = status_bytes(process.pid, "VmHWM:")
            mapped = BULK_MESSAGES * BULK_VALUE_BYTES  # the bulk topic's segment pages, mapped and read
            assert peak - idle < BOUND + mapped + FETCH_CACHE_BYTES + MARGIN, (
                f"peak RSS {peak / MiB:.0f} MiB from {idle / MiB:.0f} MiB idle")
        finally:
            for client in hostile:
                client.close()


@pytest.mark.slow
def test_unread_responses_hold_at_most_queued_max_request_bytes_and_release_it_once_sent(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data, 200)  # 20 MB: five unread responses would hold five times the bound below
    bound = 8 * MiB
    with KafkaEndpoint(data, options=EndpointOptions(port=0, queued_max_request_bytes=bound)) as endpoint:
        bootstrap = f"127.0.0.1:{endpoint.port}"
        hostile = [_oversized_fetch(bootstrap) for _ in range(HOSTILE)]
        try:
            # Each unread response holds at most the batch its client's socket did not take: the five stay under
            # the bound for large requests, so a reading client's batches fit beside them.
            wait_for(lambda: endpoint._queued.stalled_bytes > 0, "unread responses to hold a batch in the pool")
            good_clients_work(bootstrap)
            for client in hostile:
                _check_whole(client, 200 * BULK_VALUE_BYTES)
        finally:
            for client in hostile:
                client.close()
        wait_for(lambda: endpoint._queued.queued_bytes == 0, "every reserved byte released")
        assert endpoint._queued.peak_bytes <= bound
