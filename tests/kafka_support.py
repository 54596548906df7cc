"""Shared pieces of the Kafka endpoint tests: a store with an endpoint on a loopback port (or in a subprocess, to
read its own peak RSS), a raw protocol client for exact error codes, compression bombs, a well-behaved
kafka-python producer and consumer, and polling helpers (no sleeps)."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import crc32c
import pyarrow as pa
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.records import BATCH_HEADER, CRC_START, MAGIC
from ledgerview.kafka.varints import encode_varint
from storage import Store

T = TypeVar("T")


@dataclass
class Running:
    endpoint: KafkaEndpoint
    data: Path
    store: Store

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.endpoint.port}"


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[Running]:
    """An endpoint on an ephemeral loopback port over a fresh data folder, and a store of the test's own on the
    same folder (another handle, as another process would have)."""
    data = tmp_path / "data"
    with Store.open(data) as store, KafkaEndpoint(data, port=0) as endpoint:
        yield Running(endpoint, data, store)


def wait_for(condition: Callable[[], T | None], what: str, timeout_seconds: float = 60.0) -> T:
    """Poll ``condition`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def established_connections_to(port: int) -> int:
    """TCP connections to ``port`` on loopback that are open now, counted from the client side (Linux's
    /proc/net/tcp: local address, remote address, state; 01 is ESTABLISHED)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            count += 1
    return count


class RawClient:
    """One connection speaking kafka-python's protocol classes directly, to see the exact error codes."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0

    def send_frame(self, frame: bytes) -> None:
        self.socket.sendall(frame)

    def request(self, request: Any, response_class: Any, version: int) -> Any:
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="test")
        self.send_frame(bytes(request.encode(version=version, header=True, framed=True)))
        return response_class.decode(self.read_frame(), version=version, header=True)

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._read(4))
        return self._read(size)

    def _read(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.socket.recv(count - len(data))
            if not chunk:
                raise ConnectionError("the endpoint closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self.socket.close()


@contextmanager
def endpoint_process(data: Path, *options: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m ledgerview.kafka`` over ``data`` on an ephemeral port with the given command-line options: the
    process and its bootstrap address; terminated on exit."""
    with subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--port", "0", *options],
                          stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            yield process, f"127.0.0.1:{int(process.stdout.readline().rsplit(':', 1)[1])}"
        finally:
            process.terminate()


def status_bytes(pid: int, field: str) -> int:
    """A memory figure of /proc/<pid>/status (``VmRSS:``, ``VmHWM:``), in bytes."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) * 1024


def good_clients_work(bootstrap: str) -> None:
    """A kafka-python producer sends 20 values to topic ``good`` (acks=all) and a consumer reads them back."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=60000)
    futures = [producer.send("good", value=b"v%d" % i) for i in range(20)]
    producer.flush(timeout=60)
    assert [future.get(timeout=60).offset for future in futures] == list(range(20))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100,
                             request_timeout_ms=60000)
    target = TopicPartition("good", 0)
    consumer.assign([target])
    consumer.seek(target, 0)
    values: list[bytes] = []

    def consumed_all() -> bool:
        values.extend(record.value for records in consumer.poll(timeout_ms=200).values() for record in records)
        return len(values) == 20

    wait_for(consumed_all, "the good consumer's 20 values")
    consumer.close()
    assert values == [b"v%d" % i for i in range(20)]


def zeros_compressed(codec: int, size: int) -> bytes:
    """One record (no key, a value of ``size`` zero bytes, no headers), compressed in 1 MiB steps so the test
    never holds the value whole."""
    body = b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1) + encode_varint(size)
    start = encode_varint(len(body) + size + 1) + body
    pieces = [start, *[bytes(1 << 20)] * (size >> 20), bytes(size % (1 << 20) + 1)]  # + the headers count, 0
    if codec == 1:
        gzip = zlib.compressobj(9, wbits=31)
        return b"".join(gzip.compress(piece) for piece in pieces) + gzip.flush()
    if codec == 2:  # a raw snappy block declares its uncompressed size first; refused on that alone
        return bytes(pa.Codec("snappy").compress(b"".join(pieces), asbytes=True))
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, {3: "lz4", 4: "zstd"}[codec]) as stream:
        for piece in pieces:
            stream.write(piece)
    return bytes(sink.getvalue().to_pybytes())


def one_record_batch(codec: int, records: bytes) -> bytes:
    """A record batch v2 of one record whose (compressed) records are ``records``, with a valid CRC-32C."""
    header = BATCH_HEADER.pack(0, BATCH_HEADER.size - 12 + len(records), 0, MAGIC, 0, codec, 0, 1_700_000_000_000,
                               1_700_000_000_000, -1, -1, -1, 1)
    unsigned = header + records
    crc = crc32c.crc32c(unsigned[CRC_START:])
    return unsigned[:17] + struct.pack(">I", crc) + unsigned[CRC_START:]


def produce_request(topic: str, records: bytes) -> ProduceRequest:
    """A Produce v7 (acks=all) of ``records`` to partition 0 of ``topic``."""
    partition_data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    return ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=5000,
                          topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[partition_data])])


def produce_error(client: RawClient, topic: str, records: bytes) -> int:
    """The error code of producing ``records`` to partition 0 of ``topic``."""
    response = client.request(produce_request(topic, records), ProduceResponse, 7)
    return int(response.responses[0].partition_responses[0].error_code)


def fetch_request(topic: str, *, partitions: int = 1, offset: int = 0, max_bytes: int,
                  partition_max_bytes: int | None = None, max_wait_ms: int = 0) -> FetchRequest:
    """A Fetch v11 of ``partitions`` partitions of ``topic`` from ``offset`` (min_bytes 1 when it waits, else 0);
    ``partition_max_bytes`` defaults to ``max_bytes``."""
    wanted = [FetchRequest.FetchTopic.FetchPartition(
        partition=index, fetch_offset=offset, log_start_offset=-1,
        partition_max_bytes=max_bytes if partition_max_bytes is None else partition_max_bytes)
        for index in range(partitions)]
    return FetchRequest(version=11, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1 if max_wait_ms else 0,
                        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
                        topics=[FetchRequest.FetchTopic(topic=topic, partitions=wanted)], forgotten_topics_data=[],
                        rack_id="")


def consumed_from_start(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of partition 0 of ``topic`` read from offset 0 by kafka-python until ``count`` records
    came (or 60 s passed)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100,
                             consumer_timeout_ms=5000, request_timeout_ms=20000)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        got: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                got += [(record.offset, record.key, record.value) for record in batch]
        return got
    finally:
        consumer.close()
