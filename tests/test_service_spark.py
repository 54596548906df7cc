"""The service with [spark] enabled: a directory source and a topic source run as Structured Streaming queries into
the ledgerview sink; kill -9 then restart, SIGTERM then restart, and every line arrives exactly once (DESIGN.md
invariants 1 and 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from readers import read_table
from tests.service_process import ServiceProcess, write_config

pytestmark = pytest.mark.spark


def end_offsets(service: ServiceProcess) -> dict[str, int]:
    return {topic["topic"]: sum(p["end_offset"] for p in topic["partitions"]) for topic in service.status()["topics"]}


def test_spark_queries_ingest_exactly_once_across_kill_and_restart(tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "001.tsv").write_text("".join(f"k{i % 7}\tv{i}\n" for i in range(100)) + "k3\t-\n")
    path = write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")}, "service": {"flush_interval_s": 0.2}, "http": {"port": 0},
        "spark": {"enabled": True, "master": "local[1]"},
    }, {
        "topics": [{"name": "prices", "partitions": 2}, {"name": "mirror", "partitions": 1}],
        "sources": [
            {"name": "drops", "type": "directory", "topic": "prices", "path": str(incoming), "pattern": "*.tsv",
             "null_marker": "-", "interval_s": 0.2},
            {"name": "copy", "type": "topic", "topic": "mirror", "source_topic": "prices", "interval_s": 0.2},
        ],
    })
    first = ServiceProcess(path)
    first.wait_until(lambda: end_offsets(first) == {"prices": 101, "mirror": 101}, "the first file in both topics",
                     deadline_s=240)
    sources: list[dict[str, Any]] = first.status()["sources"]
    assert [(s["name"], s["type"], s["state"]) for s in sources] == [("drops", "directory", "running"),
                                                                    ("copy", "topic", "running")]
    first.kill()

    (incoming / "002.tsv").write_text("".join(f"k{i % 7}\tv{i}\n" for i in range(100, 150)))
    second = ServiceProcess(path)
    second.wait_until(lambda: end_offsets(second) == {"prices": 151, "mirror": 151}, "the second file",
                      deadline_s=240)
    assert second.terminate() == 0

    (incoming / "003.tsv").write_text("k1\tv150\n")
    third = ServiceProcess(path)
    third.wait_until(lambda: end_offsets(third) == {"prices": 152, "mirror": 152}, "the third file",
                     deadline_s=240)
    assert third.terminate() == 0

    expected = sorted([f"v{i}".encode() for i in range(151)] + [None], key=lambda v: v or b"")
    for topic in ("prices", "mirror"):
        values = read_table(tmp_path / "data", topic)["value"].to_pylist()
        assert sorted(values, key=lambda v: v or b"") == expected


def test_a_kafka_source_mirrors_a_kafka_topic_partition_for_partition(tmp_path: Path) -> None:
    """The service config lists a mirror: a topic of a Kafka cluster (here ledgerview's own endpoint over another
    data folder) lands in a service topic with the same partitions, offsets and values."""
    from ledgerview.kafka import KafkaEndpoint
    from storage import Store

    upstream = tmp_path / "upstream"
    with Store.open(upstream) as store:
        store.create_topic("orders", partitions=2)
        for partition in range(2):
            store.append("orders", [(b"k%d" % i, b"p%d-%d" % (partition, i)) for i in range(50)], partition)
    with KafkaEndpoint(upstream, port=0) as endpoint:
        path = write_config(tmp_path / "ledgerview.toml", {
            "store": {"data": str(tmp_path / "data")}, "service": {"flush_interval_s": 0.2}, "http": {"port": 0},
            "spark": {"enabled": True, "master": "local[1]"},
        }, {
            "topics": [{"name": "orders-copy", "partitions": 2}],
            "sources": [{"name": "orders", "type": "kafka", "topic": "orders-copy", "source_topic": "orders",
                         "bootstrap_servers": f"127.0.0.1:{endpoint.port}", "interval_s": 0.2}],
        })
        service = ServiceProcess(path)
        try:
            service.wait_until(lambda: end_offsets(service) == {"orders-copy": 100}, "the mirrored topic",
                               deadline_s=240)
            assert service.terminate() == 0
        finally:
            service.kill()
    with Store.open(tmp_path / "data") as mirror, Store.open(upstream) as original:
        for partition in range(2):
            columns = ["offset", "key", "value"]
            assert (mirror.read("orders-copy", partition).select(columns).to_pylist()
                    == original.read("orders", partition).select(columns).to_pylist())


REFUSED_LINES = {
    "no-value": ('{"key": "k"}', 'no "value" field (give "value": null for a tombstone)'),
    "unknown": ('{"value": "x", "colour": "red"}',
                "unknown fields ['colour']; allowed: key, value, timestamp, partition"),
    "negative-timestamp": ('{"value": "x", "timestamp": -1}', "'timestamp' is -1; expected an integer from 0 to"),
    "negative-partition": ('{"value": "x", "partition": -1}', "'partition' is -1; expected an integer from 0 to"),
    "number": ('{"value": 5}', "'value' is 5; expected a string or null"),
    "lacking": ('{"value": "x", "partition": 2}', "the topic 'refused' has no partition 2; its partitions are 0 to 1"),
}
"""A JSON line the direct directory source and ``produce`` refuse (input_lines.py), and why."""


LONG_LINE = "k\t" + "x" * (8 * 1024 * 1024)
"""Longer than the direct path's bound for a topic of max.message.bytes=200: max(8 MiB, 6 * 200) with its line end."""
TOPIC_REFUSALS = {
    "too-large": ("text", "k\t" + "x" * 300, "the message is 325 bytes, over the topic's max.message.bytes=200"),
    "keyless-text": ("text", "-\tv", "the message has no key, and the topic is compacted (cleanup.policy=compact)"),
    "keyless-json": ("json", '{"value": "v"}',
                     "the message has no key, and the topic is compacted (cleanup.policy=compact)"),
    "too-long": ("text", LONG_LINE, "the line is longer than 8388608 bytes, the longest read for a message of at "
                                    "most the topic's max.message.bytes=200"),
    "too-long-json": ("json", '{"value": "' + "x" * (8 * 1024 * 1024), "the line is longer than 8388608 bytes"),
}
"""A line whose message the topic refuses (ledgerview/refusals.py), or too long to read (refused for that before
it is parsed: the JSON line is not JSON either), in the direct path's words."""


