"""A task run every ``interval_s`` seconds on a thread of its own, over a store of its own (Store objects are not
shared across threads): the base of the retention and maintenance loops. ``run_once`` is one pass, for callers
with their own schedule (the service)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from storage.errors import UnknownTopicError

if TYPE_CHECKING:
    from storage.store import Store

T = TypeVar("T")


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


class PeriodicLoop:
    name = "ledgerview-periodic"

    def __init__(self, store: Store, *, interval_s: float) -> None:
        self.store = type(store).open(store.root, lock_wait=True, verify_reads=store.verify_reads,
                                      clock=store.clock, cleaner_config=store.cleaner.config)
        self.interval_s = interval_s
        self.failures: dict[str, str] = {}
        """The error of each topic whose last pass failed (tried again on the next pass)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now_ms: int | None = None) -> object:
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the pass in progress, and close the loop's store."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.store.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_once()
