"""Background work, the library's and the service's, in one place:

- ``BackgroundThread``: work on a daemon thread of its own until ``stop``, which waits for it to return;
- ``PeriodicTask``: ``run_once`` every ``interval_s`` seconds, counted in ``stats``. A pass that raises is logged
  (``report_failure``) and counted, and the next pass runs as usual; each topic a pass failed on is logged too;
- ``PeriodicCall``: a plain callable as the pass;
- ``PeriodicLoop``: a pass over a Store of its own (Store objects are not shared across threads), the base of the
  retention, cleaner and maintenance loops and of the compaction scheduler. ``run_once`` is one pass, for tests
  and callers with their own schedule.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from storage.errors import UnknownTopicError

if TYPE_CHECKING:
    from storage.store import Store

T = TypeVar("T")
R = TypeVar("R")
logger = logging.getLogger(__name__)


def for_each_topic(store: Store, action: Callable[[str], list[T]]) -> tuple[list[T], dict[str, str]]:
    """``action`` on every topic, concatenated, and the error of each topic where it failed: one failing topic
    must not stop the others (a topic deleted meanwhile is skipped)."""
    results: list[T] = []
    failures = {}
    for topic in store.list_topics():
        try:
            results += action(topic)
        except UnknownTopicError:
            continue
        except Exception as error:
            failures[topic] = f"{type(error).__name__}: {error}"
    return results, failures


class BackgroundThread:
    """``start`` runs ``run`` on a daemon thread named ``thread_name`` (a second ``start`` does nothing);
    ``stop`` sets ``stopping`` and waits for ``run`` to return (it checks ``stopping`` between units of work and
    finishes the one in progress)."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def run(self) -> None:
        raise NotImplementedError


@dataclass
class LoopStats:
    """What a periodic task's passes did; the counts are of the passes its thread ran."""

    runs: int = 0
    """Passes run, failed ones included."""
    errors: int = 0
    """Passes that raised."""
    last_run_ms: int | None = None
    """When the last pass ended, milliseconds since the epoch."""
    last_duration_s: float | None = None
    last_error: str | None = None
    """Why the last pass that raised did."""
    topic_errors: dict[str, str] = field(default_factory=dict)
    """The topics the last pass failed on, with why (the others were done; tried again on the next pass)."""


class PeriodicTask(BackgroundThread, Generic[R]):
    """``run_once`` every ``interval_s`` seconds on a thread named ``ledgerview-<name>``, first after one interval;
    ``stop`` finishes the pass in progress."""

    def __init__(self, name: str, *, interval_s: float) -> None:
        super().__init__(f"ledgerview-{name}")
        self.name = name
        self.interval_s = interval_s
        self.stats = LoopStats()

    @property
    def failures(self) -> dict[str, str]:
        """The error of each topic the last pass failed on: ``stats.topic_errors``."""
        return self.stats.topic_errors

    def run_once(self) -> R:
        """One pass; a pass over topics records those it failed on in ``stats.topic_errors``."""
        raise NotImplementedError

    def report_failure(self, error: str, *, topic: str | None = None) -> None:
        """Log a pass that raised (``topic`` None) or a topic the last pass failed on."""
        logger.error("%s failed%s: %s", self.name, "" if topic is None else f" on topic {topic}", error)

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self._run_counted()

    def _run_counted(self) -> None:
        started = time.monotonic()
        try:
            self.run_once()
            for topic, error in self.failures.items():
                self.report_failure(error, topic=topic)
        except Exception as error:  # counted and reported; the next pass runs as usual
            self.stats.errors += 1
            self.stats.last_error = f"{type(error).__name__}: {error}"
            self.report_failure(self.stats.last_error)
        self.stats.runs += 1
        self.stats.last_run_ms = time.time_ns() // 1_000_000
        self.stats.last_duration_s = time.monotonic() - started


class PeriodicCall(PeriodicTask[object]):
    """``call()`` every ``interval_s`` seconds."""

    def __init__(self, name: str, call: Callable[[], object], *, interval_s: float) -> None:
        super().__init__(name, interval_s=interval_s)
        self._call = call

    def run_once(self) -> object:
        return self._call()


class PeriodicLoop(PeriodicTask[R]):
    """A periodic task over a store of its own, opened like ``store``; ``stop`` closes it."""

    def __init__(self, name: str, store: Store, *, interval_s: float) -> None:
        super().__init__(name, interval_s=interval_s)
        self.store = type(store).open(store.root, lock_wait=True, verify_reads=store.verify_reads,
                                      clock=store.clock, cleaner_config=store.cleaner.config)

    def stop(self) -> None:
        """Stop after the pass in progress, and close the loop's store."""
        super().stop()
        self.store.close()
