"""kill -9 of the endpoint, as a real process, while confluent-kafka's idempotent producer (acks=all) writes
numbered messages: after each restart on the same data folder and port the producer retries what was in flight,
and no acknowledged message is lost or stored twice. Trials kill at three moments, in turn: from outside at a
random point of the stream, right after a batch's producer-state journal line (before its segment write), and
right after a batch's segment write (before the answer), the last two through storage/faults.py crash points."""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from storage import Store
from storage.faults import CRASH_AT_ENV

TRIALS = 21
"""Seven at each moment: each a restart of the endpoint, so the count is what the suite's time allows."""
TIME_LIMIT_SECONDS = 240
TRIAL_LIMIT_SECONDS = 30
MOMENTS = (None, "producer_state.after_journal", "segment.after_write")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(data: Path, port: int, crash_at: str | None) -> subprocess.Popen[str]:
    env = {name: value for name, value in os.environ.items() if name != CRASH_AT_ENV}
    if crash_at:
        env[CRASH_AT_ENV] = crash_at
    process = subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--port", str(port)],
                               stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    process.stdout.close()
    assert line.startswith("listening on "), line
    return process


@pytest.mark.fault
@pytest.mark.slow
def test_an_idempotent_producer_neither_loses_nor_duplicates_across_kill_9(tmp_path: Path) -> None:
    data, port, chance = tmp_path / "data", _free_port(), random.Random(18)
    with Store.open(data) as store:
        store.create_topic("events", partitions=1)
    acknowledged: list[int] = []
    failed: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is None:
            acknowledged.append(int(message.value()))  # type: ignore[attr-defined]
        else:
            failed.append(str(error))

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True, "acks": "all",
                         "linger.ms": 1, "message.timeout.ms": 60000, "retry.backoff.ms": 20,
                         "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 100})
    deadline = time.monotonic() + TIME_LIMIT_SECONDS
    number = trials = 0
    for moment in itertools.islice(itertools.cycle(MOMENTS), TRIALS):
        if time.monotonic() > deadline:
            break
        process = _start(data, port, moment and f"{moment}:{chance.randint(2, 12)}")
        target, trial_end = len(acknowledged) + chance.randint(10, 150), time.monotonic() + TRIAL_LIMIT_SECONDS
        while process.poll() is None:
            assert time.monotonic() < trial_end, f"trial {trials} ({moment or 'kill -9'}) did not end"
            if number - len(acknowledged) < 500:
                producer.produce("events", value=b"%d" % number, on_delivery=delivered)
                number += 1
            producer.poll(0 if number % 50 else 0.005)
            if moment is None and len(acknowledged) >= target:
                os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        trials += 1
    process = _start(data, port, None)
    try:
        assert producer.flush(60) == 0, "the producer could not deliver what it held after the last restart"
    finally:
        process.terminate()
        process.wait(timeout=60)
    with Store.open(data) as store:
        stored = [int(value) for value in store.read("events", 0)["value"].to_pylist()]
    duplicates = sum(count - 1 for count in Counter(stored).values())
    lost = len(set(acknowledged) - set(stored))
    print(f"{trials} kill -9 trials, {number} messages sent, {len(acknowledged)} acknowledged, {len(stored)} stored,"
          f" {duplicates} duplicates, {lost} acknowledged messages lost, {len(failed)} delivery failures,"
          f" stored in order: {stored == sorted(stored)}")
    assert trials == TRIALS
    assert duplicates == 0 and lost == 0
