"""The one periodic-loop framework (storage/periodic.py) on real threads: a pass that raises is counted and logged
and the next pass runs as usual; ``stop`` finishes the pass in progress and runs no other; ``stats`` count the
passes and keep the topics the last one failed on. Intervals are a millisecond and the tests wait on events, never
on sleeps."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from typing import Any

import pytest

from storage import Store
from storage.periodic import PeriodicCall
from storage.retention import DeletedSegment, RetentionLoop

WAIT_S = 30.0
INTERVAL_S = 0.001


def test_a_failing_pass_is_counted_and_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    third = threading.Event()

    def flaky() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("disk on fire")
        if len(calls) == 3:
            third.set()

    loop = PeriodicCall("flaky", flaky, interval_s=INTERVAL_S)
    with caplog.at_level(logging.ERROR, logger="storage.periodic"):
        loop.start()
        try:
            assert third.wait(WAIT_S)
        finally:
            loop.stop()
    assert loop.stats.runs == len(calls) >= 3
    assert (loop.stats.errors, loop.stats.last_error) == (1, "RuntimeError: disk on fire")
    assert caplog.messages == ["flaky failed: RuntimeError: disk on fire"]


def test_stop_finishes_the_pass_in_progress_and_runs_no_other() -> None:
    entered, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow() -> None:
        entered.set()
        assert release.wait(WAIT_S)
        finished.append(True)

    loop = PeriodicCall("slow", slow, interval_s=INTERVAL_S)
    loop.start()
    assert entered.wait(WAIT_S)
    finished_when_stop_returned: list[list[bool]] = []
    stopper = threading.Thread(target=lambda: (loop.stop(), finished_when_stop_returned.append(list(finished))))
    stopper.start()
    assert loop.stopping.wait(WAIT_S)  # stop was called while the pass waits
    release.set()
    stopper.join(WAIT_S)
    assert finished_when_stop_returned == [[True]]
    assert (loop.stats.runs, loop.stats.errors) == (1, 0)


def test_stats_count_the_passes_and_keep_the_topics_the_last_one_failed_on(
        store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    store.create_topic("a")
    store.create_topic("b")
    loop = RetentionLoop(store, interval_s=INTERVAL_S)
    enforce_retention = loop.store.enforce_retention
    passes_on_b: list[int] = []
    stats_in_second_pass: list[dict[str, Any]] = []
    second_pass = threading.Event()

    def failing_once_on_b(topic: str, now_ms: int | None = None) -> list[DeletedSegment]:
        if topic == "b":
            passes_on_b.append(len(passes_on_b))
            if len(passes_on_b) == 1:
                raise OSError("disk full")
            if len(passes_on_b) == 2:
                stats_in_second_pass.append(asdict(loop.stats))
                second_pass.set()
        return enforce_retention(topic, now_ms)

    monkeypatch.setattr(loop.store, "enforce_retention", failing_once_on_b)
    with caplog.at_level(logging.ERROR, logger="storage.periodic"):
        loop.start()
        try:
            assert second_pass.wait(WAIT_S)
        finally:
            loop.stop()
    [first] = stats_in_second_pass
    assert (first["runs"], first["errors"], first["topic_errors"]) == (1, 0, {"b": "OSError: disk full"})
    assert first["last_run_ms"] is not None and first["last_duration_s"] >= 0
    assert loop.stats.runs == len(passes_on_b) >= 2
    assert (loop.stats.errors, loop.failures) == (0, {})
    assert loop.stats.last_run_ms >= first["last_run_ms"]
    assert caplog.messages == ["retention failed on topic b: OSError: disk full"]
