"""One hostile client must not sink the endpoint (issue 18; DESIGN.md invariant 10: bad input gets a clear error and
changes nothing): against a real endpoint on 127.0.0.1, a frame declaring more than socket.request.max.bytes (or a
negative size) closes its connection before any body is sent; a Fetch asking 2^31-1 bytes gets at most
fetch.max.bytes; compression bombs of every codec are refused with MESSAGE_TOO_LARGE without being inflated and
store nothing; idle connections and half-sent frames are closed after connections.max.idle.ms; and after each,
the endpoint still answers another client. Connections past max.connections are closed as they arrive and logged
at most once a minute, every refused connection in some line's count (one line each let a client flood the log)."""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.errors import ServiceConfigError
from ledgerview.kafka import EndpointOptions, KafkaEndpoint
from ledgerview.kafka.broker import LIMITS
from ledgerview.kafka.compression import DecompressedTooLargeError, decompress
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.service.config import KafkaSection, parse_service_config
from storage import Store
from tests.conftest import ManualClock
from tests.kafka_support import (
    RawClient,
    established_connections_to,
    fetch_request,
    one_record_batch,
    produce_error,
    wait_for,
    zeros_compressed,
)

BOMB_BYTES = 100 * 1024 * 1024
MESSAGE_MAX_BYTES = 64 * 1024
FETCH_MAX_BYTES = 64 * 1024


@contextmanager
def _endpoint(tmp_path: Path, **limits: Any) -> Iterator[tuple[Store, str]]:
    data = tmp_path / "data"
    options = EndpointOptions(port=0, **limits)
    with Store.open(data) as store, KafkaEndpoint(data, options=options) as endpoint:
        yield store, f"127.0.0.1:{endpoint.port}"


def _answers(bootstrap: str) -> bool:
    """Whether a fresh connection gets an ApiVersions answer: the endpoint still serves other clients."""
    client = RawClient(bootstrap)
    try:
        response = client.request(ApiVersionsRequest(version=2), ApiVersionsResponse, 2)
        return bool(response.error_code == ErrorCode.NONE)
    finally:
        client.close()


