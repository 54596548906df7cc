"""The Kafka endpoint's workloads: produce and consume throughput through ``python -m ledgerview.kafka`` with
kafka-python and confluent-kafka, one partition, the dataset's messages (keys and 100-byte values by default).

Each job starts the endpoint as a process of its own on a loopback port (untimed, as is building the client's
input), then times the client: producing every message and waiting for every acknowledgement (acks=all), or
consuming every message from offset 0. The endpoint and the client run in separate processes, as they would in
use; on this machine they share its two cores.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from bench.compaction import Outcome, ledgerview_store
from bench.measurement import cpu_seconds
from bench.systems import TOPIC
from ledgerview.changelog import ChangelogSpec
from storage import Store

MESSAGES_FILE = "messages.arrow"
Pair = tuple[bytes | None, bytes | None]
CHUNK_MESSAGES = 10_000
"""Messages per produce_batch call (confluent-kafka) and per check of the consumed count."""
CONFLUENT_PRODUCER = {"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
                      "queue.buffering.max.kbytes": 4_000_000}
KAFKA_PYTHON_PRODUCER = {"linger_ms": 20, "batch_size": 1_000_000, "max_request_size": 4_000_000}


def produce_input(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """An empty 1-partition topic, and the messages to produce beside the store."""
    with Store.open(target) as store:
        store.create_topic(TOPIC, partitions=1)
    with pa.OSFile(str(target / MESSAGES_FILE), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


consume_input = ledgerview_store()
"""The dataset appended to a 1-partition topic, as in the append workload."""


@contextmanager
def endpoint(data: Path, *arguments: str) -> Iterator[tuple[str, int]]:
    """The endpoint in its own process on a free loopback port (``arguments`` added to its command line, e.g.
    ``--config FILE``); yields the bootstrap address of its first listener and its pid."""
    process = subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--port", "0", *arguments],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the endpoint did not start: {line!r}")
        yield line.removeprefix("listening on ").split()[0], process.pid
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()


def _messages(target: Path) -> list[Pair]:
    table = pa.ipc.open_file(pa.memory_map(str(target / MESSAGES_FILE))).read_all()
    return list(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def _timed(target: Path, run: Callable[[str], int]) -> Outcome:
    """Time ``run``; the notes give the CPU seconds the endpoint and the client spent, which say what each side
    would sustain on a core of its own when the machine is shared."""
    with endpoint(target) as (bootstrap, pid):
        endpoint_cpu, client_cpu, start = cpu_seconds(pid), time.process_time(), time.perf_counter()
        messages = run(bootstrap)
        seconds = time.perf_counter() - start
        endpoint_cpu, client_cpu = cpu_seconds(pid) - endpoint_cpu, time.process_time() - client_cpu
        notes = (f"CPU: endpoint {endpoint_cpu:.2f} s ({endpoint_cpu / messages * 1e6:.1f} us/message), "
                 f"client {client_cpu:.2f} s")
        return Outcome(messages, seconds=seconds, notes=notes)


def confluent_chunks(messages: list[Pair]) -> list[list[dict[str, bytes | None]]]:
    """The messages as confluent-kafka's produce_batch takes them, CHUNK_MESSAGES a call."""
    return [[{"key": key, "value": value} for key, value in batch] for batch in _chunks(messages, CHUNK_MESSAGES)]


def confluent_produce_all(bootstrap: str, chunks: list[list[dict[str, bytes | None]]],
                          client: dict[str, str] | None = None) -> int:
    """Produce every chunk to partition 0 and wait for every acknowledgement; ``client`` adds to the producer's
    config (e.g. security settings). Returns the number of messages."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **CONFLUENT_PRODUCER, **(client or {})})
    for chunk in chunks:
        producer.produce_batch(TOPIC, chunk, partition=0)
        producer.poll(0)
    if producer.flush(600) != 0:
        raise RuntimeError("confluent-kafka did not deliver every message")
    return sum(len(chunk) for chunk in chunks)


def confluent_consume_all(bootstrap: str, expected: int, client: dict[str, str] | None = None) -> int:
    """Consume ``expected`` messages of partition 0 from offset 0; ``client`` adds to the consumer's config."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         **(client or {})})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    seen = 0
    while seen < expected:
        batch = consumer.consume(min(CHUNK_MESSAGES, expected - seen), timeout=10)  # never waits for more
        seen += sum(1 for message in batch if message.error() is None)
    consumer.close()
    return seen


def confluent_produce(target: Path, output: Path) -> Outcome:
    chunks = confluent_chunks(_messages(target))
    return _timed(target, lambda bootstrap: confluent_produce_all(bootstrap, chunks))


def kafka_python_produce(target: Path, output: Path) -> Outcome:
    from kafka import KafkaProducer

    messages = _messages(target)

    def run(bootstrap: str) -> int:
        producer = KafkaProducer(bootstrap_servers=bootstrap, **KAFKA_PYTHON_PRODUCER)
        for key, value in messages:
            producer.send(TOPIC, key=key, value=value, partition=0)
        producer.flush()
        producer.close()
        return len(messages)

    return _timed(target, run)


def confluent_consume(target: Path, output: Path) -> Outcome:
    expected = _stored_messages(target)
    return _timed(target, lambda bootstrap: confluent_consume_all(bootstrap, expected))


def kafka_python_consume(target: Path, output: Path) -> Outcome:
    from kafka import KafkaConsumer, TopicPartition

    expected = _stored_messages(target)

    def run(bootstrap: str) -> int:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        partition = TopicPartition(TOPIC, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        seen = 0
        while seen < expected:
            seen += sum(len(records) for records in consumer.poll(timeout_ms=10_000,
                                                                  max_records=CHUNK_MESSAGES).values())
        consumer.close()
        return seen

    return _timed(target, run)


def _stored_messages(target: Path) -> int:
    with Store.open(target) as store:
        return store.end_offset(TOPIC, 0)


def _chunks(items: list[Pair], size: int) -> Iterator[list[Pair]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
