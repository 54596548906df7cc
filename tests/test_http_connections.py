"""The HTTP status server's connections, in process with real sockets: a client holding a connection open without
sending delays no other client (before, the server read one request at a time, so one such client after another
kept everyone out), and Kafka's max.connections and max.connections.per.ip bound the connections it serves at
once, a connection past either closed as it arrives; refused connections are logged at most once an interval,
with every one of them in some line's count (one line per refusal let a client flood the log)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from ledgerview.errors import ServiceConfigError
from ledgerview.service.config import parse_service_config
from ledgerview.service.http import StatusServer
from storage import Store
from tests.conftest import ManualClock

DEADLINE_S = 30.0
"""How long a test waits for an answer; the server's own request deadline is far longer, so a held connection is
never dropped by it during a test."""


@pytest.fixture
def data(tmp_path: Path) -> Path:
    with Store.open(tmp_path / "data") as store:
        store.create_topic("orders")
    return tmp_path / "data"


def _server(data: Path, **options: Any) -> Iterator[StatusServer]:
    server = StatusServer("127.0.0.1", 0, data, lambda store: {"topics": store.list_topics()},
                          lambda: {"status": "ok"}, request_timeout_s=600.0, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _connect(server: StatusServer, source: str = "127.0.0.1") -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=DEADLINE_S, source_address=(source, 0))


def _get(server: StatusServer, path: str, source: str = "127.0.0.1") -> bytes:
    """The whole answer to a GET of ``path``; b"" when the server closed the connection without one."""
    with _connect(server, source) as connection:
        try:
            connection.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            answer = b""
            while block := connection.recv(65536):
                answer += block
        except ConnectionError:
            return b""
    return answer


def _closed_by_server(connection: socket.socket) -> bool:
    try:
        return connection.recv(1) == b""
    except ConnectionError:
        return True


def _still_open(connection: socket.socket) -> bool:
    connection.setblocking(False)
    try:
        return connection.recv(1) != b""
    except BlockingIOError:  # nothing to read, and not closed
        return True
    finally:
        connection.setblocking(True)


def _answered_once_room_is_freed(server: StatusServer, source: str = "127.0.0.1") -> bytes:
    """A GET of /health retried until the server has counted a closed connection out (its thread ends on its own)."""
    deadline = time.monotonic() + DEADLINE_S
    while not (answer := _get(server, "/health", source)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


def test_a_client_holding_a_connection_open_delays_no_other_client(data: Path) -> None:
    for server in _server(data):
        with ExitStack() as held:
            silent = held.enter_context(_connect(server))  # connects and sends nothing
            partial = held.enter_context(_connect(server))
            partial.sendall(b"GET /status HTTP/1.0\r\nX-Slow: ")  # a request begun and never finished
            assert _get(server, "/health").startswith(b"HTTP/1.0 200 OK")
            status = _get(server, "/status")
            assert status.startswith(b"HTTP/1.0 200 OK") and status.endswith(b'{"topics": ["orders"]}')
            assert _still_open(silent) and _still_open(partial)  # answered while both were held


def test_connections_past_max_connections_are_closed_as_they_arrive(data: Path) -> None:
    for server in _server(data, max_connections=2):
        first = _connect(server)
        with _connect(server):
            with _connect(server) as third:
                assert _closed_by_server(third)
            first.close()
            assert _answered_once_room_is_freed(server).startswith(b"HTTP/1.0 200 OK")


def test_connections_past_max_connections_per_ip_are_closed_and_other_addresses_served(data: Path) -> None:
    for server in _server(data, max_connections=10, max_connections_per_ip=1):
        with _connect(server) as held:
            with _connect(server) as second:
                assert _closed_by_server(second)
            assert _get(server, "/health", source="127.0.0.2").startswith(b"HTTP/1.0 200 OK")
            assert _still_open(held)
        assert _answered_once_room_is_freed(server).startswith(b"HTTP/1.0 200 OK")


@pytest.mark.parametrize("key", ["max_connections", "max_connections_per_ip"])
def test_the_connection_bounds_are_checked_with_the_config(key: str) -> None:
    with pytest.raises(ServiceConfigError, match=rf"\[http\] {key}: 0 is below 1"):
        parse_service_config({"http": {key: 0}}, "ledgerview.toml")
    assert getattr(parse_service_config({"http": {key: 3}}, "ledgerview.toml").http, key) == 3


def _refusal_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [dict(record.ledgerview_fields) for record in caplog.records
            if record.getMessage() == "http.connection_refused"]


def _refused(server: StatusServer, times: int, source: str = "127.0.0.1") -> None:
    for _ in range(times):
        with _connect(server, source) as refused:
            assert _closed_by_server(refused)


def test_refusals_are_logged_once_then_summed_up_when_the_server_stops(
        data: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ledgerview.http")
    for server in _server(data, max_connections=1):
        with _connect(server):
            _refused(server, 40)
            lines = _refusal_lines(caplog)
            assert [(line.get("refused"), line.get("top_client")) for line in lines] == [(1, "127.0.0.1")]
    lines = _refusal_lines(caplog)
    assert [(line["refused"], line["addresses"], line["top_client_refused"]) for line in lines] == [
        (1, 1, 1), (39, 1, 39)]


def test_refusals_past_the_first_are_logged_once_an_interval_with_their_count_and_addresses(
        data: Path, caplog: pytest.LogCaptureFixture, clock: ManualClock) -> None:
    caplog.set_level(logging.INFO, logger="ledgerview.http")
    for server in _server(data, clock=lambda: clock() / 1000, max_connections=1):
        with _connect(server):
            _refused(server, 30)
            _refused(server, 10, source="127.0.0.2")
            assert len(_refusal_lines(caplog)) == 1
            clock.advance(59_999)
            _refused(server, 1, source="127.0.0.2")
            assert len(_refusal_lines(caplog)) == 1
            clock.advance(1)  # the interval has passed: the server writes the line with no further connection
            deadline = time.monotonic() + DEADLINE_S
            while len(_refusal_lines(caplog)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    first, second = _refusal_lines(caplog)  # nothing left to write when the server stopped
    assert (first["refused"], first["top_client"]) == (1, "127.0.0.1")
    assert (second["refused"], second["addresses"], second["top_client"], second["top_client_refused"]) == (
        40, 2, "127.0.0.1", 29)
