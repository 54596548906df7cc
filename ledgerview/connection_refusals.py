"""Connections refused by a connection bound (Kafka's max.connections, max.connections.per.ip), logged at most one
line per interval however many arrive: one line per refusal would let a client opening thousands of connections a
second fill the log (and the disk under it). The HTTP status server and the Kafka endpoint both count theirs here.

The first refusal is logged at once. The ones after it are counted, by client address, and the next line sums them
up (how many since the line before, from how many addresses, the address refused most); it is due
REFUSAL_LOG_INTERVAL_S after the line before, written by the next refusal or by ``write_due``, which the server
calls often (the HTTP server between connections, the Kafka endpoint on a timer). A count still unwritten
when the server stops is written then (``close``), so every refusal is in exactly one line's count. How a
line is written is the server's: RefusalLog hands each line's RefusalSummary to the ``write`` it was given.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

REFUSAL_LOG_INTERVAL_S = 60.0
"""At most one refusal line per this interval: a client opening thousands of connections a second past a bound
would otherwise write a line for each and fill the log, while a line a minute still says that connections are
refused, how many and from whom."""
ADDRESSES_TALLIED = 1000
"""Distinct addresses counted one by one between two lines; refusals from further addresses are counted in the
total only, so a client with many source addresses cannot grow the tally without bound."""


@dataclass(frozen=True)
class RefusalSummary:
    """What one line reports: the refusals since the line before."""

    refused: int
    """Connections refused since the line before, from every address."""
    addresses: int
    """Distinct addresses they came from, of those tallied (ADDRESSES_TALLIED at most)."""
    top_client: str
    """The address refused most."""
    top_client_refused: int
    """How many of ``refused`` came from ``top_client``."""
    refused_from_addresses_not_tallied: int
    """How many of ``refused`` came from addresses past the ADDRESSES_TALLIED first (0 mostly)."""
    interval_s: float
    """The least time between two lines, but the last one ``close`` writes."""


class RefusalLog:
    """Counts refused connections and hands them to ``write`` as a RefusalSummary, at most one per ``interval_s``
    of ``clock`` (monotonic seconds). Safe to call from any thread; ``write`` is called holding its lock."""

    def __init__(self, write: Callable[[RefusalSummary], None], *, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.write, self.clock, self.interval_s = write, clock, interval_s
        self._lock = threading.Lock()
        self._by_address: Counter[str] = Counter()
        """Refusals since the last line, by client address (ADDRESSES_TALLIED of them at most)."""
        self._untallied = 0
        """Refusals since the last line from addresses past ADDRESSES_TALLIED."""
        self._last_line_at: float | None = None

    def refused(self, address: str) -> None:
        """Count one connection from ``address`` refused; writes the line if one is due (the first refusal's is)."""
        with self._lock:
            if address in self._by_address or len(self._by_address) < ADDRESSES_TALLIED:
                self._by_address[address] += 1
            else:
                self._untallied += 1
            self._write_if_due()

    def write_due(self) -> None:
        """Write the refusals counted since the last line if its interval has passed (call it often)."""
        with self._lock:
            self._write_if_due()

    def close(self) -> None:
        """Write the refusals counted since the last line, whether or not its interval has passed."""
        with self._lock:
            if self._by_address:
                self._write(self.clock())

    def _write_if_due(self) -> None:
        now = self.clock()
        if self._by_address and (self._last_line_at is None or now - self._last_line_at >= self.interval_s):
            self._write(now)

    def _write(self, now: float) -> None:
        [(top_client, top_client_refused)] = self._by_address.most_common(1)
        self.write(RefusalSummary(refused=self._by_address.total() + self._untallied,
                                  addresses=len(self._by_address), top_client=top_client,
                                  top_client_refused=top_client_refused,
                                  refused_from_addresses_not_tallied=self._untallied, interval_s=self.interval_s))
        self._by_address.clear()
        self._untallied = 0
        self._last_line_at = now