def test_lines_on_spark_keep_their_partition_and_are_refused_as_without(tmp_path: Path) -> None:
    """docs/service.md: a directory source's JSON line keeps the partition it names, the others go where the
    partitioner sends them, whichever engine reads the folder; a line the direct path refuses (malformed, or a
    message the topic refuses: over max.message.bytes, keyless for a compact topic, or too long to read) fails the
    query before the sink, naming the file, why in the direct path's words and the line, before any line of its
    batch is appended. Before, such lines became tombstones, or failed in the sink without the file, and a line of
    any length was read and parsed. One service start for every case: each starts Spark."""
    from storage import Store

    incoming = tmp_path / "incoming"
    incoming.mkdir()
    lines = [f'{{"key": "k{i}", "value": "v{i}", "partition": 1}}' for i in range(20)]
    lines.append('{"key": "free", "value": "x"}')
    (incoming / "001.json").write_text("\n".join(lines) + "\n")
    refusing = []
    for name, (line, _) in REFUSED_LINES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.json").write_text(f'{{"key": "fine", "value": "y"}}\n{line}\n')
        refusing.append({"name": name, "type": "directory", "topic": "refused", "path": str(tmp_path / name),
                         "format": "json", "interval_s": 0.2})
    for name, (line_format, line, _) in TOPIC_REFUSALS.items():
        (tmp_path / name).mkdir()
        fine = '{"key": "fine", "value": "y"}' if line_format == "json" else "fine\ty"
        (tmp_path / name / f"{name}.{line_format}").write_text(f"{fine}\n{line}\n")
        refusing.append({"name": name, "type": "directory", "topic": "small", "path": str(tmp_path / name),
                         "format": line_format, "null_marker": "-", "interval_s": 0.2})
    path = write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")}, "service": {"flush_interval_s": 0.2}, "http": {"port": 0},
        "spark": {"enabled": True, "master": "local[1]"},
    }, {
        "topics": [{"name": "prices", "partitions": 2}, {"name": "refused", "partitions": 2},
                   {"name": "small", "partitions": 1,
                    "config": {"max.message.bytes": "200", "cleanup.policy": "compact"}}],
        "sources": [{"name": "drops", "type": "directory", "topic": "prices", "path": str(incoming),
                     "format": "json", "interval_s": 0.2}, *refusing],
    })
    service = ServiceProcess(path)

    def failed() -> dict[str, str]:
        return {s["name"]: s["last_error"] for s in service.status()["sources"] if s["state"] == "failed"}

    every = REFUSED_LINES.keys() | TOPIC_REFUSALS.keys()
    service.wait_until(lambda: end_offsets(service)["prices"] == 21 and failed().keys() == every,
                       "the file, and every refusing source failed", deadline_s=240)
    errors = failed()
    assert service.terminate() == 0
    for name, (line, reason) in REFUSED_LINES.items():
        assert f"{name}/{name}.json: {reason}" in errors[name], errors[name]
        assert repr(line) in errors[name], errors[name]
    for name, (line_format, line, reason) in TOPIC_REFUSALS.items():
        assert f"{name}/{name}.{line_format}: {reason}" in errors[name], errors[name]
        shown = line if len(line) <= 80 else line[:80] + "..."
        assert f": '{shown}'" in errors[name], errors[name]
    with Store.open(tmp_path / "data") as store:
        named = store.read("prices", 1)["value"].to_pylist()
        assert store.end_offset("refused", 0) + store.end_offset("refused", 1) == 0
        assert store.end_offset("small", 0) == 0
    assert sorted(value for value in named if value != b"x") == sorted(f"v{i}".encode() for i in range(20))
