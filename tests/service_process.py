"""The service as a real subprocess (``python -m ledgerview serve``): its config written to a temporary folder,
its JSON log lines collected on a thread, its HTTP endpoints read, stopped with SIGTERM or killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEADLINE_S = 90.0


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def write_config(path: Path, sections: dict[str, dict[str, Any]], arrays: dict[str, list[dict[str, Any]]]) -> Path:
    """A TOML file from plain dicts: ``sections`` become [name] tables, ``arrays`` [[name]] tables."""
    lines = []
    for name, keys in sections.items():
        lines += [f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in keys.items()), ""]
    for name, items in arrays.items():
        for item in items:
            lines += [f"[[{name}]]", *(f"{key} = {toml_value(value)}" for key, value in item.items()), ""]
    path.write_text("\n".join(lines))
    return path


class ServiceProcess:
    def __init__(self, config: Path, *, environment: dict[str, str] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw_lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, "-m", "ledgerview", "serve", "--config", str(config)],
                                        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        env={**os.environ, **(environment or {})})
        self._reader = threading.Thread(target=self._read_logs, daemon=True)
        self._reader.start()

    def _read_logs(self) -> None:
        assert self.process.stderr is not None
        with self.process.stderr:
            for raw in self.process.stderr:
                line = raw.decode().rstrip("\n")
                self.raw_lines.append(line)
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue

    def wait_for_event(self, event: str, deadline_s: float = DEADLINE_S) -> dict[str, Any]:
        found = self.wait_until(lambda: next((e for e in self.events if e.get("event") == event), None),
                                f"log event {event}", deadline_s)
        return dict(found)

    def wait_until(self, check: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
        """Poll ``check`` until it returns something truthy; fail with the logs if the deadline passes first."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            result = check()
            if result:
                return result
            if self.process.poll() is not None and not result:
                raise AssertionError(f"service exited {self.process.returncode} waiting for {what}: "
                                     + "\n".join(self.raw_lines[-20:]))
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {deadline_s} s; logs:\n" + "\n".join(self.raw_lines[-20:]))

    @property
    def address(self) -> str:
        return str(self.wait_for_event("service.started")["http"])

    def get(self, path: str) -> tuple[int, str, str]:
        """(status code, content type, body) of GET ``path``."""
        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.get("/status")[2])
        return result

    def terminate(self) -> int:
        """SIGTERM, then wait for a clean exit."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=DEADLINE_S)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=DEADLINE_S)
        self._reader.join(timeout=10)

    def wait_for_exit(self) -> int:
        code = self.process.wait(timeout=DEADLINE_S)
        self._reader.join(timeout=10)
        return code
