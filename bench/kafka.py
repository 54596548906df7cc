"""The Kafka endpoint's workloads: produce and consume throughput through ``python -m ledgerview.kafka`` with
kafka-python, confluent-kafka and kcat (librdkafka's command-line client: native code, spending far less CPU per
message than the Python clients), one partition, the dataset's messages (keys and 100-byte values by default).

Each job starts the endpoint as a process of its own on a loopback port (untimed, as is building the client's
input), then times the client: producing every message and waiting for every acknowledgement (acks=all), or
consuming every message from offset 0. The endpoint and the client run in separate processes, as they would in
use; on this machine they share its two cores. Before the timed part, every job warms the endpoint up untimed
(WARM_UP_MESSAGES produced to and consumed from a topic of their own, with confluent-kafka), as a running broker
is: first calls import what they need (pyarrow's pandas import alone takes a few hundred milliseconds).

kcat reads its messages as lines ``key<TAB>value``; the dataset's random value bytes are mapped to printable ones
(``byte % 94 + 33``: same length, no tab or newline), so its messages have the dataset's sizes.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.compaction import Outcome, ledgerview_store
from bench.systems import TOPIC
from ledgerview.changelog import ChangelogSpec
from storage import Store

MESSAGES_FILE = "messages.arrow"
KCAT_LINES_FILE = "messages.kcat"
WARM_UP_TOPIC = "warm-up"
WARM_UP_MESSAGES = 20_000
KCAT_PRODUCER = {"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
                 "queue.buffering.max.kbytes": 4_000_000}
"""The same producer settings as CONFLUENT_PRODUCER (both are librdkafka)."""
KCAT_SMALL_BATCH_PRODUCER = {**KCAT_PRODUCER, "linger.ms": 5, "batch.size": 16_384}
"""The Java producer's defaults (batch.size 16 KiB, linger.ms 5 since Kafka 4.0; kafka-python's batch_size is 16
KiB too): about a hundred of the datasets' messages a batch."""
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


def kcat_produce_input(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """An empty 1-partition topic, and the messages as kcat's input lines beside the store."""
    produce_input(table, spec, target)
    (target / KCAT_LINES_FILE).write_bytes(kcat_lines(table))


def kcat_lines(table: pa.Table) -> bytes:
    """``key<TAB>value<LF>`` per message, each value byte mapped into 33..126 (kcat splits on tab and newline).
    Keyless messages and tombstones have no line form that kcat keeps apart from empty bytes: refused."""
    keys, values = (table[name].combine_chunks() for name in ("key", "value"))
    if keys.null_count or values.null_count:
        raise ValueError("kcat's line input has no null keys or values: use a dataset without tombstones")
    key_offsets, value_offsets = (np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset)
                                  for array in (keys, values))
    key_bytes, value_bytes = (np.frombuffer(array.buffers()[2], np.uint8) for array in (keys, values))
    key_lengths, value_lengths = np.diff(key_offsets), np.diff(value_offsets)
    line_ends = np.cumsum(key_lengths + value_lengths + 2)
    out = np.empty(int(line_ends[-1]) if len(line_ends) else 0, np.uint8)
    line_starts = line_ends - key_lengths - value_lengths - 2
    _scatter(out, line_starts, key_bytes, key_offsets)
    tabs = line_starts + key_lengths
    out[tabs] = ord("\t")
    printable = value_bytes[value_offsets[0] : value_offsets[-1]] % 94 + 33
    _scatter(out, tabs + 1, printable, value_offsets - value_offsets[0])
    out[line_ends - 1] = ord("\n")
    return out.tobytes()


def _scatter(out: np.ndarray, starts: np.ndarray, data: np.ndarray, offsets: np.ndarray) -> None:
    """Copy region i of ``data`` (offsets[i]..offsets[i + 1]) to ``out`` at starts[i], in one indexed copy."""
    lengths = np.diff(offsets)
    within = np.arange(int(lengths.sum())) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out[np.repeat(starts, lengths) + within] = data[int(offsets[0]) : int(offsets[-1])]


@contextmanager
def endpoint(data: Path, *arguments: str, environment: Mapping[str, str] | None = None
             ) -> Iterator[tuple[str, int]]:
    """The endpoint in its own process on a free loopback port (``arguments`` added to its command line, e.g.
    ``--config FILE``; ``environment`` added to its environment); yields the bootstrap address of its first
    listener and its pid."""
    process = subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--port", "0", *arguments],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, **(environment or {})})
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


