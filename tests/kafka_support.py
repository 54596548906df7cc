"""Shared pieces of the Kafka endpoint tests: a store with an endpoint on a loopback port, a raw protocol client
for exact error codes, and polling helpers (no sleeps)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledgerview.kafka import KafkaEndpoint
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
