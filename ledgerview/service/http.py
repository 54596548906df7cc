"""Health, status and metrics over HTTP (stdlib http.server, 127.0.0.1 by default).

    GET /         the console: a page that shows /status and refreshes itself (ledgerview/service/console.html)
    GET /health   {"status": "ok"|"degraded", ...}: 200 while the service runs (degraded: a source failed); built
                  from the service's own counters, never from the store, so it answers in milliseconds
    GET /status   every partition's status, the sources, the loops, groups and rates (ledgerview/service/status.py)
    GET /metrics  the same figures in Prometheus text format, with process metrics and build info

HEAD of each answers GET's status and headers without the body; other methods are 501.

With an ssl.SSLContext the server speaks HTTPS. A client has REQUEST_TIMEOUT_S from its connection for its TLS
handshake and its whole request (a client sending a byte at a time is dropped then, as one sending nothing), and
as long again for each write of the response. Each connection has a thread of its own, so a client that holds
one open delays no other; Kafka's ``max.connections`` and ``max.connections.per.ip`` bound them (a connection past
either is closed as it arrives; refusals are logged at most once a minute, however many arrive, by
ledgerview/connection_refusals.py). The status itself is built from one Store, one request at a time. With an
HttpAccess that is enforced, every route but /health needs an identity allowed to see the status
(ledgerview/service/http_access.py): 401 without one, 403 for one not allowed.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ledgerview.connection_refusals import RefusalLog, RefusalSummary
from ledgerview.service.http_access import HttpAccess, Verdict
from ledgerview.service.logs import log_event
from ledgerview.service.status import prometheus_text
from storage import Store

StatusBuilder = Callable[[Store], dict[str, Any]]
HealthBuilder = Callable[[], dict[str, Any]]
CONSOLE = (Path(__file__).parent / "console.html").read_bytes()
ROUTES = ("/", "/health", "/status", "/metrics")
OPEN_ROUTES = ("/health",)
"""Served to anyone who reaches the server (liveness probes), whatever the access rule."""
REQUEST_TIMEOUT_S = 10.0
"""How long a client may take over its TLS handshake and its whole request before it is dropped."""
MAX_CONNECTIONS = 64
"""Open connections at once (a thread each), by default."""
logger = logging.getLogger("ledgerview.http")


class StatusServer:
    """Serves each connection on a thread of its own, and the routes that read the store one at a time, with a
    Store of its own."""

    def __init__(self, host: str, port: int, data: Path, build_status: StatusBuilder,
                 build_health: HealthBuilder, *, tls: ssl.SSLContext | None = None,
                 access: HttpAccess | None = None, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, max_connections_per_ip: int = MAX_CONNECTIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` (monotonic seconds) says when the next line about refused connections is due."""
        self.data = data
        self.build_status = build_status
        self.build_health = build_health
        self.access = access
        self.request_timeout_s = request_timeout_s
        """From the connection, for the TLS handshake and the whole request; then again for each write of the
        response."""
        self._server = _Server((host, port), _handler(self), tls, request_timeout_s,
                               max_connections, max_connections_per_ip, clock)
        self._thread: threading.Thread | None = None
        self.store: Store | None = None
        self._store_lock = threading.Lock()
        """Held while a request reads the store, and while it opens and closes."""

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="ledgerview-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join()
        self._server.server_close()

    def _serve(self) -> None:
        with self._store_lock:
            self.store = Store.open(self.data)
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            with self._store_lock:
                self.store.close()
                self.store = None

    def respond(self, path: str, principal: str | None = None, client: str = "") -> tuple[int, str, bytes]:
        """(status code, content type, body) for a GET of ``path`` by ``principal`` from address ``client``."""
        if path not in ROUTES:
            return 404, "application/json", json.dumps({"error": f"no {path}; try {', '.join(ROUTES)}"}).encode()
        verdict = Verdict.ALLOWED if self.access is None or path in OPEN_ROUTES else self.access.verdict(
            principal, client)
        if verdict is not Verdict.ALLOWED:
            return verdict.value, "application/json", json.dumps({"error": _refusal(verdict, principal)}).encode()
        if path == "/":
            return 200, "text/html; charset=utf-8", CONSOLE
        if path == "/health":
            return 200, "application/json", json.dumps(self.build_health()).encode()
        with self._store_lock:
            if self.store is None:
                return 503, "application/json", json.dumps({"error": "the server is stopping"}).encode()
            status = self.build_status(self.store)
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(status).encode()
        return 200, "application/json", json.dumps(status).encode()


def _refusal(verdict: Verdict, principal: str | None) -> str:
    if verdict is Verdict.UNAUTHENTICATED:
        return ("no identity: send Authorization: Bearer <token> with a token of [http] tokens_file, or a client "
                "certificate the server trusts")
    return (f"{principal} may not see the service's status: it needs to be in [http] super.users, or an ACL "
            "allowing Describe on the cluster (ledgerview acls add --allow-principal ... --operation Describe "
            "--cluster)")


