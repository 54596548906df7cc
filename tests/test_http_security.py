"""The HTTP status server over TLS with real certificates made by the test (tests/security_support.py) and real
HTTPS clients (urllib over Python's ssl): bearer tokens and client certificates name a principal, which sees
/status and /metrics only as a super user of [http] or with an ACL allowing Describe on the cluster; /health is
open; a client without a trusted, valid certificate is refused in the handshake when certificates are required;
the config refuses a non-loopback address without TLS and authentication unless insecure, and says why."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerview.cli import main
from ledgerview.errors import ServiceConfigError
from ledgerview.service.config import HttpSection, parse_service_config
from ledgerview.service.http import StatusServer
from ledgerview.service.http_access import token_digest
from storage import Store
from tests.security_support import CLIENT_SUBJECT, Pki, pki, tls_handshake_fails

__all__ = ["pki"]

OPS_TOKEN, VIEWER_TOKEN = "ops-3f9a1c0d8e7b6a5f4e3d2c1b", "viewer-0a1b2c3d4e5f6a7b8c9d"
CAROL = f"User:{CLIENT_SUBJECT}"


def _tokens_file(folder: Path) -> Path:
    path = folder / "http-tokens"
    path.write_text(f"# ops may see everything\n{token_digest(OPS_TOKEN)} User:ops\n"
                    f"{token_digest(VIEWER_TOKEN)} User:viewer\n")
    return path


def _section(pki: Pki, tokens: Path | None = None, properties: dict[str, str] | None = None) -> HttpSection:
    return HttpSection(port=0, tokens_file=str(tokens or ""), broker_properties={
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.server), "super.users": "User:ops",
        **(properties or {})})


def _start(section: HttpSection, data: Path) -> StatusServer:
    server = StatusServer(section.host, section.port, data, lambda store: {"topics": store.list_topics()},
                          lambda: {"status": "ok"}, tls=section.tls_context(), access=section.access(data))
    server.start()
    return server


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    with Store.open(tmp_path / "data") as store:
        store.create_topic("orders")
        yield tmp_path / "data"


def _get(server: StatusServer, path: str, pki: Pki, *, token: str | None = None,
         certificate: tuple[Path, Path] | None = None) -> tuple[int, dict[str, Any], Any]:
    """(status, headers, JSON body) of an HTTPS GET that trusts the test CA."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if certificate is not None:
        context.load_cert_chain(str(certificate[0]), str(certificate[1]))
    request = urllib.request.Request(f"https://{server.address}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def _allow_describe_cluster(data: Path, principal: str) -> None:
    assert main(["--data", str(data), "acls", "add", "--allow-principal", principal, "--operation", "Describe",
                 "--cluster"]) == 0


def test_bearer_tokens_over_https_see_the_status_as_acls_and_super_users_allow(tmp_path: Path, data: Path,
                                                                               pki: Pki) -> None:
    server = _start(_section(pki, _tokens_file(tmp_path)), data)
    try:
        assert _get(server, "/health", pki)[::2] == (200, {"status": "ok"})
        code, headers, body = _get(server, "/status", pki)
        assert (code, headers["WWW-Authenticate"]) == (401, 'Bearer realm="ledgerview"')
        assert "Authorization: Bearer" in body["error"]
        assert _get(server, "/status", pki, token="not-a-token")[0] == 401
        assert _get(server, "/", pki, token="not-a-token")[0] == 401
        assert _get(server, "/status", pki, token=OPS_TOKEN)[::2] == (200, {"topics": ["orders"]})
        code, _, body = _get(server, "/status", pki, token=VIEWER_TOKEN)
        assert code == 403 and body["error"].startswith("User:viewer may not see the service's status")
        assert VIEWER_TOKEN not in json.dumps(body)
        _allow_describe_cluster(data, "User:viewer")
        assert _get(server, "/status", pki, token=VIEWER_TOKEN)[::2] == (200, {"topics": ["orders"]})
    finally:
        server.stop()


def test_mutual_tls_names_the_certificate_subject_and_refuses_clients_without_a_good_certificate(
        data: Path, pki: Pki) -> None:
    server = _start(_section(pki, None, {"ssl.truststore.location": str(pki.ca), "ssl.client.auth": "required"}), data)
    try:
        port = int(server.address.rsplit(":", 1)[1])
        for certificate, key in ((None, None), (pki.expired, pki.expired_key), (pki.stranger, pki.stranger_key)):
            assert tls_handshake_fails(port, pki, certificate, key), certificate
        carol = (pki.client, pki.client_key)
        code, _, body = _get(server, "/status", pki, certificate=carol)
        assert code == 403 and body["error"].startswith(f"{CAROL} may not")
        _allow_describe_cluster(data, CAROL)
        assert _get(server, "/status", pki, certificate=carol)[::2] == (200, {"topics": ["orders"]})
        assert _get(server, "/status", pki, certificate=carol, token="wrong")[0] == 401
    finally:
        server.stop()


def test_a_plain_http_client_on_the_https_port_is_dropped_and_the_server_goes_on(data: Path, pki: Pki) -> None:
    server = _start(_section(pki), data)
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as plain:
            plain.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"topics" not in plain.recv(4096)
        assert _get(server, "/status", pki)[::2] == (200, {"topics": ["orders"]})
    finally:
        server.stop()


def _config(http: dict[str, Any], tmp_path: Path) -> Any:
    return parse_service_config({"store": {"data": str(tmp_path / "data")}, "http": http}, "test.toml")


@pytest.mark.parametrize("http", [
    {"host": "0.0.0.0"},
    {"host": "0.0.0.0", "ssl": {"keystore": {"location": "server.pem"}}},
    {"host": "192.0.2.1", "tokens_file": "tokens"},
])
def test_a_non_loopback_address_without_tls_and_authentication_is_refused(http: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("")
    if "tokens_file" in http:
        http = {**http, "tokens_file": str(tmp_path / "tokens")}
    with pytest.raises(ServiceConfigError, match=r"\[http\]: Refusing to serve HTTP on .*insecure = true"):
        _config(http, tmp_path)
    assert _config({**http, "insecure": True}, tmp_path).http.insecure


def test_https_with_tokens_or_required_certificates_may_listen_everywhere(tmp_path: Path, pki: Pki) -> None:
    keystore = {"ssl.keystore.location": str(pki.server)}
    with_tokens = _config({"host": "0.0.0.0", "tokens_file": str(_tokens_file(tmp_path)), **keystore}, tmp_path)
    access = with_tokens.http.access(tmp_path)
    assert access.tokens is not None and access.tokens.principals()[token_digest(OPS_TOKEN)] == "User:ops"
    mutual = _config({"host": "0.0.0.0", "ssl": {"client": {"auth": "required"}, "truststore": {
        "location": str(pki.ca)}}, **keystore}, tmp_path)
    assert mutual.http.security().ssl_client_auth == "required"


@pytest.mark.parametrize(("http", "message"), [
    ({"sasl": {"enabled": {"mechanisms": "PLAIN"}}}, "sasl.enabled.mechanisms: unknown or not supported here; "
                                                     "keys read: ssl.keystore.location"),
    ({"ssl.client.auth": "required", "ssl.truststore.location": "ca.pem"}, "ssl.client.auth: required without "
                                                                           "TLS"),
    ({"ssl.client.auth": "sometimes"}, "'sometimes' is not one of required, requested, none"),
    ({"tokens_file": "/nonexistent/tokens"}, "Bearer token file /nonexistent/tokens: No such file"),
])
def test_http_security_keys_are_checked(http: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(ServiceConfigError, match=message.replace("(", r"\(")):
        _config(http, tmp_path)


def test_a_bad_token_line_is_named_by_number_and_never_quoted(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token_digest(OPS_TOKEN)} User:ops\nsecret-token-pasted-by-mistake\n")
    with pytest.raises(ServiceConfigError, match="line 2 is not a digest and a principal") as raised:
        _config({"tokens_file": str(tokens)}, tmp_path)
    assert "secret-token" not in str(raised.value)


@pytest.mark.slow
def test_the_service_serves_its_status_and_metrics_over_https_to_a_token(tmp_path: Path, pki: Pki) -> None:
    """A real ``ledgerview serve`` with TLS and bearer tokens in [http]: urllib over HTTPS reads /metrics and
    /status with the token, is refused without it, and no log line carries the token."""
    from tests.service_process import ServiceProcess, write_config

    config = write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")}, "http": {
            "port": 0, "tokens_file": str(_tokens_file(tmp_path)), "ssl.keystore.location": str(pki.server),
            "super.users": "User:ops"},
        "compaction": {"enabled": False}, "retention": {"enabled": False}, "cleaner": {"enabled": False},
    }, {"topics": [{"name": "prices", "partitions": 1}]})
    service = ServiceProcess(config)
    try:
        address = service.address
        context = ssl.create_default_context(cafile=str(pki.ca))

        def get(path: str, token: str | None) -> tuple[int, str]:
            request = urllib.request.Request(f"https://{address}{path}",
                                             headers={"Authorization": f"Bearer {token}"} if token else {})
            try:
                with urllib.request.urlopen(request, context=context, timeout=30) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as error:
                return error.code, error.read().decode()

        code, metrics = get("/metrics", OPS_TOKEN)
        assert code == 200 and "ledgerview_" in metrics
        code, status = get("/status", OPS_TOKEN)
        assert code == 200 and json.loads(status)["topics"][0]["topic"] == "prices"
        assert get("/metrics", None)[0] == 401 and get("/metrics", VIEWER_TOKEN)[0] == 403
        assert get("/health", None)[0] == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer
            urllib.request.urlopen(f"http://{address}/health", timeout=30)
    finally:
        assert service.terminate() == 0
    assert not any(OPS_TOKEN in line or VIEWER_TOKEN in line for line in service.raw_lines)