def _closed_by_endpoint(sock: socket.socket) -> bool:
    """Whether the endpoint closed ``sock`` (blocks until it does, or the socket's time-out)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("declared", [200 * 1024 * 1024, 2**31 - 1, -1, -(2**31)])
def test_a_frame_above_socket_request_max_bytes_closes_its_connection_unread(tmp_path: Path, declared: int) -> None:
    with _endpoint(tmp_path, socket_request_max_bytes=1024 * 1024) as (_, bootstrap):
        client = RawClient(bootstrap)
        client.send_frame(struct.pack(">i", declared))  # no body is ever sent: the endpoint must not wait for it
        assert _closed_by_endpoint(client.socket)
        client.close()
        assert _answers(bootstrap)


def _fetch(client: RawClient, topic: str, partitions: int, max_bytes: int, partition_max_bytes: int) -> list[Any]:
    request = fetch_request(topic, partitions=partitions, max_bytes=max_bytes, partition_max_bytes=partition_max_bytes)
    return list(client.request(request, FetchResponse, 11).responses[0].partitions)


def test_a_fetch_gets_at_most_fetch_max_bytes_whatever_the_client_asks(tmp_path: Path) -> None:
    with _endpoint(tmp_path, fetch_max_bytes=FETCH_MAX_BYTES) as (store, bootstrap):
        store.create_topic("t", partitions=2)
        for partition in range(2):
            for _ in range(4):  # several stored batches per partition, 200 KB each
                store.append("t", [(None, bytes(1000))] * 200, partition=partition)
        client = RawClient(bootstrap)
        try:
            greedy = _fetch(client, "t", 2, 2**31 - 1, 2**31 - 1)
            assert 0 < sum(len(answer.records) for answer in greedy) <= FETCH_MAX_BYTES
            modest = _fetch(client, "t", 2, 10_000, 2**31 - 1)  # the client's smaller value wins
            assert 0 < sum(len(answer.records) for answer in modest) <= 10_000
            per_partition = _fetch(client, "t", 2, 2**31 - 1, 5_000)
            assert all(0 < len(answer.records) <= 5_000 for answer in per_partition)
            store.create_topic("big", partitions=1)
            store.append("big", [(None, bytes(200_000))], partition=0)
            [at_least_one] = _fetch(client, "big", 1, 2**31 - 1, 2**31 - 1)  # a consumer is never stuck
            assert len(at_least_one.records) > 200_000
        finally:
            client.close()


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compression_bomb_is_refused_without_being_inflated(tmp_path: Path, codec: int) -> None:
    size = BOMB_BYTES if codec != 2 else 4 * 1024 * 1024  # snappy compresses zeros only ~20:1
    bomb = zeros_compressed(codec, size)
    assert len(bomb) < 1024 * 1024  # small on the wire: within max.message.bytes, as Kafka checks a batch
    with _endpoint(tmp_path, socket_request_max_bytes=1024 * 1024) as (store, bootstrap):
        store.create_topic("t", partitions=1)
        client = RawClient(bootstrap)
        try:
            # Inflating stops at the request bound (1 MiB here), not at the bomb's 100 MiB.
            assert produce_error(client, "t", one_record_batch(codec, bomb)) == ErrorCode.RECORD_LIST_TOO_LARGE
            assert store.end_offset("t", 0) == 0
            small = zeros_compressed(codec, 1000)
            # the endpoint goes on serving
            assert produce_error(client, "t", one_record_batch(codec, small)) == ErrorCode.NONE
            assert store.read("t", 0)["value"].to_pylist() == [bytes(1000)]
        finally:
            client.close()


def _kafka_batch(compression: int, values: list[bytes]) -> bytes:
    """A record batch as Kafka producers build it (kafka-python's builder), one keyed record per value."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for index, value in enumerate(values):
        builder.append(index, timestamp=None, key=b"k%d" % index, value=value, headers=[])
    return bytes(builder.build())


def test_a_compressed_batch_of_messages_that_each_fit_is_taken_whatever_it_inflates_to(tmp_path: Path) -> None:
    """Kafka's rule: max.message.bytes bounds a batch on the wire and each message, not a batch decompressed."""
    with _endpoint(tmp_path) as (store, bootstrap):
        store.create_topic("t", partitions=1, config={"max.message.bytes": str(MESSAGE_MAX_BYTES)})
        client = RawClient(bootstrap)
        try:
            values = [bytes([index % 7]) * 1000 for index in range(200)]  # 200 KB decompressed, 64 KiB allowed
            assert produce_error(client, "t", _kafka_batch(1, values)) == ErrorCode.NONE
            assert store.read("t", 0)["value"].to_pylist() == values
            one_too_large = [bytes(MESSAGE_MAX_BYTES + 1)]  # compresses to almost nothing, but is one message
            assert produce_error(client, "t", _kafka_batch(1, one_too_large)) == ErrorCode.MESSAGE_TOO_LARGE
            assert store.end_offset("t", 0) == 200
        finally:
            client.close()


def test_a_batch_larger_on_the_wire_than_max_message_bytes_is_a_message_too_large(tmp_path: Path) -> None:
    with _endpoint(tmp_path) as (store, bootstrap):
        store.create_topic("t", partitions=1, config={"max.message.bytes": str(MESSAGE_MAX_BYTES)})
        client = RawClient(bootstrap)
        try:
            incompressible = [os.urandom(1000) for _ in range(100)]
            assert produce_error(client, "t", _kafka_batch(1, incompressible)) == ErrorCode.MESSAGE_TOO_LARGE
            assert store.end_offset("t", 0) == 0
        finally:
            client.close()


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_compressed_records_that_do_not_decompress_are_a_corrupt_message(tmp_path: Path, codec: int) -> None:
    with _endpoint(tmp_path) as (store, bootstrap):
        store.create_topic("t", partitions=1)
        client = RawClient(bootstrap)
        try:
            assert produce_error(client, "t", one_record_batch(codec, zeros_compressed(codec, 1000)[:-12])) \
                == ErrorCode.CORRUPT_MESSAGE
            assert store.end_offset("t", 0) == 0
        finally:
            client.close()


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_streaming_decompression_stops_near_its_limit(codec: int) -> None:
    bomb = zeros_compressed(codec, BOMB_BYTES)
    with pytest.raises(DecompressedTooLargeError, match="more than 65536 bytes"):
        decompress(codec, bomb, limit_bytes=MESSAGE_MAX_BYTES)
    assert len(decompress(codec, zeros_compressed(codec, 1 << 20), limit_bytes=2 << 20)) > 1 << 20


def test_batches_that_together_pass_the_request_bound_are_a_record_list_too_large(tmp_path: Path) -> None:
    with _endpoint(tmp_path, socket_request_max_bytes=1024 * 1024) as (store, bootstrap):
        store.create_topic("t", partitions=1)  # max.message.bytes 1048588: each batch alone is fine
        batch = one_record_batch(1, zeros_compressed(1, 600 * 1024))
        client = RawClient(bootstrap)
        try:
            assert produce_error(client, "t", batch + batch) == ErrorCode.RECORD_LIST_TOO_LARGE
            assert store.end_offset("t", 0) == 0
        finally:
            client.close()


@pytest.mark.parametrize("sent", [b"", struct.pack(">i", 1000) + b"half"], ids=["idle", "half-sent frame"])
def test_an_idle_connection_is_closed_after_connections_max_idle_ms(tmp_path: Path, sent: bytes) -> None:
    with _endpoint(tmp_path, connections_max_idle_ms=200) as (_, bootstrap):
        client = RawClient(bootstrap)
        client.send_frame(sent)
        assert _closed_by_endpoint(client.socket)  # RawClient's 30 s time-out bounds the wait
        client.close()
        assert _answers(bootstrap)


def test_a_client_that_reads_no_responses_is_cut_off_after_connections_max_idle_ms(tmp_path: Path) -> None:
    requests, response_bytes = 40, 1024 * 1024
    with _endpoint(tmp_path, connections_max_idle_ms=300) as (store, bootstrap):
        store.create_topic("t", partitions=1)
        store.append("t", [(None, bytes(1000))] * 2000, partition=0)
        client = RawClient(bootstrap)
        try:
            for _ in range(requests):  # 40 MiB of responses asked for, none read
                _send_fetch(client, "t", response_bytes)
            port = int(bootstrap.rsplit(":", 1)[1])
            wait_for(lambda: established_connections_to(port) == 0, "the endpoint to cut the client off")
            received = 0
            while chunk := _received(client.socket):
                received += len(chunk)
            assert received < requests * response_bytes // 2  # what the kernel had buffered, not the responses
        finally:
            client.close()
        assert _answers(bootstrap)


def _send_fetch(client: RawClient, topic: str, max_bytes: int) -> None:
    request = fetch_request(topic, max_bytes=max_bytes)
    client.correlation_id += 1
    request.with_header(correlation_id=client.correlation_id, client_id="test")
    client.send_frame(bytes(request.encode(version=11, header=True, framed=True)))


def _received(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1 << 20)
    except ConnectionResetError:
        return b""


def test_the_limits_are_kafkas_defaults_and_the_service_takes_them() -> None:
    kafka_names = {"socket_request_max_bytes": 104857600, "fetch_max_bytes": 57671680,
                   "connections_max_idle_ms": 600000, "max_connections": 2147483647,
                   "max_connections_per_ip": 2147483647}
    assert {name: getattr(EndpointOptions(), name) for name in LIMITS} == kafka_names
    assert {name: getattr(KafkaSection(), name) for name in LIMITS} == kafka_names
    config = parse_service_config({"kafka": {"fetch_max_bytes": 1024, "connections_max_idle_ms": 50}}, "s.toml")
    assert (config.kafka.fetch_max_bytes, config.kafka.connections_max_idle_ms) == (1024, 50)
    for name in LIMITS:
        with pytest.raises(ServiceConfigError, match=rf"\[kafka\] {name}: 0 is below 1"):
            parse_service_config({"kafka": {name: 0}}, "s.toml")
        with pytest.raises(ValueError, match=name):
            EndpointOptions(**dict[str, Any]({name: 0}))


@pytest.mark.slow
def test_the_endpoint_process_takes_the_limits_as_options(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ledgerview.kafka", str(tmp_path / "data"), "--port", "0"]
    refused = subprocess.run([*command, "--fetch-max-bytes", "0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "fetch_max_bytes is 0" in refused.stderr
    with (tmp_path / "stderr").open("w") as stderr, subprocess.Popen(
            [*command, "--connections-max-idle-ms", "200", "--socket-request-max-bytes", "4096"],
            stdout=subprocess.PIPE, stderr=stderr, text=True) as process:
        try:
            assert process.stdout is not None
            bootstrap = process.stdout.readline().removeprefix("listening on ").strip()
            idle, oversized = RawClient(bootstrap), RawClient(bootstrap)
            oversized.send_frame(struct.pack(">i", 4097))
            assert _closed_by_endpoint(oversized.socket) and _closed_by_endpoint(idle.socket)
            idle.close()
            oversized.close()
            assert _answers(bootstrap)
        finally:
            process.terminate()
            process.wait(timeout=60)
    # the process logs at INFO by default, as a broker does: an operator sees why a connection was closed
    log = (tmp_path / "stderr").read_text()
    assert "INFO ledgerview.kafka.server: closing a Kafka connection: " in log and "socket.request.max.bytes" in log


def _api_versions(client: RawClient) -> int:
    return int(client.request(ApiVersionsRequest(version=2), ApiVersionsResponse, 2).error_code)


def _taken(bootstrap: str) -> bool:
    """Whether a new connection is served now (not closed at once)."""
    try:
        return _answers(bootstrap)
    except ConnectionError:
        return False


@pytest.mark.parametrize("limit", ["max_connections", "max_connections_per_ip"])
def test_connections_beyond_the_limit_are_closed_as_they_arrive(tmp_path: Path, limit: str) -> None:
    with _endpoint(tmp_path, **{limit: 2}) as (_, bootstrap):
        first, second = RawClient(bootstrap), RawClient(bootstrap)
        try:
            assert _api_versions(first) == _api_versions(second) == ErrorCode.NONE
            assert not _taken(bootstrap)  # a third is closed at once
            second.close()
            wait_for(lambda: _taken(bootstrap), "a connection to be taken once another one closed")
            assert _api_versions(first) == ErrorCode.NONE  # the ones taken were never disturbed
        finally:
            first.close()


REFUSAL_COUNT = re.compile(r"\): (\d+); addresses: \d+")


def _refusal_counts(caplog: pytest.LogCaptureFixture) -> list[int | None]:
    """How many refused connections each of the endpoint's lines about them counts (None: a line with no count)."""
    counts: list[int | None] = []
    for record in caplog.records:
        message = record.getMessage()
        if record.name == "ledgerview.kafka.server" and "max.connections" in message:
            match = REFUSAL_COUNT.search(message)
            counts.append(int(match[1]) if match else None)
    return counts


def _refused(bootstrap: str, times: int) -> None:
    host, port = bootstrap.rsplit(":", 1)
    for _ in range(times):
        with socket.create_connection((host, int(port)), timeout=30) as refused:
            assert _closed_by_endpoint(refused)


def test_refused_connections_are_logged_once_then_summed_up_when_the_endpoint_stops(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ledgerview.kafka")
    with _endpoint(tmp_path, max_connections=1) as (_, bootstrap):
        held = RawClient(bootstrap)
        try:
            assert _api_versions(held) == ErrorCode.NONE
            _refused(bootstrap, 500)
            assert _refusal_counts(caplog) == [1]  # the first at once, the rest within the minute counted
        finally:
            held.close()
    assert _refusal_counts(caplog) == [1, 499]


def test_refusals_past_the_first_are_logged_when_their_minute_passes_with_no_further_connection(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, clock: ManualClock) -> None:
    caplog.set_level(logging.INFO, logger="ledgerview.kafka")
    options = EndpointOptions(port=0, max_connections_per_ip=1)
    with KafkaEndpoint(tmp_path / "data", options=options, clock=lambda: clock() / 1000) as endpoint:
        bootstrap = f"127.0.0.1:{endpoint.port}"
        held = RawClient(bootstrap)
        try:
            assert _api_versions(held) == ErrorCode.NONE
            _refused(bootstrap, 30)
            clock.advance(59_999)
            _refused(bootstrap, 1)
            assert _refusal_counts(caplog) == [1]
            clock.advance(1)
            wait_for(lambda: len(_refusal_counts(caplog)) == 2, "the line due to be written by the endpoint itself")
            assert _refusal_counts(caplog) == [1, 30]
        finally:
            held.close()
    assert _refusal_counts(caplog) == [1, 30]  # nothing was left to write when the endpoint stopped