def _log_refusals(summary: RefusalSummary) -> None:
    """One ``http.connection_refused`` line for the connections refused since the line before."""
    fields: dict[str, object] = {"refused": summary.refused, "addresses": summary.addresses,
                                 "top_client": summary.top_client, "top_client_refused": summary.top_client_refused}
    if summary.refused_from_addresses_not_tallied:
        fields["refused_from_addresses_not_tallied"] = summary.refused_from_addresses_not_tallied
    log_event(logger, logging.INFO, "http.connection_refused", **fields,
              reason="max_connections or max_connections_per_ip reached", logged_at_most_every_s=summary.interval_s)


class _Server(ThreadingHTTPServer):
    """An HTTP server with a thread per connection, at most ``max_connections`` of them and
    ``max_connections_per_ip`` from one address, whose connections time out, and are TLS when given a context."""

    block_on_close = False
    """stop() does not wait for clients still connected (daemon threads): their deadlines end them."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 tls: ssl.SSLContext | None, timeout_s: float, max_connections: int,
                 max_connections_per_ip: int, clock: Callable[[], float]) -> None:
        self.tls = tls
        self.timeout_s = timeout_s
        self.max_connections, self.max_connections_per_ip = max_connections, max_connections_per_ip
        self._open: dict[Any, str] = {}
        """Each connection served now, with its client's address."""
        self._per_address: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._refusals = RefusalLog(_log_refusals, clock=clock)
        super().__init__(address, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Take the connection only below both bounds (refused, it is closed at once, as Kafka closes one, and
        counted for the refusal log)."""
        address = str(client_address[0])
        with self._count_lock:
            if len(self._open) >= self.max_connections or self._per_address[address] >= self.max_connections_per_ip:
                self._refusals.refused(address)
                return False
            self._open[request] = address
            self._per_address[address] += 1
            return True

    def service_actions(self) -> None:
        """Between connections (serve_forever calls it at least every poll interval): the refusal line that is due,
        so the last refusals of a burst are logged when its interval passes even if no connection follows."""
        super().service_actions()
        self._refusals.write_due()

    def server_close(self) -> None:
        """Stop listening, log the refusals not logged yet, and end the connections still open (their threads then
        close them)."""
        super().server_close()
        self._refusals.close()
        with self._count_lock:
            open_now = list(self._open)
        for request in open_now:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                continue  # closed meanwhile

    def shutdown_request(self, request: Any) -> None:
        with self._count_lock:
            address = self._open.pop(request, None)
            if address is not None:
                self._per_address[address] -= 1
                if not self._per_address[address]:
                    del self._per_address[address]
        super().shutdown_request(request)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        connection.settimeout(self.timeout_s)  # bounds the TLS handshake as a whole, and each write
        if self.tls is None:
            return connection, address
        return self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that fails its TLS handshake, times out or leaves is logged and dropped (http.server would
        print a traceback)."""
        log_event(logger, logging.INFO, "http.connection_failed", client=str(client_address[0]))


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, every read bounded by what remains of one deadline for the whole request: each read's
    own timeout would let a client that sends a byte at a time (slowloris) hold the server for ever."""

    def __init__(self, connection: socket.socket, deadline: float) -> None:
        self.connection = connection
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request took longer than its deadline")
        self.connection.settimeout(remaining)
        return self.connection.recv_into(buffer)


def _route(target: str) -> str:
    """The path of a request target, without its query; an absolute one (``http://host/status``, which a server
    must take, RFC 9112 3.2.2) by its path."""
    if target.startswith(("http://", "https://")):
        return urlsplit(target).path or "/"
    return target.split("?", 1)[0]


def _handler(server: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def setup(self) -> None:
            deadline = time.monotonic() + server.request_timeout_s
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()
            super().setup()
            self.rfile.close()  # the one StreamRequestHandler made: reads go through the deadline instead
            self.rfile = io.BufferedReader(_DeadlineReader(self.request, deadline))

        def do_GET(self) -> None:  # the names http.server calls
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            """GET's status and headers without its body (RFC 9110 9.3.2)."""
            self._answer(with_body=False)

        def _answer(self, *, with_body: bool) -> None:
            self.request.settimeout(server.request_timeout_s)  # the response's own budget (each write is bounded)
            authorization = self.headers.get("Authorization")
            try:
                certificate = self.request.getpeercert() if isinstance(self.request, ssl.SSLSocket) else None
                principal = None if server.access is None else server.access.principal(authorization, certificate)
                code, content_type, body = server.respond(_route(self.path), principal, self.client_address[0])
            except Exception as error:  # a broken status must not take the server down
                log_event(logger, logging.ERROR, "http.failed", path=self.path, error=f"{type(error).__name__}: "
                          f"{error}")
                code, content_type, body = 500, "application/json", json.dumps({"error": str(error)}).encode()
            if server.access is not None:
                # Credentials that name no one are answered after connection.failed.authentication.delay.ms, as
                # the Kafka endpoint answers a failed login, so a client cannot try tokens at full speed (one try
                # per connection: the server closes each after its answer). The sleep holds this connection's
                # thread only, and no lock: each connection has a thread of its own, at most max_connections of
                # them, and a client could hold one as long by sending its request slowly.
                time.sleep(server.access.failed_authentication_delay_s(authorization, code))
            self.send_response(code)
            if code == Verdict.UNAUTHENTICATED:
                self.send_header("WWW-Authenticate", 'Bearer realm="ledgerview"')
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log_event(logger, logging.DEBUG, "http.request", request=format % args)

    return Handler
