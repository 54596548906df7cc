"""The endpoint as a real process killed with SIGKILL while a producer is writing: every message the producer got
an acknowledgement for is there after a restart, once, in order (DESIGN.md invariant 1: an acknowledged append is
in the page cache, which a killed process does not lose), and committed group offsets survive too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from storage import Store
from tests.kafka_support import wait_for


@contextmanager
def _endpoint(data: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--port", "0"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on "), line
        yield process, line.removeprefix("listening on ").strip()
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.fault
def test_acknowledged_messages_and_commits_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("events", partitions=1)
    acknowledged: list[int] = []
    with _endpoint(data) as (process, bootstrap):
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "message.timeout.ms": 5000,
                             "enable.idempotence": True})

        def delivered(error: object, message: object) -> None:
            if error is None:
                acknowledged.append(int(message.value()))  # type: ignore[attr-defined]

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "audit", "enable.auto.commit": False})
        consumer.assign([TopicPartition("events", 0, 0)])
        for number in range(1000):
            producer.produce("events", value=b"%d" % number, on_delivery=delivered)
        producer.flush(30)
        consumer.commit(offsets=[TopicPartition("events", 0, 500)], asynchronous=False)
        consumer.close()
        number = 1000
        while process.poll() is None:  # keep producing; kill -9 the endpoint once 2000 are acknowledged
            producer.produce("events", value=b"%d" % number, on_delivery=delivered)
            producer.poll(0)
            number += 1
            if len(acknowledged) >= 2000:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=60)
            elif number % 1000 == 0:
                wait_for(lambda needed=number - 500: producer.poll(0.05) is not None and len(acknowledged) >= needed,
                         "acknowledgements to keep up")
        producer.flush(10)  # what was in flight fails or times out: it was never acknowledged
    with Store.open(data) as store:
        stored = [int(value) for value in store.read("events", 0)["value"].to_pylist()]
    assert stored == sorted(stored) and len(stored) == len(set(stored))
    assert set(acknowledged) <= set(stored)
    with _endpoint(data) as (_, bootstrap):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "audit"})
        [committed] = consumer.committed([TopicPartition("events", 0)], timeout=30)
        consumer.close()
    assert committed.offset == 500
