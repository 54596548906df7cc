"""Periodic work on threads of its own: compaction checks, retention passes, cleaning. Each loop calls one
library function every ``interval_s`` seconds, logs what it did and keeps counts and the topics it failed on for
the status endpoint; a failing pass is logged and counted, and the next one runs as usual."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ledgerview.service.logs import log_event
from ledgerview.service.threads import BackgroundThread

logger = logging.getLogger("ledgerview.loops")


@dataclass
class LoopStats:
    runs: int = 0
    errors: int = 0
    last_run_ms: int | None = None
    last_duration_s: float | None = None
    last_error: str | None = None
    topic_errors: dict[str, str] = field(default_factory=dict)
    """The topics the last pass failed on, with why (the others were done)."""


class PeriodicTask(BackgroundThread):
    """``run_once`` every ``interval_s`` (it returns the topics it failed on, with why); ``close`` is called on the
    loop's thread when it stops (to close the Store the task opened there or for it)."""

    def __init__(self, name: str, interval_s: float, run_once: Callable[[], dict[str, str]],
                 close: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.thread_name = f"ledgerview-{name}"
        self.name = name
        self.interval_s = interval_s
        self._run_once = run_once
        self._close = close
        self.stats = LoopStats()

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval_s):
                started = time.monotonic()
                try:
                    self.stats.topic_errors = self._run_once()
                except Exception as error:  # logged and counted; the next pass tries again
                    self.stats.errors += 1
                    self.stats.last_error = f"{type(error).__name__}: {error}"
                    log_event(logger, logging.ERROR, f"{self.name}.failed", error=self.stats.last_error)
                self.stats.runs += 1
                self.stats.last_run_ms = time.time_ns() // 1_000_000
                self.stats.last_duration_s = time.monotonic() - started
        finally:
            self._close()
