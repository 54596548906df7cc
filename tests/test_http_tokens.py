"""The HTTP server's bearer tokens over time, in process with real requests: the token file is read again when it
changes, so a revoked token stops working and a new one works without a restart; a file changed into one that
does not parse lets no token in until it is mended; a token file that holds no token keeps every route but
/health closed (it opened them all); and a token that names no one is answered only after Kafka's
connection.failed.authentication.delay.ms (it was answered at once, so tokens could be tried at full speed)."""

from __future__ import annotations

import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerview.service.config import HttpSection, parse_service_config
from ledgerview.service.http import StatusServer
from ledgerview.service.http_access import token_digest
from storage import Store

OLD, NEW = "old-5b0c7e2d9a4f8e1b3c6d", "new-8f2a4c6e0b1d3f5a7c9e"


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    _write(tmp_path / "http-tokens", f"{token_digest(OLD)} User:ops\n")
    return tmp_path / "http-tokens"


@pytest.fixture
def server(tmp_path: Path, tokens: Path) -> Iterator[StatusServer]:
    yield from _server(tmp_path, HttpSection(port=0, tokens_file=str(tokens),
                                             broker_properties={"super.users": "User:ops"}))


def _server(tmp_path: Path, section: HttpSection) -> Iterator[StatusServer]:
    with Store.open(tmp_path / "data"):
        pass
    status = StatusServer(section.host, section.port, tmp_path / "data", lambda store: {}, lambda: {"status": "ok"},
                          access=section.access(tmp_path / "data"))
    status.start()
    try:
        yield status
    finally:
        status.stop()


def _write(path: Path, text: str) -> None:
    """Replace the file as an editor or a deploy tool does: a new file renamed over it."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def _status_code(server: StatusServer, token: str | None) -> int:
    request = urllib.request.Request(f"http://{server.address}/status")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_a_token_is_revoked_and_another_added_without_a_restart(server: StatusServer, tokens: Path) -> None:
    assert (_status_code(server, OLD), _status_code(server, NEW)) == (200, 401)
    _write(tokens, f"# rotated\n{token_digest(NEW)} User:ops\n")
    assert (_status_code(server, OLD), _status_code(server, NEW)) == (401, 200)


def test_a_token_file_changed_into_one_that_does_not_parse_lets_no_token_in(
        server: StatusServer, tokens: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="ledgerview.http")
    _write(tokens, f"{token_digest(OLD)} ops-without-User\n")  # a revocation or rotation gone wrong
    assert _status_code(server, OLD) == 401
    tokens.unlink()
    assert [_status_code(server, OLD) for _ in range(3)] == [401] * 3
    assert [record.getMessage() for record in caplog.records] == ["http.tokens_refused"] * 2  # once a change
    _write(tokens, f"{token_digest(OLD)} User:ops\n")
    assert _status_code(server, OLD) == 200


def test_a_token_file_without_tokens_keeps_the_status_closed(server: StatusServer, tokens: Path) -> None:
    _write(tokens, "# every token revoked\n")
    assert (_status_code(server, None), _status_code(server, OLD)) == (401, 401)
    with urllib.request.urlopen(f"http://{server.address}/health", timeout=30) as health:
        assert health.status == 200


def test_a_token_file_without_tokens_at_start_keeps_the_status_closed(tmp_path: Path, tokens: Path) -> None:
    tokens.write_text("# no one yet\n")
    section = HttpSection(port=0, tokens_file=str(tokens))
    assert section.access(tmp_path).enforced


def test_a_token_that_names_no_one_is_answered_after_the_failed_authentication_delay(
        tmp_path: Path, tokens: Path) -> None:
    config = parse_service_config({"http": {"port": 0, "tokens_file": str(tokens), "super.users": "User:ops",
                                            "connection.failed.authentication.delay.ms": 1000}}, "ledgerview.toml")
    for server in _server(tmp_path, config.http):
        asked = time.monotonic()
        assert _status_code(server, NEW) == 401
        assert time.monotonic() - asked >= 1.0  # the delay is a lower bound; how much later is not the point
        assert (_status_code(server, OLD), _status_code(server, None)) == (200, 401)  # neither waits for it
