"""Health, status and metrics over HTTP (stdlib http.server on a thread of its own, 127.0.0.1 by default).

    GET /         the console: a page that shows /status and refreshes itself (ledgerview/service/console.html)
    GET /health   {"status": "ok"|"degraded", ...}: 200 while the service runs (degraded: a source failed); built
                  from the service's own counters, never from the store, so it answers in milliseconds
    GET /status   every partition's status, the sources, the loops, groups and rates (ledgerview/service/status.py)
    GET /metrics  the same figures in Prometheus text format, with process metrics and build info
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from ledgerview.service.logs import log_event
from ledgerview.service.status import prometheus_text
from storage import Store

StatusBuilder = Callable[[Store], dict[str, Any]]
HealthBuilder = Callable[[], dict[str, Any]]
CONSOLE = (Path(__file__).parent / "console.html").read_bytes()
ROUTES = ("/", "/health", "/status", "/metrics")
logger = logging.getLogger("ledgerview.http")


class StatusServer:
    """Serves requests one at a time on one thread, with a Store of its own opened on that thread."""

    def __init__(self, host: str, port: int, data: Path, build_status: StatusBuilder,
                 build_health: HealthBuilder) -> None:
        self.data = data
        self.build_status = build_status
        self.build_health = build_health
        self._server = HTTPServer((host, port), _handler(self))
        self._thread: threading.Thread | None = None
        self.store: Store | None = None

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
        self.store = Store.open(self.data)
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self.store.close()

    def respond(self, path: str) -> tuple[int, str, bytes]:
        """(status code, content type, body) for a GET of ``path``."""
        if path not in ROUTES:
            return 404, "application/json", json.dumps({"error": f"no {path}; try {', '.join(ROUTES)}"}).encode()
        if path == "/":
            return 200, "text/html; charset=utf-8", CONSOLE
        if path == "/health":
            return 200, "application/json", json.dumps(self.build_health()).encode()
        assert self.store is not None
        status = self.build_status(self.store)
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(status).encode()
        return 200, "application/json", json.dumps(status).encode()


def _handler(server: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            try:
                code, content_type, body = server.respond(self.path.split("?", 1)[0])
            except Exception as error:  # a broken status must not take the server down
                log_event(logger, logging.ERROR, "http.failed", path=self.path, error=f"{type(error).__name__}: "
                          f"{error}")
                code, content_type, body = 500, "application/json", json.dumps({"error": str(error)}).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log_event(logger, logging.DEBUG, "http.request", request=format % args)

    return Handler
