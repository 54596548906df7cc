"""Rates over the last hour for the console's charts: samples of the service's running totals (messages ingested,
messages compacted) taken every few seconds by a loop of their own, never on an append's path.

A rate is the difference of two consecutive samples over the time between them, so a restart of a counter (a
source's restart) shows as no negative rate, just a gap at zero.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 3600.0
STEP_S = 10.0


@dataclass
class CompactionCounters:
    """What the service's compaction loop did since the service started (for metrics and the console)."""

    runs: int = 0
    skipped: int = 0
    messages_read: int = 0
    messages_kept: int = 0
    seconds: float = 0.0
    last_success_ms: int | None = None


class RateHistory:
    """Samples of named running totals over a sliding window; thread-safe (the sampler and the HTTP thread)."""

    def __init__(self, totals: Callable[[], dict[str, float]], *, window_s: float = WINDOW_S) -> None:
        self._totals = totals
        self._window_s = window_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque()
        self._lock = threading.Lock()

    def sample(self, now_s: float) -> None:
        totals = self._totals()
        with self._lock:
            self._samples.append((now_s, totals))
            while self._samples and self._samples[0][0] < now_s - self._window_s:
                self._samples.popleft()

    def rates(self) -> dict[str, list[tuple[float, float]]]:
        """Per total: (epoch seconds, per-second rate since the sample before), oldest first."""
        with self._lock:
            samples = list(self._samples)
        rates: dict[str, list[tuple[float, float]]] = {}
        for (before_s, before), (after_s, after) in itertools.pairwise(samples):
            for name, total in after.items():
                elapsed = after_s - before_s
                change = max(0.0, total - before.get(name, total))
                rates.setdefault(name, []).append((after_s, change / elapsed if elapsed > 0 else 0.0))
        return rates
