"""queued.max.request.bytes: many connections send large valid produce requests without reading their answers;
the bytes of requests read and not answered never pass the bound (the others wait, their sockets unread), and
every request is answered in the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.broker import EndpointOptions
from storage import Store
from tests.kafka_support import RawClient, wait_for

BOUND = 4 * 1024 * 1024
CONNECTIONS, REQUESTS, VALUE_BYTES = 16, 3, 1024 * 1024


def _produce_frame(correlation_id: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    builder.append(0, timestamp=None, key=None, value=bytes(VALUE_BYTES), headers=[])
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(builder.build()))
    request = ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=5000,
                             topic_data=[ProduceRequest.TopicProduceData(name="big", partition_data=[data])])
    request.with_header(correlation_id=correlation_id, client_id="pressure")
    return bytes(request.encode(version=7, header=True, framed=True))


def test_requests_in_flight_stay_under_queued_max_request_bytes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("big", partitions=1, config={"max.message.bytes": str(2 * VALUE_BYTES)})
    options = EndpointOptions(port=0, queued_max_request_bytes=BOUND)
    with KafkaEndpoint(data, options=options) as endpoint:
        clients = [RawClient(f"127.0.0.1:{endpoint.port}") for _ in range(CONNECTIONS)]
        try:
            for client in clients:
                client.socket.setblocking(False)
            pending = {client: b"".join(_produce_frame(n) for n in range(REQUESTS)) for client in clients}
            while pending:  # send everything, reading no answer, as fast as the endpoint takes it
                for client, rest in list(pending.items()):
                    try:
                        sent = client.socket.send(rest)
                    except BlockingIOError:
                        continue
                    pending[client] = rest[sent:]
                    if not pending[client]:
                        del pending[client]
            with Store.open(data) as store:
                wait_for(lambda: store.end_offset("big", 0) == CONNECTIONS * REQUESTS, "every request stored")
            queue = endpoint._queued
            assert queue.waits > 0  # back-pressure was applied
            assert queue.peak_bytes <= BOUND
            wait_for(lambda: queue.queued_bytes == 0, "every request answered")
            for client in clients:
                client.socket.settimeout(30)
                for _ in range(REQUESTS):
                    response = ProduceResponse.decode(client.read_frame(), version=7, header=True)
                    assert response.responses[0].partition_responses[0].error_code == 0
        finally:
            for client in clients:
                client.close()


def test_kafkas_minus_one_is_no_bound_and_other_values_below_one_are_refused() -> None:
    assert EndpointOptions(queued_max_request_bytes=-1).queued_max_request_bytes == -1
    with pytest.raises(ValueError, match="queued_max_request_bytes is 0; it must be at least 1, or -1 for no bound"):
        EndpointOptions(queued_max_request_bytes=0)
