"""Password guessing against a real endpoint process (``python -m ledgerview.kafka DATA --config FILE``): a bounded
loop of failed logins, over SaslAuthenticate and over SaslHandshake v0 raw tokens, is each refused and closed; an
authenticated client is served all along; the process stays up and its resident memory does not grow past a
bound."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from ledgerview.kafka.protocol import ErrorCode
from storage import Store
from tests.kafka_support import RawClient
from tests.security_support import add_users

ATTEMPTS = 50
RSS_GROWTH_BOUND_KIB = 16 * 1024
"""Far above what 50 closed connections may leave behind, far below a leak of what each one allocates."""


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """(bootstrap, pid) of an endpoint process with one SASL_PLAINTEXT listener and users alice, bob, admin."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("orders")
    add_users(data)
    config = tmp_path / "server.properties"
    config.write_text("listeners=SASL_PLAINTEXT://127.0.0.1:0\nsasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256\n"
                      "connection.failed.authentication.delay.ms=20\n")
    with subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--config", str(config)],
                          stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("listening on "), line
            yield line.removeprefix("listening on ").split(" ")[0], process.pid
            assert process.poll() is None, "the endpoint exited during the guessing"
        finally:
            process.terminate()
            process.wait(timeout=60)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def _login(bootstrap: str, password: str) -> tuple[RawClient, int]:
    """A connection after a PLAIN login as alice over SaslAuthenticate, and its error code."""
    client = RawClient(bootstrap)
    assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
    token = b"\0alice\0" + password.encode()
    return client, client.request(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 1).error_code


def _guess(bootstrap: str, attempt: int) -> None:
    """One wrong password, alternately over SaslAuthenticate and as a v0 raw token; the endpoint closes both."""
    guess = f"guess-{attempt}"
    if attempt % 2:
        client, error = _login(bootstrap, guess)
        assert error == ErrorCode.SASL_AUTHENTICATION_FAILED
    else:
        client = RawClient(bootstrap)
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 0).error_code == 0
        token = b"\0alice\0" + guess.encode()
        client.send_frame(len(token).to_bytes(4, "big") + token)
    try:
        with pytest.raises(ConnectionError):
            client.read_frame()
    finally:
        client.close()


def _metadata_served(client: RawClient) -> bool:
    response = client.request(MetadataRequest(topics=None), MetadataResponse, 1)
    return [topic.name for topic in response.topics if not topic.name.endswith(".compacted")] == ["orders"]


@pytest.mark.slow
def test_a_bounded_loop_of_failed_logins_is_refused_while_the_endpoint_serves_and_stays_small(
        endpoint: tuple[str, int]) -> None:
    bootstrap, pid = endpoint
    good, error = _login(bootstrap, "alice-secret")
    try:
        assert error == ErrorCode.NONE and _metadata_served(good)
        for attempt in range(10):  # warm up: the first failures load what every later one reuses
            _guess(bootstrap, attempt)
        before = _rss_kib(pid)
        for attempt in range(ATTEMPTS):
            _guess(bootstrap, attempt)
            if attempt % 10 == 9:
                assert _metadata_served(good)
        grown = _rss_kib(pid) - before
    finally:
        good.close()
    assert grown < RSS_GROWTH_BOUND_KIB, f"resident memory grew {grown} KiB over {ATTEMPTS} failed logins"
    fresh, error = _login(bootstrap, "alice-secret")
    fresh.close()
    assert error == ErrorCode.NONE