def _timed(target: Path, run: Callable[[str], int], environment: Mapping[str, str] | None = None) -> Outcome:
    """Time ``run`` on a warmed-up endpoint; the notes give the CPU seconds the endpoint (user and system, and its
    minor page faults) and the client (this process and the client processes it ran) spent, which say what each
    side would sustain on a core of its own when the machine is shared."""
    with Store.open(target) as store:
        if WARM_UP_TOPIC not in store.list_topics():
            store.create_topic(WARM_UP_TOPIC, partitions=1)
    with endpoint(target, environment=environment) as (bootstrap, pid):
        _warm_up(bootstrap)
        before, client_cpu, start = _process_counters(pid), _client_cpu_seconds(), time.perf_counter()
        messages = run(bootstrap)
        seconds = time.perf_counter() - start
        after, client_cpu = _process_counters(pid), _client_cpu_seconds() - client_cpu
        user, system, faults = (end - begin for begin, end in zip(before, after, strict=True))
        endpoint_cpu = user + system
        notes = (f"CPU: endpoint {endpoint_cpu:.2f} s ({endpoint_cpu / messages * 1e6:.2f} us/message; user "
                 f"{user:.2f} s, system {system:.2f} s, {faults / 1000:.0f}k minor page faults), client "
                 f"{client_cpu:.2f} s")
        return Outcome(messages, seconds=seconds, notes=notes)


def _process_counters(pid: int) -> tuple[float, float, float]:
    """User and system CPU seconds and minor page faults of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks, float(fields[7])


def _client_cpu_seconds() -> float:
    """CPU seconds of this process and of its children waited for (kcat; the endpoint is waited for later)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _warm_up(bootstrap: str) -> None:
    """WARM_UP_MESSAGES produced to and consumed from WARM_UP_TOPIC, untimed."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, **CONFLUENT_PRODUCER})
    messages = [{"key": b"warm-up", "value": bytes(100)}] * WARM_UP_MESSAGES
    producer.produce_batch(WARM_UP_TOPIC, messages, partition=0)
    if producer.flush(60) != 0:
        raise RuntimeError("the warm-up messages were not delivered")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "warm-up", "enable.auto.commit": False})
    consumer.assign([TopicPartition(WARM_UP_TOPIC, 0, 0)])
    seen = 0
    while seen < WARM_UP_MESSAGES:
        seen += sum(1 for message in consumer.consume(CHUNK_MESSAGES, timeout=10) if message.error() is None)
    consumer.close()


KEEP_FREED_MEMORY = {"MALLOC_TOP_PAD_": str(64 * 1024 * 1024)}
"""glibc keeps 64 MiB of freed memory at the top of each heap instead of returning it to the kernel, so buffers
are not faulted in afresh for every request: the allocator's share of the endpoint's cost (its system time)."""


def kcat_produce(target: Path, output: Path, environment: Mapping[str, str] | None = None,
                 producer: Mapping[str, int] = KCAT_PRODUCER) -> Outcome:
    """kcat -P of every line of the input file to partition 0 (acks=all), until it has every acknowledgement;
    ``environment``: added to the endpoint's; ``producer``: librdkafka's settings."""
    lines = target / KCAT_LINES_FILE
    expected = lines.read_bytes().count(b"\n")

    def run(bootstrap: str) -> int:
        settings = [argument for name, value in producer.items() for argument in ("-X", f"{name}={value}")]
        subprocess.run([_kcat(), "-P", "-b", bootstrap, "-t", TOPIC, "-p", "0", "-K", "\t", "-q", *settings,
                        "-l", str(lines)], check=True)
        return expected

    before = _stored_messages(target)
    outcome = _timed(target, run, environment)
    if _stored_messages(target) - before != expected:
        raise RuntimeError(f"kcat produced {_stored_messages(target) - before} messages, not {expected}")
    return outcome


def kcat_consume(target: Path, output: Path, environment: Mapping[str, str] | None = None) -> Outcome:
    """kcat -C of partition 0 from offset 0 until every message is read, writing each offset to a file (which
    shows every message arrived, in order) instead of its value; ``environment``: added to the endpoint's."""
    expected = _stored_messages(target)
    offsets_file = output.with_suffix(".offsets")

    def run(bootstrap: str) -> int:
        with offsets_file.open("wb") as sink:
            subprocess.run([_kcat(), "-C", "-b", bootstrap, "-t", TOPIC, "-p", "0", "-o", "beginning", "-e", "-q",
                            "-c", str(expected), "-f", "%o\n"], stdout=sink, check=True)
        return expected

    outcome = _timed(target, run, environment)
    offsets = np.loadtxt(offsets_file, dtype=np.int64, ndmin=1)
    offsets_file.unlink()
    if not np.array_equal(offsets, np.arange(expected)):
        raise RuntimeError(f"kcat read {len(offsets)} messages, not offsets 0 to {expected - 1} in order")
    return outcome


kcat_produce_keeping_freed_memory = functools.partial(kcat_produce, environment=KEEP_FREED_MEMORY)
kcat_produce_small_batches = functools.partial(kcat_produce, producer=KCAT_SMALL_BATCH_PRODUCER)
kcat_consume_keeping_freed_memory = functools.partial(kcat_consume, environment=KEEP_FREED_MEMORY)


def _kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        raise RuntimeError("kcat is not installed (Debian's kcat package; make test installs it)")
    return path


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
